"""KV-cache memory of real model shapes, sized by kvcore itself.

Rows per layer always come from ``SequenceCache.rows(layer)`` of a cache built
for the model, never from a second formula, so this planner and the runtime
cannot disagree. Bytes of one layer = rows x n_kv_heads x (head_dim + V width)
x dtype bytes x batch. The ``kvcore memory`` command (kvcore.memory_command)
prints it per layer kind, beside the same model with every layer flat.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from importlib import resources
from typing import Any, Optional

from kvcore._core import LayerPolicy, SequenceCache
from kvcore._errors import InvalidArgumentError, NotFoundError
from kvcore.hf_config import MAX_CONTEXT, ModelShape, SharedLayer, StateShape, default_context, model_shape_from_hf
from kvcore.quantized import kv_format
from kvcore.quantized import row_bytes as quantized_row_bytes

#: Bytes of one K or V element, by dtype name.
DTYPE_BYTES: Mapping[str, int] = {
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "int8": 1,
    "uint8": 1,
}
_DTYPE_ALIASES = {"fp32": "float32", "fp16": "float16", "half": "float16", "bf16": "bfloat16",
                  "fp8": "float8_e4m3fn", "float8": "float8_e4m3fn"}


def dtype_bytes(dtype: str) -> tuple[str, int]:
    """(canonical name, bytes per element) of a dtype name or alias such as "bf16"."""
    name = _DTYPE_ALIASES.get(dtype.lower(), dtype.lower())
    if name not in DTYPE_BYTES:
        choices = ", ".join([*DTYPE_BYTES, *_DTYPE_ALIASES])
        raise InvalidArgumentError(f"dtype = {dtype!r}: must be one of {choices}")
    return name, DTYPE_BYTES[name]


_SIZE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
               "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_size(text: str) -> int:
    """Bytes from "8GiB", "512 MiB", "1.5GB" or "1073741824" (KB/MB/GB are powers of 1000)."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?)\s*([a-zA-Z]*)\s*", text)
    unit = m.group(2).lower() if m else ""
    if m is None or unit not in _SIZE_UNITS:
        raise InvalidArgumentError(
            f"size {text!r}: must be a number with an optional unit B, KB, MB, GB, TB "
            "(powers of 1000) or KiB, MiB, GiB, TiB (powers of 1024), e.g. 8GiB"
        )
    value = math.floor(float(m.group(1)) * _SIZE_UNITS[unit])
    if value < 1:
        raise InvalidArgumentError(f"size {text!r}: must be at least 1 byte")
    return value


def parse_context(text: str) -> int:
    """Tokens from "131072" or "128k" (k = 1024 tokens, the way context lengths are quoted)."""
    m = re.fullmatch(r"\s*([0-9]+)\s*([kK]?)\s*", text)
    if m is None:
        raise InvalidArgumentError(f"context {text!r}: must be a whole number of tokens, e.g. 8192 or 128k")
    tokens = int(m.group(1)) * (1024 if m.group(2) else 1)
    if tokens > MAX_CONTEXT:
        raise InvalidArgumentError(
            f"context {text!r}: {tokens} tokens, must be <= {MAX_CONTEXT} (kvcore positions are 32-bit signed ints)"
        )
    return tokens


