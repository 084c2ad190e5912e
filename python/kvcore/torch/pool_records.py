"""Sequence records (docs/state.md) of a ``TorchKVPool``: export and import in the record format.

A torch pool's rows live in tensors ``[batch, n_kv_heads, rows, dim]`` the core never
sees, while a record stores each layer's rows as ``(n_rows, n_kv_heads, dim)``. So the
core writes and reads everything but the rows, and this module moves the rows:

- export: a numpy ``KVPool`` on the same cache (reserved to the torch layers' rows,
  never written) lets the core write the record's header, tables and padding exactly as
  for a ``KVPool``; the rows are then copied in from the tensors (position order, the
  cache's ``LayerGeometry`` naming each position's row) and ``seal_record`` writes the
  checksum. The record equals, byte for byte, a ``KVPool``'s of the same sequence and
  contents.
- import: the new tensors are allocated, then a numpy ``KVPool`` on the cache imports
  the record (every check of ``KVPool.import_sequence``, the record validated before the
  tensors were allocated: a refusal changes nothing) and the record's rows are copied into the tensors, mirror
  rows included; the pool installs the new layers.

A ``TorchQuantizedKVPool`` passes its ``record_format`` ("qint8" or "fp8_e4m3"): its tensors
hold quantized rows ``[1, 1, rows, row_bytes]`` and the helper is a ``KVPool`` of that format,
so its records are ``KVPool(cache, "qint8" / "fp8_e4m3")``'s; a record of another storage
format is refused by name.

Both hold a transient numpy copy of the rows (the helper pool) on top of the tensors.
The functions take the pool through ``LayerStore`` (what they read of it), so this
module sits below ``kvcore.torch.pool``, which calls it.
"""

from __future__ import annotations

from typing import Optional, Protocol, Union

import numpy as np
import numpy.typing as npt
import torch

from kvcore._core import KVPool, LayerPolicy, SequenceCache, seal_record
from kvcore._errors import InvalidArgumentError, InvalidStateError, NotSupportedError
from kvcore.state import RecordInfo, RecordSource, record_data
from kvcore.torch.layer import LayerPool
from kvcore.quantized import row_bytes
from kvcore.torch.record_dtypes import (
    KV_DTYPE_OF_FORMAT, RECORD_DTYPE, TORCH_DTYPE, Tokens, byte_view, stored_rows, tensor_of,
)


class LayerStore(Protocol):
    """What export and import read of a ``TorchKVPool``: its cache, each layer's storage
    (None before it is allocated) and each layer's mirror rows."""

    cache: SequenceCache

    def layer(self, layer: int) -> Optional[LayerPool]:
        """The layer's storage, or None before it is allocated."""

    def mirror_rows(self, layer: int) -> int:
        """Rows the layer keeps after its last row as a copy of its first ring rows."""


