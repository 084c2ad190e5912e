"""A sequence's state outside its process: export it as a record, import it elsewhere.

A record (docs/state.md) is a versioned, checksummed, little-endian byte string
holding one sequence: its length, removed head and holes, the token ids the
caller knows, and per layer the policy, shape, dtype and the K/V rows of the
positions a future query (or a rewind) may need, in position order: a ring
layer ships its sinks and window, never what it released. Importing it into a
cache whose layers match (a ``SequenceCache`` + ``KVPool`` or a ``BatchCache`` +
``PagedKVPool`` of any block size) gives a sequence whose every plan and read equals
the exporter's, and every ``can_rewind`` answer as far back as the record reaches (a
State layer ships the run of held states ending at the last one: docs/state.md).

``export_sequence`` / ``import_sequence`` work on bytes-like objects and paths, and
take any byte layer implementing ``SequencePool`` (the numpy ``KVPool`` /
``PagedKVPool`` and the torch ``TorchKVPool`` / ``TorchPagedKVPool`` of
``kvcore.torch``: the same bytes); this module imports none of them beyond the core.
``RecordInfo.of(record)`` validates a record and shows its fields, and
``RecordInfo.rows(layer)`` its rows as zero-copy numpy views.

Argument order (every export and import, methods and these functions alike): the
pool first, then the sequence id (pools over a ``BatchCache`` only), then the record
or the tokens: ``export_sequence(pool, seq, tokens=...)``,
``import_sequence(pool, seq, record)``; a pool over a ``SequenceCache`` holds one
sequence and takes no id: ``import_sequence(pool, record)``.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, replace
from pathlib import Path
import warnings
from typing import Any, Callable, Optional, Protocol, Sequence, Union, cast, runtime_checkable

import numpy as np
import numpy.typing as npt

from kvcore._core import CacheBase, SequenceCache, check_record
from kvcore._errors import InternalError, InvalidArgumentError
from kvcore.quantized import row_bytes as quantized_row_bytes

RecordSource = Union[bytes, bytearray, memoryview, "npt.NDArray[Any]", str, "os.PathLike[str]"]


@runtime_checkable
class SequencePool(Protocol):
    """A byte layer whose sequences move as records: ``KVPool``, ``PagedKVPool``, and
    ``kvcore.torch``'s ``TorchKVPool`` and ``TorchPagedKVPool``. Over a ``SequenceCache``
    (``cache``) it holds one sequence: ``export_sequence(tokens)``, ``import_sequence(record)``;
    over a ``BatchCache``: ``export_sequence(seq, tokens)``, ``import_sequence(seq, record)``."""

    @property
    def cache(self) -> Any:
        """The cache whose plans the pool applies (a ``SequenceCache`` or a ``BatchCache``)."""

    @property
    def export_sequence(self) -> Callable[..., bytes]:
        """The record of the sequence (``seq`` first over a ``BatchCache``), then ``tokens``."""

    @property
    def import_sequence(self) -> Callable[..., object]:
        """Admits a record's sequence (``seq`` first over a ``BatchCache``, then the record)."""


Pool = SequencePool

_NOT_A_POOL = "pool: a KVPool, PagedKVPool, TorchKVPool or TorchPagedKVPool (a SequencePool), not {}"

_HEADER = struct.Struct("<8sIIQIiiiiiII8x")
_LAYER = struct.Struct("<BBHiiiiiiiii")
_ALIGN = 64
_KINDS = ("flat", "ring", "chunked", "shared", "state")  # LayerPolicy.Kind's serialized values


#: Record dtype codes of the quantized formats (docs/quantized.md): rows of raw bytes.
_QUANTIZED = {5: "qint8", 6: "fp8_e4m3"}


def _dtype(code: int) -> np.dtype[Any]:
    """The numpy dtype of a record's dtype code (bfloat16 from ml_dtypes; uint8, the rows'
    bytes, for a quantized format)."""
    if code in _QUANTIZED:
        return np.dtype("uint8")
    if code == 2:
        import ml_dtypes

        return cast("np.dtype[Any]", np.dtype(ml_dtypes.bfloat16))
    return np.dtype(("float32", "float16", None, "int8", "uint8")[code])


