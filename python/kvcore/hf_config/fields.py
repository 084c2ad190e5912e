"""One field of a config.json as kvcore reads it: an integer checked by name, and names quoted in messages."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional

from kvcore._errors import InvalidArgumentError


def check_int(name: str, value: Any, *, minimum: int) -> None:
    """InvalidArgumentError naming ``name`` unless ``value`` is an int (not a bool) >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentError(f"{name} = {value!r}: must be an integer")
    if value < minimum:
        raise InvalidArgumentError(f"{name} = {value}: must be >= {minimum}")


def optional_int(value: Any, name: str, *, minimum: int = 1) -> Optional[int]:
    """``value`` as an int checked by ``check_int``, or None when it is None."""
    if value is None:
        return None
    check_int(name, value, minimum=minimum)
    return int(value)


def quoted_names(items: Sequence[str]) -> str:
    """'a', 'b' and 'c'."""
    quoted = [repr(x) for x in items]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} and {quoted[-1]}"


__all__ = ["check_int", "optional_int", "quoted_names"]
