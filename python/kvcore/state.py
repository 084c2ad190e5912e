"""A sequence's state outside its process: export it as a record, import it elsewhere.

A record (docs/state.md) is a versioned, checksummed, little-endian byte string
holding one sequence: its length, removed head and holes, the token ids the
caller knows, and per layer the policy, shape, dtype and the K/V rows of the
positions a future query (or a rewind) may need, in position order: a ring
layer ships its sinks and window, never what it released. Importing it into a
cache whose layers match (a ``SequenceCache`` + ``KVPool`` or a ``BatchCache`` +
``PagedKVPool`` of any block size) gives a sequence whose every plan, read and
``can_rewind`` answer equals the exporter's.

``export_sequence`` / ``import_sequence`` work on bytes-like objects and paths, and
take a ``TorchKVPool`` or ``TorchPagedKV`` too (``kvcore.integrations.torch_state``,
``torch_paged_state``: the same bytes);
``RecordInfo.of(record)`` validates a record and shows its fields, and
``RecordInfo.rows(layer)`` its rows as zero-copy numpy views.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Sequence, Union, cast

import numpy as np
import numpy.typing as npt

from kvcore._core import KVPool, PagedKVPool, check_record
from kvcore._errors import InvalidArgumentError

if TYPE_CHECKING:
    from typing import TypeGuard  # Python 3.10+; annotations only (3.9 runs this module too)

    from kvcore.integrations.torch_paged import TorchPagedKV
    from kvcore.integrations.torch_pool import TorchKVPool

Pool = Union[KVPool, PagedKVPool, "TorchKVPool", "TorchPagedKV"]  # torch is imported only for a torch pool
RecordSource = Union[bytes, bytearray, memoryview, "npt.NDArray[Any]", str, "os.PathLike[str]"]

_NOT_A_POOL = "pool: a KVPool, PagedKVPool, TorchKVPool or TorchPagedKV, not {}"
_HEADER = struct.Struct("<8sIIQIiiiiiII8x")
_LAYER = struct.Struct("<BBHiiiiiiiii")
_ALIGN = 64
_KINDS = ("flat", "ring")


def _dtype(code: int) -> np.dtype[Any]:
    """The numpy dtype of a record's dtype code (bfloat16 from ml_dtypes)."""
    if code == 2:
        import ml_dtypes

        return cast("np.dtype[Any]", np.dtype(ml_dtypes.bfloat16))
    return np.dtype(("float32", "float16", None, "int8", "uint8")[code])