def _padded(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def _holds_one(pool: Any, seq: Optional[int], verb: str) -> bool:
    """Whether ``pool`` holds one sequence (over a ``SequenceCache``), after checking ``seq``
    fits it: InvalidArgumentError for a pool that is no ``SequencePool`` or a wrong ``seq``."""
    if not isinstance(pool, SequencePool) or not isinstance(pool.cache, CacheBase):
        raise InvalidArgumentError(_NOT_A_POOL.format(type(pool).__name__))
    one = isinstance(pool.cache, SequenceCache)
    name = type(pool).__name__
    if one and seq is not None:
        raise InvalidArgumentError(f"seq: a {name} holds one sequence; pass seq=None")
    if not one and seq is None:
        raise InvalidArgumentError(f"seq: a {name} needs the sequence id to {verb}")
    return one


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
    ``path``: also write the record there. Raises InvalidArgumentError for a pool that is
    no ``SequencePool`` or a ``seq`` it does not take, else as ``pool.export_sequence``
    (InvalidStateError: a step is begun, seq not active; InvalidArgumentError: more
    tokens than the length)."""
    if _holds_one(pool, seq, "export"):
        record = pool.export_sequence(tokens)
    else:
        record = pool.export_sequence(seq, tokens)
    if path is not None:
        Path(path).write_bytes(record)
    return record


def record_data(record: RecordSource) -> Any:
    """The bytes of ``record``: read from the file when it is a path, else ``record`` itself
    (bytes-like, unchanged and uncopied)."""
    if isinstance(record, (str, os.PathLike)):
        return Path(record).read_bytes()
    return record


def _is_seq(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def import_sequence(
    pool: Pool,
    *args: Any,
    seq: Optional[int] = None,
    trust_tokens: bool = False,
    namespace: Optional[Union[int, bytes, str]] = None,
) -> None:
    """Admits the sequence of a record (bytes-like, or a path to a file holding one):
    ``import_sequence(pool, record)`` (or ``(pool, None, record)``) into ``pool``'s empty
    ``SequenceCache``, or ``import_sequence(pool, seq, record)`` as sequence ``seq``
    (inactive) of its ``BatchCache`` (docs/state.md: the pool, then the id, then the record). The order of
    the last release, ``(pool, record, seq)`` or ``seq=`` by keyword, still works and
    warns (DeprecationWarning). Checks everything first and changes nothing on an error;
    raises InvalidArgumentError for a pool that is no ``SequencePool`` or a ``seq`` it does
    not take, else as ``pool.import_sequence`` (InvalidArgumentError: truncated, corrupt,
    incomplete, mismatched policy, shape or dtype; NotSupportedError: a newer version;
    InvalidStateError: an active destination; CapacityError: too few blocks or over
    capacity). Into a ``BatchCache`` the record's token ids name and share blocks for
    prefix reuse only when ``trust_tokens`` is True or a prefix ``namespace`` is given
    (None, an int in [0, 2**64), bytes or str; docs/state.md "Trust"); a ``SequenceCache``
    keys no prefix, and refuses both (InvalidArgumentError)."""
    if len(args) == 2 and (args[0] is None or _is_seq(args[0])) and seq is None:
        seq, record = args
    elif len(args) == 1 and seq is None:
        (record,) = args
    elif (len(args) == 2 and (args[1] is None or _is_seq(args[1])) and seq is None) or (len(args) == 1 and seq is not None):
        warnings.warn(
            "import_sequence(pool, record, seq) is deprecated: pass import_sequence(pool, seq, record) "
            "(removed in kvcore 0.2.0)",
            DeprecationWarning,
            stacklevel=2,
        )
        record = args[0]
        seq = args[1] if len(args) == 2 else seq
    else:
        raise InvalidArgumentError(
            "import_sequence: pass (pool, record) for a pool of one sequence or (pool, seq, record)"
        )
    data = record_data(record)
    if _holds_one(pool, seq, "import into"):
        if trust_tokens or namespace is not None:
            raise InvalidArgumentError(
                "trust_tokens / namespace: a SequenceCache keys no prefix; they apply to a BatchCache's pool"
            )
        pool.import_sequence(data)
    else:
        pool.import_sequence(seq, data, trust_tokens=trust_tokens, namespace=namespace)


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
    #: "qint8" or "fp8_e4m3" when the rows are quantized (``rows`` then gives each row's bytes,
    #: values then scales and zero points: ``QuantRowLayout``); None for a plain dtype.
    format: Optional[str] = None
    #: A "shared" layer's source layer, a "state" layer's slots D; 0 otherwise (version 3). A
    #: state layer's rows are its states (uint8 rows of ``head_dim`` bytes, no V): row j the
    #: state after position ``held_from + j``.
    param: int = 0

    def row_bytes(self, dim: int) -> int:
        """Bytes of one row of ``n_kv_heads`` x ``dim`` (``head_dim`` for K, ``value_dim`` for V)."""
        if self.format is not None:
            return quantized_row_bytes("int8" if self.format == "qint8" else "fp8", self.n_kv_heads, dim)
        return self.n_kv_heads * dim * self.dtype.itemsize


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
        data = record_data(record)
        check_record(data)
        return RecordInfo.parse(data)

    @staticmethod
    def parse(record: RecordSource) -> "RecordInfo":
        """Reads ``record`` without validating it: for a record an import validates (once)
        or kvcore just made. Bytes it cannot read are refused as ``RecordInfo.of`` refuses
        them (InvalidArgumentError, NotSupportedError); other invalid bytes read as nonsense."""
        data = record_data(record)
        try:
            return RecordInfo._read(data)
        except (struct.error, ValueError, IndexError, TypeError):
            check_record(data)  # raises the import's error for the bytes
            raise InternalError("record: unreadable, yet check_record accepts it") from None

    @staticmethod
    def _read(data: Any) -> "RecordInfo":
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
            kind, dtype_code, _, window, sinks, heads, head_dim, value_dim, sink_end, held_from, n_rows, param = (
                _LAYER.unpack_from(view, at + _LAYER.size * layer)
            )
            dtype = _dtype(dtype_code)
            spec = RecordLayer(_KINDS[kind], window, sinks, heads, head_dim, value_dim, dtype, sink_end, held_from,
                               n_rows, rows_at, 0, _QUANTIZED.get(dtype_code), param)
            k_bytes = _padded(n_rows * spec.row_bytes(head_dim))
            v_bytes = _padded(n_rows * spec.row_bytes(value_dim))
            layers.append(replace(spec, v_offset=rows_at + k_bytes))
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
        ``(n_rows, n_kv_heads, value_dim)`` as read-only numpy views of the record; a quantized
        layer's as ``(n_rows, row_bytes)`` uint8 (each row's values, scales and zero points)."""
        s = self.layers[layer]
        if s.format is not None:
            kb, vb = s.row_bytes(s.head_dim), s.row_bytes(s.value_dim)
            k = np.frombuffer(self.data, dtype=np.uint8, count=s.n_rows * kb, offset=s.k_offset)
            v = np.frombuffer(self.data, dtype=np.uint8, count=s.n_rows * vb, offset=s.v_offset)
            return k.reshape(s.n_rows, kb), v.reshape(s.n_rows, vb)
        k = np.frombuffer(self.data, dtype=s.dtype, count=s.n_rows * s.n_kv_heads * s.head_dim, offset=s.k_offset)
        v = np.frombuffer(self.data, dtype=s.dtype, count=s.n_rows * s.n_kv_heads * s.value_dim, offset=s.v_offset)
        return k.reshape(s.n_rows, s.n_kv_heads, s.head_dim), v.reshape(s.n_rows, s.n_kv_heads, s.value_dim)


__all__ = ["RecordInfo", "RecordLayer", "SequencePool", "export_sequence", "import_sequence", "record_data"]
