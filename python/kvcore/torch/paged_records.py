"""Sequence records (docs/state.md) of a ``TorchPagedKVPool``: export and import in the record format.

A ``TorchPagedKVPool`` keeps each layer's rows in tensors ``[1, n_kv_heads, rows, dim]``
indexed by pool row (block ``b`` holds rows ``[b * B, (b + 1) * B)``), which the core
never sees; a record stores a layer's rows as ``(n_rows, n_kv_heads, dim)`` in position
order. So the core writes and checks everything but the rows, and this module moves
the rows, as ``kvcore.torch.pool_records`` does for ``TorchKVPool``:

- export: a numpy ``PagedKVPool`` on the same cache (reserved up to the sequence's
  highest block, never written) lets the core write the record's header, tables and
  padding exactly as for a ``PagedKVPool``; the rows are then gathered from the tensors
  (``BatchCache.block_table`` names each position's row) and ``seal_record`` writes the
  checksum. The record equals, byte for byte, a ``PagedKVPool``'s of the same sequence
  and rows.
- import: a numpy ``PagedKVPool`` on the cache imports the record (every check of
  ``PagedKVPool.import_sequence``, after the record was validated before any growth: a refusal changes
  nothing) and reports the blocks it
  wrote; exactly those are written into the tensors, never a block the import shared
  with a cached prefix (another sequence may be reading it).

A ``TorchQuantizedPagedKVPool``'s tensors hold quantized rows (``record_format`` "qint8" or
"fp8_e4m3"): the helper pool is a ``PagedKVPool`` of that format and the rows move as bytes,
scales and zero points inside them; a record of another storage format is refused by name.

Both hold a transient numpy pool besides the tensors: its storage spans the rows up to
the sequence's highest block (export) or up to the blocks the import may take (import),
though only the sequence's rows are read or written. The functions take the store
through ``PagedStore`` (what they use of it), so this module sits below
``kvcore.torch.paged``, which calls it.
"""

from __future__ import annotations

from typing import Optional, Protocol, Union

import numpy as np
import numpy.typing as npt
import torch

from kvcore._core import BatchCache, PagedKVPool, seal_record
from kvcore._errors import InvalidArgumentError, InvalidStateError
from kvcore.state import RecordInfo, RecordSource, record_data
from kvcore.torch.record_dtypes import KV_DTYPE_OF_FORMAT, Tokens, byte_view, stored_rows, tensor_of


