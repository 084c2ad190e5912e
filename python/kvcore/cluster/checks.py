"""The checks every part of kvcore.cluster makes of values another caller or process gives:
uint64s, ints with a floor, block-key pairs (token ids: ``kvcore.tier.token_ids``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from kvcore._errors import InvalidArgumentError


def u64(value: Any, what: str) -> int:
    """`value` as an int in [0, 2**64). InvalidArgumentError names `what` and the value otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 0 <= int(value) < 1 << 64:
        raise InvalidArgumentError(f"{what} = {value!r}: must be an int in [0, 2**64)")
    return int(value)


def positive(value: Any, what: str, least: int = 1) -> int:
    """`value`, an int >= `least` (not a bool). InvalidArgumentError names `what` and the value otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise InvalidArgumentError(f"{what} = {value!r}: must be an int >= {least}")
    return value


def key_pairs(keys: Any, what: str) -> list[tuple[int, int]]:
    """`keys` as a list of (lo, hi) uint64 pairs (block keys). InvalidArgumentError names `what`."""
    try:
        pairs = [(lo, hi) for lo, hi in keys]
    except (TypeError, ValueError):
        raise InvalidArgumentError(f"{what}: must be a sequence of (lo, hi) pairs of uint64") from None
    return [(u64(lo, f"{what} lo"), u64(hi, f"{what} hi")) for lo, hi in pairs]