def format_bytes(n: int) -> str:
    """Binary units with one decimal: 12.0 MiB, 10.6 GiB."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


# --- presets -------------------------------------------------------------------------


@dataclass(frozen=True)
class Preset:
    """A model shape shipped with kvcore, with where its numbers come from."""

    name: str
    hf_id: str
    source: str
    pattern: str
    shape: ModelShape


_PRESETS: dict[str, Preset] = {}


def presets() -> dict[str, Preset]:
    """Every preset in presets.json, by name (each goes through the --hf-config loader)."""
    if not _PRESETS:
        text = resources.files("kvcore").joinpath("presets.json").read_text(encoding="utf-8")
        for entry in json.loads(text)["presets"]:
            shape = model_shape_from_hf(entry["config"], name=entry["name"])
            _PRESETS[entry["name"]] = Preset(entry["name"], entry["hf_id"], entry["source"], entry["pattern"], shape)
    return dict(_PRESETS)


def preset(name: str) -> Preset:
    """The preset called ``name`` (case-insensitive). NotFoundError lists the names."""
    table = presets()
    for key, value in table.items():
        if key.lower() == name.lower():
            return value
    raise NotFoundError(f"model {name!r}: no such preset; presets: {', '.join(table)}")


# --- the planner -----------------------------------------------------------------------


@dataclass(frozen=True)
class LayerKind:
    """Layers that share a policy and a row shape, and what one of them costs."""

    # "sliding", "full", "chunked", "shared" or "state" (kvcore Ring, Flat, Chunked, Shared, State), or
    # "empty": layers without attention or state (Nemotron-H's MLP / MoE layers) that cache nothing
    kind: str
    window: Optional[int]
    sinks: int
    layers: tuple[int, ...]  # layer indices
    rows: int  # rows per layer: SequenceCache.rows(layer) (state layers: D state slots; empty layers: 0)
    n_kv_heads: int
    head_dim: int
    v_head_dim: int  # the V width actually used (head_dim unless the model says otherwise)
    bytes_per_layer: int
    chunk: Optional[int] = None  # chunked layers: the chunk size
    sources: tuple[int, ...] = ()  # shared layers: the layer each one reads, in `layers` order
    state_conv_bytes: int = 0  # state layers: one snapshot's conv window, per sequence
    state_recurrent_bytes: int = 0  # state layers: one snapshot's recurrent matrix, per sequence

    @property
    def total_bytes(self) -> int:
        return self.bytes_per_layer * len(self.layers)


@dataclass(frozen=True)
class MemoryPlan:
    """KV bytes of one model at one context: kvcore's layout and the all-flat baseline."""

    model: str
    context: int
    max_step: int
    sinks: int
    dtype: str
    dtype_bytes: int
    batch: int
    kinds: tuple[LayerKind, ...]
    flat_kinds: tuple[LayerKind, ...]
    state_slots: Optional[int] = None  # D of the state layers (None: the model has none)
    state_dtype: str = "bfloat16"  # element type of the state's conv window
    #: "int8" or "fp8" when rows are stored quantized (bytes then count values, scales and zero
    #: points: kvcore.quantized.row_bytes); None when stored as ``dtype``.
    kv_dtype: Optional[str] = None

    @property
    def state_bytes_per_slot(self) -> int:
        """Bytes of one state snapshot of every state layer, for the whole batch (0 without state)."""
        return sum((k.state_conv_bytes + k.state_recurrent_bytes) * len(k.layers) * self.batch
                   for k in self.kinds if k.kind == "state")

    @property
    def total_bytes(self) -> int:
        return sum(k.total_bytes for k in self.kinds)

    @property
    def flat_total_bytes(self) -> int:
        return sum(k.total_bytes for k in self.flat_kinds)

    @property
    def ratio(self) -> float:
        """kvcore bytes / all-flat bytes (1.0 for a model without sliding layers)."""
        return self.total_bytes / self.flat_total_bytes

    def to_dict(self) -> dict[str, Any]:
        def kind(k: LayerKind) -> dict[str, Any]:
            d = asdict(k)
            d["layers"] = len(k.layers)
            d["layer_indices"] = list(k.layers)
            d["total_bytes"] = k.total_bytes
            return d

        return {
            "model": self.model,
            "context": self.context,
            "max_step": self.max_step,
            "sinks": self.sinks,
            "dtype": self.dtype,
            "dtype_bytes": self.dtype_bytes,
            "kv_dtype": self.kv_dtype,
            "batch": self.batch,
            "kinds": [kind(k) for k in self.kinds],
            "total_bytes": self.total_bytes,
            "all_flat": {"kinds": [kind(k) for k in self.flat_kinds], "total_bytes": self.flat_total_bytes},
            "ratio": self.ratio,
            **_state_dict(self),
        }


def plan_memory(
    shape: ModelShape,
    *,
    context: Optional[int] = None,
    max_step: Optional[int] = None,
    sinks: int = 0,
    dtype: str = "bfloat16",
    batch: int = 1,
    state_slots: Optional[int] = None,
    state_dtype: str = "bfloat16",
    kv_dtype: Optional[str] = None,
) -> MemoryPlan:
    """The KV bytes of ``shape`` at ``context`` tokens (default: its max_position_embeddings).

    State layers keep ``state_slots`` snapshots (default: hf_config.default_state_slots), their
    conv window in ``state_dtype``. ``kv_dtype`` ("int8" or "fp8") counts quantized rows with
    their scales and zero points instead of ``dtype`` elements. InvalidArgumentError names a bad
    argument (dtype, kv_dtype, batch, state_slots).
    """
    context = default_context(shape, context)
    name, size = dtype_bytes(dtype)
    _check_batch(batch)
    if kv_dtype is not None:
        kv_format(kv_dtype)
    cache = SequenceCache(shape.cache_config(context, max_step=max_step, sinks=sinks, state_slots=state_slots))
    flat = SequenceCache(shape.cache_config(context, max_step=max_step, sinks=sinks, all_flat=True,
                                            state_slots=state_slots))
    state_name, state_size = dtype_bytes(state_dtype)
    return MemoryPlan(
        model=shape.name, context=context, max_step=cache.max_step, sinks=sinks, dtype=name,
        dtype_bytes=size, batch=batch,
        kinds=_layer_kinds(cache, shape, size, state_size, batch, kv_dtype),
        flat_kinds=_layer_kinds(flat, shape, size, state_size, batch, kv_dtype),
        state_slots=_state_slots_of(cache), state_dtype=state_name, kv_dtype=kv_dtype,
    )