class PagedStore(Protocol):
    """What export and import use of a ``TorchPagedKVPool``: its cache and geometry, its
    tensors' dtype and device, and its per-layer tensors (read, grown)."""

    cache: BatchCache
    block_size: int
    group_of: list[int]
    max_rows: list[int]
    dtype: torch.dtype
    device: torch.device

    @property
    def record_format(self) -> Optional[str]:
        """The record dtype of the stored rows (``"float32"``, ..., ``"qint8"``, ``"fp8_e4m3"``), or None."""

    def tensors(self, layer: int) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
        """The layer's K and V tensors, or None before its first write."""

    def allocated_rows(self, layer: int) -> int:
        """Rows the layer's tensors hold now."""

    def ensure(self, layer: int, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Grows the layer to at least ``rows`` rows; returns its K and V tensors."""


def _record_dtype(kv: PagedStore, what: str) -> str:
    """The record dtype of the stored rows (a numpy name or a quantized format), checked for a record."""
    name = kv.record_format
    if name is None:
        raise InvalidArgumentError(
            f"{what}: the tensors hold {kv.dtype}: a record holds float32, float16, bfloat16, int8 or uint8"
        )
    return name


def _rows(table: npt.NDArray[np.int32], positions: npt.NDArray[np.int64], B: int) -> npt.NDArray[np.int64]:
    """The pool row of each position: its block's id (by the block table) * B + its offset."""
    return table[positions // B].astype(np.int64) * B + positions % B


def export_sequence(kv: PagedStore, seq: int, tokens: Tokens = None) -> bytes:
    """The record of sequence ``seq`` (docs/state.md), byte for byte what a ``PagedKVPool`` of the
    same cache and rows gives. ``tokens``: ids of positions ``[0, len(tokens))``. Raises as
    ``PagedKVPool.export_sequence`` (InvalidArgumentError: bad seq, more tokens than the length;
    InvalidStateError: seq not active, a step is begun), InvalidArgumentError for tensors of a dtype
    no record holds, InvalidStateError for a carried position whose row the tensors do not hold."""
    cache, B = kv.cache, kv.block_size
    helper = PagedKVPool(cache, _record_dtype(kv, "export"), initial_rows=0)
    size = helper.export_size(seq, 0 if tokens is None else len(tokens))  # seq and n_tokens checked
    tables = [cache.block_table(seq, g) for g in range(cache.n_groups)]
    for layer, g in enumerate(kv.group_of):  # the helper's rows must span the sequence's blocks
        held = tables[g][tables[g] >= 0]
        if held.size:
            helper.reserve(layer, min((int(held.max()) + 1) * B, kv.max_rows[g]))
    out = np.empty(size, dtype=np.uint8)
    helper.export_into(seq, out, tokens)  # header, tables, padding (the rows: ours, next)
    del helper
    info = RecordInfo.parse(out)  # made by the helper just now: nothing to validate
    for layer, spec in enumerate(info.layers):
        if spec.n_rows == 0:
            continue
        positions = info.positions(layer)
        rows = _rows(tables[kv.group_of[layer]], positions, B)
        tensors = kv.tensors(layer)
        have = 0 if tensors is None else int(tensors[0].shape[2])
        if tensors is None or int(rows.max()) >= have:
            at = int(np.argmax(rows >= have))
            raise InvalidStateError(
                f"export: layer {layer} position {int(positions[at])} lies in row {int(rows[at])}, past the "
                f"{have} rows its tensors hold (write the step first)"
            )
        index = torch.from_numpy(rows).to(kv.device)
        for tensor, offset in zip(tensors, (spec.k_offset, spec.v_offset)):
            picked = byte_view(tensor[0].index_select(1, index).permute(1, 0, 2).contiguous().cpu())
            out[offset : offset + picked.size] = picked
    seal_record(out)
    return out.tobytes()


def _grow_for(kv: PagedStore, info: RecordInfo) -> None:
    """Grow each allocated or lazy layer to the rows the import's fresh blocks may reach (the
    bound ``import_record`` reserves: the one pool's used blocks, what every group imports and
    every group's cached blocks), before anything changes."""
    cache, B = kv.cache, kv.block_size
    blocks = -(-info.length // B)
    groups = range(cache.n_groups)
    reach = (cache.used_blocks(0) if cache.n_groups else 0) + len(groups) * blocks + sum(cache.cached_blocks(g) for g in groups)
    for layer, g in enumerate(kv.group_of):
        if g < 0:  # a State layer: its slots, no blocks
            continue
        bound = min(reach * B, kv.max_rows[g])
        if bound > kv.allocated_rows(layer):
            kv.ensure(layer, bound)


def _write_blocks(kv: PagedStore, info: RecordInfo, written: npt.NDArray[np.int32]) -> None:
    """Copy the record's rows of the written blocks ``(group, index, block)`` into the tensors."""
    B = kv.block_size
    n_blocks = -(-info.length // B)
    for g in range(kv.cache.n_groups):
        mine = written[written[:, 0] == g]
        if mine.size == 0:
            continue
        ids = np.full(n_blocks, -1, dtype=np.int32)
        ids[mine[:, 1]] = mine[:, 2]
        for layer in (layer for layer, lg in enumerate(kv.group_of) if lg == g):
            if info.layers[layer].n_rows == 0:
                continue
            positions = info.positions(layer)
            fresh = ids[positions // B] >= 0
            if not fresh.any():
                continue
            rows = _rows(ids, positions[fresh], B)
            keys, values = kv.ensure(layer, int(rows.max()) + 1)  # grown already: no copy
            index = torch.from_numpy(rows).to(kv.device)
            for tensor, src in zip((keys, values), info.rows(layer)):
                tensor[0].index_copy_(1, index, stored_rows(tensor_of(src[fresh], kv.dtype)).permute(1, 0, 2).to(kv.device))


def import_sequence(
    kv: PagedStore,
    seq: int,
    record: RecordSource,
    *,
    trust_tokens: bool = False,
    namespace: Optional[Union[int, bytes, str]] = None,
) -> None:
    """Admits the sequence of ``record`` (bytes-like or a path; from any kvcore pool) as sequence
    ``seq`` (inactive) of ``kv``'s cache, and writes its rows into the tensors: only the blocks
    the import wrote, not those it shared with a prefix the cache holds. Checks everything first;
    a refusal changes neither the cache nor any row's bytes (a lazily grown layer may have grown,
    as a ``PagedKVPool`` may). Raises as ``PagedKVPool.import_sequence`` (InvalidArgumentError:
    truncated, corrupt, another layer count, policy, shape or dtype than the tensors';
    NotSupportedError: a newer version, a ring group's sink blocks would keep a position the record
    lacks; InvalidStateError: seq active; CapacityError: no free table row, over capacity, too many
    holes, too few blocks), InvalidArgumentError also for tensors of a dtype no record holds.
    ``trust_tokens`` / ``namespace``: as ``PagedKVPool.import_sequence`` (by default the record's
    token ids name and share no block)."""
    data = record_data(record)
    name = _record_dtype(kv, "import")
    # Validated before its sizes grow any tensor (the helper pool's import checks it again: a
    # checksum pass, cheap next to growing every layer from an unchecked length).
    info = RecordInfo.of(data)
    for layer, spec in enumerate(info.layers):
        if spec.format is not None and spec.format != name:
            raise InvalidArgumentError(
                f"import: layer {layer} holds {spec.format} rows (quantized, docs/quantized.md), the tensors "
                f"{name}: import it into TorchQuantizedPagedKVPool(cache, {KV_DTYPE_OF_FORMAT[spec.format]!r}) or "
                f"kvcore.PagedKVPool(cache, {spec.format!r})")
        if spec.format is None and name in KV_DTYPE_OF_FORMAT:
            raise InvalidArgumentError(
                f"import: layer {layer} holds {spec.dtype.name} rows, the tensors {name} (quantized, "
                f"docs/quantized.md): import it into a TorchPagedKVPool of {spec.dtype.name}")
    _grow_for(kv, info)
    written = PagedKVPool(kv.cache, name, initial_rows=0).import_sequence(
        seq, data, written=True, trust_tokens=trust_tokens, namespace=namespace
    )
    _write_blocks(kv, info, written)


__all__ = ["export_sequence", "import_sequence"]