def _rows_of(pool: LayerStore, layer: int, positions: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """The row holding each position (LayerGeometry: sinks fixed, then the ring in turn)."""
    g = pool.cache.geometry(layer)
    if not g.wraps:
        return positions
    s, r = g.sink_rows, g.ring_rows
    return np.where(positions < s, positions, s + (positions - s) % r)


def _check_formats(info: RecordInfo, record_format: Optional[str]) -> None:
    """InvalidArgumentError naming the formats when a layer of ``info`` is stored otherwise than the
    pool stores rows: quantized rows into a plain pool, plain rows or another format into a
    quantized pool (``record_format``)."""
    for layer, spec in enumerate(info.layers):
        if spec.format is not None and spec.format != record_format:
            raise InvalidArgumentError(
                f"import: layer {layer} holds {spec.format} rows (quantized, docs/quantized.md), the pool "
                f"{record_format or 'plain dtypes'}: import it into TorchQuantizedKVPool(cache, "
                f"{KV_DTYPE_OF_FORMAT[spec.format]!r}) or kvcore.KVPool(cache, {spec.format!r})")
        if spec.format is None and record_format is not None:
            raise InvalidArgumentError(
                f"import: layer {layer} holds {spec.dtype.name} rows, the pool {record_format} (quantized, "
                f"docs/quantized.md): import it into a TorchKVPool or kvcore.KVPool(cache, {spec.dtype.name!r})")


def _export_dtype(pool: LayerStore, dtype: Optional[torch.dtype]) -> torch.dtype:
    """The one dtype of the pool's allocated layers (or ``dtype``), checked for a record."""
    length = pool.cache.length
    found = dtype
    for layer in range(pool.cache.n_layers):
        lp = pool.layer(layer)
        if lp is None:
            if length > 0:
                raise InvalidStateError(
                    f"export: layer {layer} holds no tensors but the sequence has {length} positions (write its steps first)"
                )
            continue
        if lp.batch_size != 1:
            raise InvalidArgumentError(
                f"export: layer {layer} holds a batch of {lp.batch_size} sequences: a record holds one (batch 1)"
            )
        if found is not None and lp.dtype != found:
            raise InvalidArgumentError(f"export: layer {layer} holds {lp.dtype}, another layer (or dtype=) {found}: a record has one dtype")
        found = lp.dtype
    if found is None:
        raise InvalidArgumentError("export: no layer holds tensors yet: pass dtype= to export the empty sequence")
    if found not in RECORD_DTYPE:
        raise InvalidArgumentError(f"export: dtype {found}: a record holds float32, float16, bfloat16, int8 or uint8")
    return found


def _refuse_state_layers(cache: SequenceCache, what: str) -> None:
    """NotSupportedError naming the first State or Shared layer: a torch pool's records do not
    carry them yet (it keeps states beside it, in ``TorchStateSlots``; a ``KVPool``'s records
    carry both: docs/layer_kinds.md)."""
    for layer in range(cache.n_layers):
        kind = cache.layer_policy(layer).kind
        if kind == LayerPolicy.Kind.State:
            raise NotSupportedError(
                f"{what}: layer {layer} is a State layer; records do not carry recurrent states yet")
        if kind == LayerPolicy.Kind.Shared:
            raise NotSupportedError(
                f"{what}: layer {layer} is a Shared layer; a torch pool's records do not carry Shared layers yet "
                "(a KVPool's do)")


def export_sequence(
    pool: LayerStore, tokens: Tokens = None, *, dtype: Optional[torch.dtype] = None, record_format: Optional[str] = None
) -> bytes:
    """The record of ``pool``'s sequence (docs/state.md), byte for byte what a ``KVPool`` of the
    same sequence and rows gives. ``tokens``: ids of positions ``[0, len(tokens))``. ``dtype``:
    the record's dtype when no layer holds tensors yet (an empty sequence). ``record_format``:
    "qint8" or "fp8_e4m3" when the pool's tensors hold quantized rows ``[1, 1, rows, row_bytes]``
    uint8 (``TorchQuantizedKVPool``: the record is ``KVPool(cache, record_format)``'s).
    InvalidStateError: a step is begun, a layer without tensors or rows for a held position;
    InvalidArgumentError: a batch other than 1, mixed or unsupported dtypes, more tokens than the
    length; NotSupportedError: a State or Shared layer (a torch pool's records do not carry them yet)."""
    cache = pool.cache
    _refuse_state_layers(cache, "export")
    if cache.active_step is not None:
        raise InvalidStateError("export: a step is begun; commit or abort it first")
    tdtype = _export_dtype(pool, torch.uint8 if record_format is not None else dtype)
    helper = KVPool(cache, record_format or RECORD_DTYPE[tdtype])
    for layer in range(cache.n_layers):
        lp = pool.layer(layer)
        if lp is not None and lp.allocated_rows > helper.allocated_rows(layer):
            helper.reserve(layer, lp.allocated_rows)
    n_tokens = 0 if tokens is None else len(tokens)
    out = np.empty(helper.export_size(n_tokens), dtype=np.uint8)
    helper.export_into(out, tokens)  # header, tables, padding (the rows: ours, next)
    del helper
    info = RecordInfo.parse(out)  # made by the helper just now: nothing to validate
    for layer, spec in enumerate(info.layers):
        lp = pool.layer(layer)
        if lp is None or spec.n_rows == 0:
            continue
        rows = torch.from_numpy(_rows_of(pool, layer, info.positions(layer))).to(lp.device)
        for tensor, offset in ((lp.keys, spec.k_offset), (lp.values, spec.v_offset)):
            picked = byte_view(tensor[0].index_select(1, rows).permute(1, 0, 2).contiguous().cpu())
            out[offset : offset + picked.size] = picked
    seal_record(out)
    return out.tobytes()


def _new_layers(
    pool: LayerStore, info: RecordInfo, dtype: torch.dtype, device: torch.device, record_format: Optional[str]
) -> list[LayerPool]:
    """Fresh zeroed batch-1 tensors for every layer, big enough for the record's rows (quantized
    rows ``[1, 1, rows, row_bytes]`` for a ``record_format``)."""
    layers = []
    for layer in range(pool.cache.n_layers):
        lc = pool.cache.config.layers[0 if len(pool.cache.config.layers) == 1 else layer]
        rows = pool.cache.rows(layer)
        mirror = pool.mirror_rows(layer)
        start = rows + mirror if lc.policy.is_ring else min(rows, max(info.length, pool.cache.config.initial_capacity))
        shape = (lc.n_kv_heads, lc.head_dim, lc.value_dim)
        if record_format is not None:
            kv_dtype = KV_DTYPE_OF_FORMAT[record_format]
            shape = (1, row_bytes(kv_dtype, lc.n_kv_heads, lc.head_dim), row_bytes(kv_dtype, lc.n_kv_heads, lc.value_dim))
        keys = torch.zeros((1, shape[0], start, shape[1]), dtype=dtype, device=device)
        values = torch.zeros((1, shape[0], start, shape[2]), dtype=dtype, device=device)
        layers.append(LayerPool(keys, values, rows, mirror if lc.policy.is_ring else 0))
    return layers


def import_layers(
    pool: LayerStore,
    record: RecordSource,
    *,
    device: Union[torch.device, str, None] = None,
    record_format: Optional[str] = None,
) -> list[LayerPool]:
    """Admits the sequence of ``record`` (bytes-like or a path) into ``pool``'s empty cache (its
    length) and returns its rows in new batch-1 tensors of the record's dtype on ``device``
    (default: the device of the pool's first allocated layer, else CPU), one ``LayerPool`` per
    layer, for the pool to install (``TorchKVPool.import_sequence`` does). ``record_format``:
    "qint8" or "fp8_e4m3" for a pool of quantized rows (``TorchQuantizedKVPool``), whose records
    must hold that format (and a plain pool's, plain dtypes): InvalidArgumentError naming both. The record is validated
    before its sizes allocate anything (and again by the helper pool's import). Checks everything first and changes nothing on an error; raises as ``KVPool.import_sequence`` (InvalidArgumentError: truncated,
    corrupt, another policy, shape or layer count; NotSupportedError: a newer version, holes or a
    removed head; InvalidStateError: the cache holds positions or a begun step; CapacityError: over
    capacity), InvalidArgumentError also for layers of mixed dtypes; NotSupportedError for a model
    with State or Shared layers (a torch pool's records do not carry them yet)."""
    _refuse_state_layers(pool.cache, "import")
    data = record_data(record)
    info = RecordInfo.of(data)  # validated before its sizes allocate tensors
    _check_formats(info, record_format)
    names = {spec.dtype.name for spec in info.layers}
    if len(names) != 1:
        raise InvalidArgumentError(f"import: the record's layers hold {sorted(names)}: a torch pool imports one dtype")
    if device is None:
        allocated = [lp for lp in (pool.layer(i) for i in range(pool.cache.n_layers)) if lp is not None]
        device = allocated[0].device if allocated else "cpu"
    dev = torch.device(device)
    if len(info.layers) == pool.cache.n_layers:
        layers = _new_layers(pool, info, TORCH_DTYPE[names.pop()], dev, record_format)
    else:
        layers = []  # the helper's import refuses the layer count by name
    KVPool(pool.cache, record_format or info.layers[0].dtype).import_sequence(data)  # every check; changes the cache only on success
    for layer, (lp, spec) in enumerate(zip(layers, info.layers)):
        if spec.n_rows:
            rows = torch.from_numpy(_rows_of(pool, layer, info.positions(layer))).to(dev)
            for tensor, src in zip((lp.keys, lp.values), info.rows(layer)):
                tensor[0].index_copy_(1, rows, stored_rows(tensor_of(src, tensor.dtype)).permute(1, 0, 2).to(dev))
        if lp.mirror_rows:  # rows [rows, rows + m) repeat the first ring rows
            lo = pool.cache.geometry(layer).sink_rows
            lp.keys[:, :, lp.rows :].copy_(lp.keys[:, :, lo : lo + lp.mirror_rows])
            lp.values[:, :, lp.rows :].copy_(lp.values[:, :, lo : lo + lp.mirror_rows])
    return layers


__all__ = ["LayerStore", "export_sequence", "import_layers"]