def kv_bytes(
    shape: ModelShape,
    context: int,
    *,
    max_step: Optional[int] = None,
    sinks: int = 0,
    dtype: str = "bfloat16",
    batch: int = 1,
    all_flat: bool = False,
    state_slots: Optional[int] = None,
    state_dtype: str = "bfloat16",
    kv_dtype: Optional[str] = None,
) -> int:
    """Total KV bytes of ``shape`` at ``context`` tokens (kvcore's layout, or all flat), state
    layers' ``state_slots`` snapshots included (conv window in ``state_dtype``); ``kv_dtype``
    ("int8" or "fp8"): quantized rows, scales and zero points included."""
    _, size = dtype_bytes(dtype)
    _check_batch(batch)
    if kv_dtype is not None:
        kv_format(kv_dtype)
    cache = SequenceCache(shape.cache_config(context, max_step=max_step, sinks=sinks, all_flat=all_flat,
                                             state_slots=state_slots))
    return sum(k.total_bytes for k in _layer_kinds(cache, shape, size, dtype_bytes(state_dtype)[1], batch, kv_dtype))


def longest_context(
    shape: ModelShape,
    budget: int,
    *,
    max_step: Optional[int] = None,
    sinks: int = 0,
    dtype: str = "bfloat16",
    batch: int = 1,
    all_flat: bool = False,
    state_slots: Optional[int] = None,
    state_dtype: str = "bfloat16",
    kv_dtype: Optional[str] = None,
) -> int:
    """The longest context whose KV cache (state layers' snapshots included) fits in ``budget``
    bytes (``kv_dtype``: as kv_bytes).

    Binary search over real caches (bytes never shrink as the context grows).
    MAX_CONTEXT when even that fits: every layer's window is full long before.
    InvalidArgumentError when not even the shortest context fits.
    """
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise InvalidArgumentError(f"budget = {budget!r}: must be a whole number of bytes >= 1")

    def need(context: int) -> int:
        return kv_bytes(shape, context, max_step=max_step, sinks=sinks, dtype=dtype, batch=batch,
                        all_flat=all_flat, state_slots=state_slots, state_dtype=state_dtype,
                        kv_dtype=kv_dtype)

    def fits(context: int) -> bool:
        return need(context) <= budget

    lo = 1 if max_step is None else max_step  # a cache holds at least one step
    if not fits(lo):
        least = need(lo)
        raise InvalidArgumentError(
            f"budget = {budget} bytes ({format_bytes(budget)}): too small, even a context of {lo} "
            f"needs {least} bytes ({format_bytes(least)})"
        )
    hi = MAX_CONTEXT
    if fits(hi):
        return hi
    while hi - lo > 1:  # fits(lo) and not fits(hi)
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo


def memory_curve(
    shape: ModelShape,
    contexts: Iterable[int],
    *,
    max_step: Optional[int] = None,
    sinks: int = 0,
    dtype: str = "bfloat16",
    batch: int = 1,
    state_slots: Optional[int] = None,
    state_dtype: str = "bfloat16",
    kv_dtype: Optional[str] = None,
) -> list[tuple[int, int, int]]:
    """(context, kvcore bytes, all-flat bytes) at each context (``kv_dtype``: as kv_bytes)."""
    opts: dict[str, Any] = {"max_step": max_step, "sinks": sinks, "dtype": dtype, "batch": batch,
                            "state_slots": state_slots, "state_dtype": state_dtype, "kv_dtype": kv_dtype}
    return [(c, kv_bytes(shape, c, **opts), kv_bytes(shape, c, all_flat=True, **opts)) for c in contexts]


def _check_batch(batch: int) -> None:
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise InvalidArgumentError(f"batch = {batch!r}: must be an integer >= 1")


def _row_pair_bytes(heads: int, head_dim: int, value_dim: int, dtype_size: int, kv_dtype: Optional[str]) -> int:
    """Bytes of one K row and one V row: elements of dtype_size, or quantized rows with their scales."""
    if kv_dtype is None:
        return heads * (head_dim + value_dim) * dtype_size
    return quantized_row_bytes(kv_dtype, heads, head_dim) + quantized_row_bytes(kv_dtype, heads, value_dim)


