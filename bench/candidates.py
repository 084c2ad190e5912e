"""The KV caches compare.py measures, behind one interface.

Every candidate manages the K/V of a whole layer stack: ``step(position, k, v)``
writes one step's new rows into every layer and obtains the history each layer
attends over, the way a model forward calls its cache. Inputs come from
``prepare``: per layer, the (T, n_kv_heads, head_dim) numpy arrays in the form the
candidate takes (converted outside any timing, as a model's projections would
hand them over). The transformers caches are driven
exactly as a model forward drives them: ``cache.update(k, v, layer_idx)`` on
[batch, heads, T, dim] tensors, with layer classes chosen by transformers from a
Gemma3TextConfig (DynamicSlidingWindowLayer / StaticSlidingWindowLayer for its
sliding layers).

``check=True`` makes ``step`` return, per layer, the logical positions and the K
and V rows it returned, so compare.py can prove each candidate hands attention
the same history (timing runs skip that work).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np

import kvcore

Arrays = Sequence[np.ndarray]
# Per layer: (positions, k rows, v rows) in the order the candidate returned them.
Returned = list[tuple[np.ndarray, np.ndarray, np.ndarray]]


@dataclass(frozen=True)
class Shape:
    """A Gemma-3-style layer stack: layer i is full-attention when (i + 1) % pattern == 0."""

    n_layers: int = 26
    n_kv_heads: int = 1
    head_dim: int = 256
    window: int = 512
    pattern: int = 6
    max_step: int = 512
    dtype: str = "float16"

    def hf_config(self) -> Any:
        """transformers' own config for this shape: its layer_types decide which layers slide."""
        import transformers

        return transformers.Gemma3TextConfig(
            num_hidden_layers=self.n_layers, num_key_value_heads=self.n_kv_heads, head_dim=self.head_dim,
            sliding_window=self.window, sliding_window_pattern=self.pattern, num_attention_heads=self.n_kv_heads,
            hidden_size=64, intermediate_size=64, vocab_size=16, max_position_embeddings=1 << 20,
        )  # fmt: skip

    def sliding(self) -> list[bool]:
        return [t == "sliding_attention" for t in self.hf_config().layer_types]

    def needed(self, layer_sliding: bool, position: int, T: int) -> np.ndarray:
        """Positions a step's queries may see (DESIGN.md, section 2), the reference for --check."""
        low = max(0, position - self.window + 1) if layer_sliding else 0
        return np.arange(low, position + T)

    def row_bytes(self) -> int:
        """Bytes of one K row plus one V row of one layer."""
        return 2 * self.n_kv_heads * self.head_dim * np.dtype(self.dtype).itemsize


class Candidate:
    """One cache under test."""

    name = ""
    label = ""

    def __init__(self, shape: Shape, capacity: int) -> None:
        """A cache for `shape` holding positions [0, capacity)."""

    def prepare(self, arrays: Arrays) -> Sequence[Any]:
        """Per-layer inputs in the form step() takes (numpy by default)."""
        return arrays

    def step(self, position: int, k: Arrays, v: Arrays, check: bool = False) -> Optional[Returned]:
        raise NotImplementedError

    def held_bytes(self) -> int:
        """Bytes of K/V storage the cache keeps alive now."""
        raise NotImplementedError


