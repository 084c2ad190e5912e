"""The bytes a demo run needs, checked against the machine's memory before anything
is allocated: a run that cannot fit is refused with one line naming the option and
the limit, instead of growing until the machine swaps or kills it.

The estimates count the large arrays a run holds at its peak, from the model's
shape alone: the oracle's attention (every position against every position at
once: it grows as the square of the sequence), the oracle's K/V and logits, the
pool's rows and the token lists. They are upper bounds of what numpy allocates
(tests/python/test_demo.py measures a run against its estimate), not of the
interpreter's own overhead.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from typing import Any

from kvcore_demo.model import ModelConfig

#: Bytes of one Python int in a list (its pointer and the int object).
TOKEN_BYTES = 8 + 32


def weights_bytes(cfg: ModelConfig) -> int:
    """Bytes of the model's float32 weights: the embedding and every layer's
    projections, MLP and norms."""
    q, kv = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    layer = cfg.d_model * (2 * q + 2 * kv) + 3 * cfg.d_model * cfg.d_ff + 4 * cfg.d_model + 2 * cfg.head_dim
    return 4 * (cfg.vocab_size * cfg.d_model + cfg.d_model + cfg.n_layers * layer)


def attention_bytes(cfg: ModelConfig, queries: int, keys: int) -> int:
    """Peak bytes of one ``attention`` call of (queries x keys): the scores, their
    masked copy, the weights (float32, one matrix per head) and the bool masks."""
    return queries * keys * (3 * 4 * cfg.n_heads + 4)


def kv_bytes(cfg: ModelConfig, rows: int, layers: int, itemsize: int = 4) -> int:
    """Bytes of K and V of `rows` positions in `layers` layers of `itemsize` bytes."""
    return 2 * rows * layers * cfg.n_kv_heads * cfg.head_dim * itemsize


def logits_bytes(cfg: ModelConfig, rows: int) -> int:
    """Bytes of `rows` float32 logit rows."""
    return rows * cfg.vocab_size * 4


def activation_bytes(cfg: ModelConfig, tokens: int) -> int:
    """Bytes of one layer's activations for `tokens` tokens at once (hidden states,
    q/k/v and the MLP's three d_ff-wide matrices, float32)."""
    return tokens * 4 * (4 * cfg.d_model + 3 * cfg.d_ff + 3 * cfg.n_heads * cfg.head_dim)


def available_memory() -> int | None:
    """Bytes the machine can give a process now: MemAvailable from /proc/meminfo
    (free memory plus what the kernel can reclaim), else the available physical
    pages of os.sysconf; None when neither is known."""
    try:
        with open("/proc/meminfo") as info:
            for line in info:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def format_bytes(n: int) -> str:
    """Binary units with one decimal: 12.0 MiB, 10.6 GiB, 145.5 PiB."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if value < 1024 or unit == "PiB":
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def check_fits(option: str, value: int, need: Callable[[int], int], what: str, least: int = 1) -> None:
    """Raises ValueError when a run whose `option` is `value` needs more bytes than
    the machine has available (`need(v)`: the bytes with the option at v, never
    decreasing in v; `what` says why it grows; `least`: the option's smallest
    value). The one-line message names the value, the bytes, the memory available
    and the largest value that fits. Nothing is checked when the available memory
    is unknown."""
    limit = available_memory()
    if limit is None or need(value) <= limit:
        return
    head = (f"{option} = {value}: the run needs about {format_bytes(need(value))} ({what}), more than the "
            f"{format_bytes(limit)} of memory available")
    if need(least) > limit:
        raise ValueError(f"{head}; even {option} = {least} would not fit")
    lo, hi = least, value  # need(lo) fits, need(hi) does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if need(mid) <= limit:
            lo = mid
        else:
            hi = mid
    raise ValueError(f"{head}; at most {option} = {lo} fits")


def check_options_fit(opts: Any, fields: Sequence[tuple[str, int]], what: str) -> None:
    """check_fits for the run `opts` describes (an options dataclass with
    ``bytes_needed()``), naming of `fields` ((field name, least value) pairs) the
    one whose least value saves the most bytes: the option to lower."""
    def need_of(field: str) -> Callable[[int], int]:
        return lambda v: int(dataclasses.replace(opts, **{field: v}).bytes_needed())

    limit = available_memory()
    if limit is None or opts.bytes_needed() <= limit:
        return
    field, least = min(fields, key=lambda f: need_of(f[0])(f[1]))
    check_fits(f"--{field.replace('_', '-')}", getattr(opts, field), need_of(field), what, least)
