"""A flat model's record cut into full blocks and put back together (docs/tier.md, "Per-block
storage"). ``BlockLayout`` is what every block of one model shares: the record's version,
``max_step`` and layer table (less the fields that depend on the length) and each layer's row
bytes. ``BlockLayout.split`` cuts a validated record's full blocks into one ``bytes`` each (the
block's token ids, then per flat layer its K rows and its V rows); ``BlockLayout.assemble``
writes the record of a run of blocks 0..n-1 (the format of docs/state.md, sealed by the core's
checksum), which the pool's import then checks as it checks any record. Only records whose
every layer is Flat, or Shared with a Flat source, are cut: any full-block prefix of theirs is a
complete record (a ring's or chunked layer's window and a State layer's state are carried at the
record's length only)."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import numpy.typing as npt

from kvcore._core import seal_record
from kvcore.state import RecordInfo

_HEADER = struct.Struct("<8sIIQIiiiiiII8x")  # docs/state.md, "The record, field by field"
_MAGIC = b"KVCSEQ\x00\x01"
_LAYER_BYTES = 40
_BOUNDS = struct.Struct("<iii")  # a layer entry's sink_end, held_from, n_rows
_BOUNDS_AT = 24
_ALIGN = 64
_TRAILER = 8


def _padded(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


class BlockLayout:
    """The shared shape of one model's blocks, read from a validated flat record (`info`, its
    bytes `data`) in blocks of `block` tokens. ``signature`` identifies it (two records of one
    model and block size give equal ones); ``block_bytes`` is one block's stored bytes."""

    __slots__ = ("block", "version", "max_step", "table", "flat", "k_bytes", "v_bytes", "block_bytes", "signature")

    def __init__(self, info: RecordInfo, data: Any, block: int) -> None:
        view = memoryview(data).cast("B")
        at = _HEADER.size + 8 * len(info.holes) + 4 * len(info.tokens)
        table = bytearray(view[at : at + _LAYER_BYTES * len(info.layers)])
        for i in range(len(info.layers)):
            _BOUNDS.pack_into(table, i * _LAYER_BYTES + _BOUNDS_AT, 0, 0, 0)
        self.block = block
        self.version = info.version
        self.max_step = info.max_step
        self.table = bytes(table)
        self.flat = [layer.kind == "flat" for layer in info.layers]
        self.k_bytes = [layer.row_bytes(layer.head_dim) if f else 0 for layer, f in zip(info.layers, self.flat)]
        self.v_bytes = [layer.row_bytes(layer.value_dim) if f else 0 for layer, f in zip(info.layers, self.flat)]
        self.block_bytes = block * (4 + sum(self.k_bytes) + sum(self.v_bytes))
        self.signature = struct.pack("<III", block, info.version, info.max_step) + self.table

    def split(self, info: RecordInfo, first: int, end: int) -> list[bytes]:
        """Full blocks [first, end) of the validated record `info` (of this layout), one bytes
        object each: the block's token ids (int32), then per flat layer its K rows and V rows."""
        b, n = self.block, end - first
        if n <= 0:
            return []
        lo, hi = first * b, end * b
        parts: list[npt.NDArray[np.uint8]] = [
            np.ascontiguousarray(np.asarray(info.tokens[lo:hi], dtype="<i4")).view(np.uint8).reshape(n, 4 * b)]
        for i, layer in enumerate(info.layers):
            if not self.flat[i]:
                continue
            for offset, row in ((layer.k_offset, self.k_bytes[i]), (layer.v_offset, self.v_bytes[i])):
                rows = np.frombuffer(info.data, dtype=np.uint8, count=hi * row, offset=offset)
                parts.append(rows[lo * row :].reshape(n, b * row))
        blocks = np.concatenate(parts, axis=1)
        return [row.tobytes() for row in blocks]

    def assemble(self, blocks: list[bytes]) -> npt.NDArray[np.uint8]:
        """The record of a sequence of len(blocks) full blocks (blocks 0..n-1 of one prefix, in
        order): length n x block, every token id, every flat layer's rows, a Shared layer's none;
        sealed with the checksum. A numpy uint8 array (a bytes-like record)."""
        n, b = len(blocks), self.block
        length = n * b
        n_layers = len(self.flat)
        at = _HEADER.size + 4 * length
        rows_at = _padded(at + _LAYER_BYTES * n_layers)
        offsets = []
        for k, v in zip(self.k_bytes, self.v_bytes):
            offsets.append((rows_at, rows_at + _padded(length * k)))
            rows_at += _padded(length * k) + _padded(length * v)
        total = rows_at + _TRAILER
        out = np.zeros(total, np.uint8)
        _HEADER.pack_into(out.data, 0, _MAGIC, self.version, _HEADER.size, total, n_layers, length, self.max_step,
                          0, 0, length, 0, _LAYER_BYTES)
        table = bytearray(self.table)
        for i, flat in enumerate(self.flat):
            # A flat layer carries every position (sink_end = held_from = 0); a shared one none.
            _BOUNDS.pack_into(table, i * _LAYER_BYTES + _BOUNDS_AT, 0, 0 if flat else length, length if flat else 0)
        out[at : at + len(table)] = np.frombuffer(bytes(table), np.uint8)
        if n:
            data = np.frombuffer(b"".join(blocks), np.uint8).reshape(n, self.block_bytes)
            out[_HEADER.size : at] = data[:, : 4 * b].reshape(-1)
            col = 4 * b
            for i, (k_at, v_at) in enumerate(offsets):
                for start, row in ((k_at, self.k_bytes[i]), (v_at, self.v_bytes[i])):
                    if row:
                        out[start : start + length * row] = data[:, col : col + b * row].reshape(-1)
                        col += b * row
        seal_record(out)
        return out