class KVCorePool(Candidate):
    """kvcore: one SequenceCache, one numpy KVPool, ``pool.update`` per layer (the
    default: the held rows in row order, a view, with their positions)."""

    name = "kvcore"
    label = "kvcore KVPool.update"

    mirror_rings = False
    order = "rows"

    def __init__(self, shape: Shape, capacity: int) -> None:
        layers = [
            kvcore.LayerConfig(kvcore.Ring(shape.window) if s else kvcore.Flat(), shape.n_kv_heads, shape.head_dim)
            for s in shape.sliding()
        ]
        # Storage sized once, like StaticCache: no growth inside a measurement.
        config = kvcore.CacheConfig(capacity, layers, max_step=shape.max_step, initial_capacity=capacity)
        self.cache = kvcore.SequenceCache(config)
        self.pool = kvcore.KVPool(self.cache, np.dtype(shape.dtype), mirror_rings=self.mirror_rings)
        self.n_layers = shape.n_layers

    def step(self, position: int, k: Arrays, v: Arrays, check: bool = False) -> Optional[Returned]:
        s = self.cache.begin_step(len(k[0]))
        update = self.pool.update
        if check:
            out: Returned = []
            for layer in range(self.n_layers):
                keys, values, positions = update(layer, s, k[layer], v[layer], order=self.order)
                out.append((np.asarray(positions), np.array(keys), np.array(values)))
            s.commit()
            return out
        order = self.order
        for layer in range(self.n_layers):
            update(layer, s, k[layer], v[layer], order=order)
        s.commit()
        return None

    def held_bytes(self) -> int:
        return int(self.pool.reserved_bytes)


class KVCorePositions(KVCorePool):
    """kvcore with order="positions": the read in increasing positions, a wrapped
    ring window gathered into one copy (the default before row-order reads)."""

    name = "kvcore-positions"
    label = "kvcore KVPool.update, order='positions'"
    order = "positions"


class KVCoreMirrored(KVCorePool):
    """kvcore with mirror_rings=True and position order: a ring window that wraps
    is a view, never a copy, for R - 1 more rows per ring layer."""

    name = "kvcore-mirror"
    order = "positions"
    label = "kvcore KVPool.update, mirror_rings"
    mirror_rings = True


def _to_torch(a: np.ndarray) -> Any:
    """(T, heads, dim) numpy -> [1, heads, T, dim] torch sharing memory (what attention hands a cache)."""
    import torch

    return torch.from_numpy(a).permute(1, 0, 2).unsqueeze(0)


def _storage_bytes(tensors: list[Any]) -> int:
    """Bytes of the distinct storages behind `tensors` (a sliced view keeps its whole storage alive)."""
    seen: dict[int, int] = {}
    for t in tensors:
        if t is not None and t.numel() > 0:
            storage = t.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def _rows(t: Any, n: int) -> np.ndarray:
    """The first n rows of a [1, heads, rows, dim] tensor as a (n, heads, dim) numpy copy."""
    return np.array(t[0, :, :n, :].permute(1, 0, 2).numpy())


class TorchCache(Candidate):
    """A transformers Cache driven as a model forward drives it: cache.update(k, v, layer_idx)."""

    def __init__(self, shape: Shape, cache: Any) -> None:
        self.shape = shape
        self.cache = cache

    def prepare(self, arrays: Arrays) -> Sequence[Any]:
        return [_to_torch(a) for a in arrays]

    def step(self, position: int, k: Arrays, v: Arrays, check: bool = False) -> Optional[Returned]:
        update = self.cache.update
        if not check:
            for layer in range(self.shape.n_layers):
                update(k[layer], v[layer], layer)
            return None
        T = k[0].shape[-2]
        out: Returned = []
        for layer in range(self.shape.n_layers):
            # transformers sizes the mask before the forward: returned row r is position offset + r.
            length, offset = self.cache.get_mask_sizes(T, layer)
            keys, values = update(k[layer], v[layer], layer)
            rows = min(int(length), keys.shape[-2])
            positions = np.arange(int(offset), int(offset) + rows)
            out.append((positions, _rows(keys, rows), _rows(values, rows)))
        return out

    def held_bytes(self) -> int:
        tensors = []
        for layer in self.cache.layers:
            tensors += [getattr(layer, "keys", None), getattr(layer, "values", None)]
        return _storage_bytes(tensors)


class Dynamic(TorchCache):
    name = "dynamic"
    label = "transformers DynamicCache"

    def __init__(self, shape: Shape, capacity: int) -> None:
        from transformers import DynamicCache

        super().__init__(shape, DynamicCache(config=shape.hf_config()))


