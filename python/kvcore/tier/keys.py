"""What both tiers check of a prompt and a namespace: ``namespace_id`` (the 64-bit prefix
namespace a value names, as ``BatchCache.add_sequence`` reads it) and ``token_ids`` (a prompt
as a 1-D int32 array)."""

from __future__ import annotations

import hashlib
from typing import Any, Optional, Sequence, Union

import numpy as np
import numpy.typing as npt

from kvcore._errors import InvalidArgumentError

Namespace = Optional[Union[int, bytes, str]]
Tokens = Union[Sequence[int], npt.NDArray[np.integer[Any]]]


def namespace_id(namespace: Namespace) -> int:
    """The 64-bit prefix namespace `namespace` names, as ``BatchCache.add_sequence`` reads it:
    None is 0, an int in [0, 2**64) itself, bytes or str (UTF-8) its BLAKE2b digest (8 bytes,
    personalization ``b"kvcore-ns"``, little-endian). InvalidArgumentError: a bool, an int out of
    range, another type."""
    if namespace is None:
        return 0
    if isinstance(namespace, bool):
        raise InvalidArgumentError("namespace: must be None, an int in [0, 2**64), bytes or str, not a bool")
    if isinstance(namespace, int):
        if not 0 <= namespace < 1 << 64:
            raise InvalidArgumentError(f"namespace = {namespace}: an int namespace must be in [0, 2**64)")
        return namespace
    if isinstance(namespace, (str, bytes)):
        data = namespace.encode("utf-8") if isinstance(namespace, str) else namespace
        return int.from_bytes(hashlib.blake2b(data, digest_size=8, person=b"kvcore-ns").digest(), "little")
    raise InvalidArgumentError(
        f"namespace: must be None, an int in [0, 2**64), bytes or str, not {type(namespace).__name__}"
    )


def token_ids(tokens: Tokens, what: str) -> npt.NDArray[np.int32]:
    """`tokens` (an ordered sequence or 1-D array of ints) as a 1-D int32 array, a copy: the check
    the host tier and the cluster store make of a prompt. InvalidArgumentError names `what` and
    what is wrong (an unordered collection, a string, another shape or dtype, an id beyond 32 bits)."""
    if isinstance(tokens, (set, frozenset, dict, str, bytes)):
        raise InvalidArgumentError(f"{what}: tokens must be an ordered sequence of ints, not a {type(tokens).__name__}")
    try:
        arr = np.asarray(tokens)
    except (TypeError, ValueError) as e:
        raise InvalidArgumentError(f"{what}: tokens must be a 1-D sequence of ints ({e})") from None
    if arr.size == 0:
        arr = arr.reshape(0).astype(np.int64)
    if arr.ndim != 1 or arr.dtype.kind not in "iu":
        raise InvalidArgumentError(f"{what}: tokens must be a 1-D sequence of ints, not {arr.dtype} of shape {arr.shape}")
    if arr.size and (int(arr.min()) < -(1 << 31) or int(arr.max()) >= 1 << 31):
        raise InvalidArgumentError(f"{what}: a token id is beyond 32 bits")
    return np.ascontiguousarray(arr, dtype=np.int32).copy()