def _padded(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def export_sequence(
    pool: Pool,
    seq: Optional[int] = None,
    *,
    tokens: Optional[Sequence[int] | npt.NDArray[np.integer[Any]]] = None,
    path: Optional[Union[str, "os.PathLike[str]"]] = None,
) -> bytes:
    """The record of a sequence: of ``pool``'s ``SequenceCache`` (``seq`` None) or of
    sequence ``seq`` of its ``BatchCache``. ``tokens``: the token ids of positions
    ``[0, len(tokens))`` (all of them let an importer share a prefix it caches).
    ``path``: also write the record there. Raises as ``pool.export_sequence``
    (InvalidStateError: a step is begun, seq not active; InvalidArgumentError:
    more tokens than the length)."""
    if isinstance(pool, KVPool):
        if seq is not None:
            raise InvalidArgumentError("seq: a KVPool holds one sequence; pass seq=None")
        record = pool.export_sequence(tokens)
    elif isinstance(pool, PagedKVPool):
        if seq is None:
            raise InvalidArgumentError("seq: a PagedKVPool needs the sequence id to export")
        record = pool.export_sequence(seq, tokens)
    elif _is_torch_kv_pool(pool):
        if seq is not None:
            raise InvalidArgumentError("seq: a TorchKVPool holds one sequence; pass seq=None")
        record = pool.export_sequence(tokens)
    elif _is_torch_paged_kv(pool):
        if seq is None:
            raise InvalidArgumentError("seq: a TorchPagedKV needs the sequence id to export")
        record = pool.export_sequence(seq, tokens)
    else:
        raise InvalidArgumentError(_NOT_A_POOL.format(type(pool).__name__))
    if path is not None:
        Path(path).write_bytes(record)
    return record


def _is_torch_kv_pool(pool: Any) -> "TypeGuard[TorchKVPool]":
    """True for a ``kvcore.integrations.torch_pool.TorchKVPool`` (torch imported only if it is one)."""
    if type(pool).__module__ != "kvcore.integrations.torch_pool":
        return False
    from kvcore.integrations.torch_pool import TorchKVPool

    return isinstance(pool, TorchKVPool)


def _is_torch_paged_kv(pool: Any) -> "TypeGuard[TorchPagedKV]":
    """True for a ``kvcore.integrations.torch_paged.TorchPagedKV`` (torch imported only if it is one)."""
    if type(pool).__module__ != "kvcore.integrations.torch_paged":
        return False
    from kvcore.integrations.torch_paged import TorchPagedKV

    return isinstance(pool, TorchPagedKV)


def _record_bytes(record: RecordSource) -> Any:
    if isinstance(record, (str, os.PathLike)):
        return Path(record).read_bytes()
    return record


def import_sequence(
    pool: Pool,
    record: RecordSource,
    seq: Optional[int] = None,
    *,
    trust_tokens: bool = False,
    namespace: Optional[Union[int, bytes, str]] = None,
) -> None:
    """Admits the sequence of ``record`` (bytes-like, or a path to a file holding one)
    into ``pool``'s ``SequenceCache`` (empty; ``seq`` None) or as sequence ``seq``
    (inactive) of its ``BatchCache``. Checks everything first and changes nothing on
    an error; raises as ``pool.import_sequence`` (InvalidArgumentError: truncated,
    corrupt, incomplete, mismatched policy, shape or dtype; NotSupportedError: a newer
    version; InvalidStateError: an active destination; CapacityError: too few blocks or
    over capacity). Into a ``BatchCache`` the record's token ids name and share blocks
    for prefix reuse only when ``trust_tokens`` is True or a prefix ``namespace`` is
    given (None, an int in [0, 2**64), bytes or str; docs/state.md "Trust"); a
    ``SequenceCache`` keys no prefix, and refuses both (InvalidArgumentError)."""
    data = _record_bytes(record)
    trusted = trust_tokens or namespace is not None
    if trusted and (isinstance(pool, KVPool) or _is_torch_kv_pool(pool)):
        raise InvalidArgumentError(
            "trust_tokens / namespace: a SequenceCache keys no prefix; they apply to a BatchCache's pool"
        )
    if isinstance(pool, KVPool):
        if seq is not None:
            raise InvalidArgumentError("seq: a KVPool holds one sequence; pass seq=None")
        pool.import_sequence(data)
    elif isinstance(pool, PagedKVPool):
        if seq is None:
            raise InvalidArgumentError("seq: a PagedKVPool needs the sequence id to import into")
        pool.import_sequence(seq, data, trust_tokens=trust_tokens, namespace=namespace)
    elif _is_torch_kv_pool(pool):
        if seq is not None:
            raise InvalidArgumentError("seq: a TorchKVPool holds one sequence; pass seq=None")
        pool.import_sequence(data)
    elif _is_torch_paged_kv(pool):
        if seq is None:
            raise InvalidArgumentError("seq: a TorchPagedKV needs the sequence id to import into")
        pool.import_sequence(data, seq, trust_tokens=trust_tokens, namespace=namespace)
    else:
        raise InvalidArgumentError(_NOT_A_POOL.format(type(pool).__name__))


@dataclass(frozen=True)
class RecordLayer:
    """One layer of a record: its policy, row shape, dtype and which visible positions
    its rows carry (those below ``sink_end`` and from ``held_from`` on)."""

    kind: str
    window: int
    sinks: int
    n_kv_heads: int
    head_dim: int
    value_dim: int
    dtype: np.dtype[Any]
    sink_end: int
    held_from: int
    n_rows: int
    k_offset: int
    v_offset: int


@dataclass(frozen=True)
class RecordInfo:
    """A validated record's fields; ``rows(layer)`` gives its rows without copying."""

    version: int
    length: int
    max_step: int
    start: int
    holes: tuple[tuple[int, int], ...]
    tokens: npt.NDArray[np.int32]
    layers: tuple[RecordLayer, ...]
    data: Any

    @staticmethod
    def of(record: RecordSource) -> "RecordInfo":
        """Validates ``record`` (as an import does: InvalidArgumentError for a truncated,
        corrupt or malformed record, NotSupportedError for a newer version) and reads it.
        The result's arrays are views of ``record``'s bytes."""
        data = _record_bytes(record)
        check_record(data)
        view = memoryview(data).cast("B")
        (_, version, _, _, n_layers, length, max_step, start, n_holes, n_tokens, _, _) = _HEADER.unpack_from(view, 0)
        at = _HEADER.size
        holes = tuple(struct.unpack_from("<ii", view, at + 8 * h) for h in range(n_holes))
        at += 8 * n_holes
        tokens = np.frombuffer(view, dtype="<i4", count=n_tokens, offset=at)
        at += 4 * n_tokens
        rows_at = _padded(at + _LAYER.size * n_layers)
        layers = []
        for layer in range(n_layers):
            kind, dtype_code, _, window, sinks, heads, head_dim, value_dim, sink_end, held_from, n_rows, _ = (
                _LAYER.unpack_from(view, at + _LAYER.size * layer)
            )
            dtype = _dtype(dtype_code)
            k_bytes = _padded(n_rows * heads * head_dim * dtype.itemsize)
            v_bytes = _padded(n_rows * heads * value_dim * dtype.itemsize)
            layers.append(
                RecordLayer(_KINDS[kind], window, sinks, heads, head_dim, value_dim, dtype, sink_end, held_from,
                            n_rows, rows_at, rows_at + k_bytes)
            )
            rows_at += k_bytes + v_bytes
        return RecordInfo(version, length, max_step, start, holes, tokens, tuple(layers), data)

    def positions(self, layer: int) -> npt.NDArray[np.int64]:
        """The positions of ``layer``'s rows, in order: visible ones below ``sink_end`` or
        from ``held_from`` on."""
        spec = self.layers[layer]
        p = np.arange(self.length, dtype=np.int64)
        keep = (p >= self.start) & ((p < spec.sink_end) | (p >= spec.held_from))
        for begin, end in self.holes:
            keep &= (p < begin) | (p >= end)
        return p[keep]

    def rows(self, layer: int) -> tuple[npt.NDArray[Any], npt.NDArray[Any]]:
        """``layer``'s K rows ``(n_rows, n_kv_heads, head_dim)`` and V rows
        ``(n_rows, n_kv_heads, value_dim)`` as read-only numpy views of the record."""
        s = self.layers[layer]
        k = np.frombuffer(self.data, dtype=s.dtype, count=s.n_rows * s.n_kv_heads * s.head_dim, offset=s.k_offset)
        v = np.frombuffer(self.data, dtype=s.dtype, count=s.n_rows * s.n_kv_heads * s.value_dim, offset=s.v_offset)
        return k.reshape(s.n_rows, s.n_kv_heads, s.head_dim), v.reshape(s.n_rows, s.n_kv_heads, s.value_dim)


__all__ = ["RecordInfo", "RecordLayer", "export_sequence", "import_sequence"]