# --- the layer kinds of a plan (flat, sliding, chunked, shared, state: design.md 2 and 9) ---


def _layer_kinds(
    cache: SequenceCache, shape: ModelShape, dtype_size: int, state_size: int, batch: int,
    kv_dtype: Optional[str] = None,
) -> tuple[LayerKind, ...]:
    """The LayerKinds of ``cache`` (built from ``shape``): K/V layers grouped by policy and row
    shape (sliding by window and sinks, chunked by chunk, full), every shared layer of one shape
    in one kind of 0 bytes, state layers by state shape at D x snapshot bytes (conv window of
    ``state_size``-byte elements), every empty layer (no attention, no state) in one kind of 0 rows
    and 0 bytes; K/V rows of ``dtype_size`` bytes or quantized (``kv_dtype``)."""
    groups: dict[tuple[Any, ...], list[int]] = {}
    for i, layer in enumerate(cache.config.layers):
        p = layer.policy
        kind = shape.layer_kind(i)
        if kind == "state":
            key: tuple[Any, ...] = (kind, shape.special[i])
        elif kind == "empty":  # its LayerConfig is a placeholder that is never written
            key = (kind,)
        elif kind == "shared":
            key = (kind, layer.n_kv_heads, layer.head_dim, layer.value_dim)
        else:  # all_flat turns sliding and chunked layers Flat: the policy decides the label
            label = "sliding" if p.is_ring else "chunked" if p.kind == LayerPolicy.Kind.Chunked else "full"
            key = (label, p.window, p.sinks, layer.n_kv_heads, layer.head_dim, layer.value_dim)
        groups.setdefault(key, []).append(i)
    out = []
    for key, members in groups.items():
        rows = {cache.rows(i) for i in members}
        assert len(rows) == 1, f"layers {members} share a policy but not their rows: {rows}"
        row_count = rows.pop()
        if key[0] == "state":
            state = key[1]
            assert isinstance(state, StateShape)
            conv, recurrent = state.conv_bytes(state_size), state.recurrent_bytes
            out.append(LayerKind(
                kind="state", window=None, sinks=0, layers=tuple(members), rows=row_count, n_kv_heads=0,
                head_dim=0, v_head_dim=0, bytes_per_layer=row_count * (conv + recurrent) * batch,
                state_conv_bytes=conv, state_recurrent_bytes=recurrent,
            ))
            continue
        if key[0] == "empty":
            out.append(LayerKind(
                kind="empty", window=None, sinks=0, layers=tuple(members), rows=0, n_kv_heads=0, head_dim=0,
                v_head_dim=0, bytes_per_layer=0,
            ))
            continue
        if key[0] == "shared":
            _, heads, head_dim, value_dim = key
            sources = tuple(_shared_source(shape, i) for i in members)
            out.append(LayerKind(
                kind="shared", window=None, sinks=0, layers=tuple(members), rows=row_count, n_kv_heads=heads,
                head_dim=head_dim, v_head_dim=value_dim, bytes_per_layer=0, sources=sources,
            ))
            continue
        label, window, sinks, heads, head_dim, value_dim = key
        out.append(LayerKind(
            kind=label,
            window=window if label == "sliding" else None,
            sinks=sinks,
            layers=tuple(members),
            rows=row_count,
            n_kv_heads=heads,
            head_dim=head_dim,
            v_head_dim=value_dim,
            bytes_per_layer=row_count * _row_pair_bytes(heads, head_dim, value_dim, dtype_size, kv_dtype) * batch,
            chunk=window if label == "chunked" else None,
        ))
    return tuple(out)


def _shared_source(shape: ModelShape, layer: int) -> int:
    other = shape.special[layer]
    assert isinstance(other, SharedLayer)
    return other.source


def _state_slots_of(cache: SequenceCache) -> Optional[int]:
    slots = {layer.policy.slots for layer in cache.config.layers if layer.policy.kind == LayerPolicy.Kind.State}
    return slots.pop() if slots else None


def _state_dict(plan: MemoryPlan) -> dict[str, Any]:
    """The JSON facts of a plan's state layers: what one slot costs, D, and D = 1 beside it."""
    if plan.state_slots is None:
        return {}
    per_slot = plan.state_bytes_per_slot
    return {"state": {"slots": plan.state_slots, "dtype": plan.state_dtype, "bytes_per_slot": per_slot,
                      "total_bytes": per_slot * plan.state_slots, "one_slot_total_bytes": per_slot}}