class Static(TorchCache):
    name = "static"
    label = "transformers StaticCache"

    def __init__(self, shape: Shape, capacity: int) -> None:
        from transformers import StaticCache

        super().__init__(shape, StaticCache(config=shape.hf_config(), max_cache_len=capacity))


class KVCoreTransformers(TorchCache):
    """kvcore's transformers integration (kvcore.integrations.transformers.KVCoreCache), torch tensors."""

    name = "kvcore-hf"
    label = "kvcore KVCoreCache (transformers)"

    def __init__(self, shape: Shape, capacity: int) -> None:
        from kvcore.integrations.transformers import KVCoreCache

        cache = KVCoreCache(shape.hf_config(), max_step=shape.max_step, capacity=capacity, initial_capacity=capacity)
        super().__init__(shape, cache)

    def held_bytes(self) -> int:
        return int(self.cache.nbytes() + self.cache.pool.workspace_nbytes)


class NumpyPrealloc(Candidate):
    """The naive best case: one preallocated buffer per layer, history as a zero-copy slice."""

    name = "numpy"
    label = "numpy preallocated buffer"

    def __init__(self, shape: Shape, capacity: int) -> None:
        rows = (capacity, shape.n_kv_heads, shape.head_dim)
        self.k = [np.zeros(rows, shape.dtype) for _ in range(shape.n_layers)]
        self.v = [np.zeros(rows, shape.dtype) for _ in range(shape.n_layers)]
        self.window = [shape.window if s else 0 for s in shape.sliding()]

    def step(self, position: int, k: Arrays, v: Arrays, check: bool = False) -> Optional[Returned]:
        end = position + len(k[0])
        out: Returned = []
        for layer, window in enumerate(self.window):
            kb, vb = self.k[layer], self.v[layer]
            kb[position:end] = k[layer]
            vb[position:end] = v[layer]
            low = max(0, position - window + 1) if window else 0
            keys, values = kb[low:end], vb[low:end]
            if check:
                out.append((np.arange(low, end), keys.copy(), values.copy()))
        return out if check else None

    def held_bytes(self) -> int:
        return sum(a.nbytes for a in self.k + self.v)


class CopyFloor(Candidate):
    """The floor: only the raw copy of the step's new K/V bytes into preallocated rows, per layer."""

    name = "floor"
    label = "copy of the new bytes (floor)"

    def __init__(self, shape: Shape, capacity: int) -> None:
        self.shape = shape
        # Destinations per step size T, made once: the timed loop only copies.
        self._dst: dict[int, tuple[list[np.ndarray], list[np.ndarray]]] = {}

    def step(self, position: int, k: Arrays, v: Arrays, check: bool = False) -> Optional[Returned]:
        dst = self._dst.get(len(k[0]))
        if dst is None:
            rows = (len(k[0]), self.shape.n_kv_heads, self.shape.head_dim)
            dst = self._dst[len(k[0])] = (
                [np.zeros(rows, self.shape.dtype) for _ in range(self.shape.n_layers)],
                [np.zeros(rows, self.shape.dtype) for _ in range(self.shape.n_layers)],
            )
        k_dst, v_dst = dst
        # `dst[...] = src` is numpy's cheapest copy call (np.copyto costs more per call).
        for layer in range(len(k_dst)):
            k_dst[layer][...] = k[layer]
            v_dst[layer][...] = v[layer]
        return None

    def held_bytes(self) -> int:
        return 0


CANDIDATES: dict[str, type[Candidate]] = {
    c.name: c
    for c in (KVCorePool, KVCorePositions, KVCoreMirrored, KVCoreTransformers, Dynamic, Static, NumpyPrealloc, CopyFloor)
}
# Candidates that hold a cache (the floor does not), for memory and --check.
CACHES = [name for name in CANDIDATES if name != "floor"]
