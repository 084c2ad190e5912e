"""A small Gemma-style decoder in numpy: the model kvcore proves itself on.

Token embedding (scaled by sqrt(d_model)), RMSNorm with (1 + weight), rotary
position embedding at logical positions (one base for ring layers, another for
flat ones, as in Gemma 3), grouped-query attention with q/k norms, a GELU-gated
MLP, and an output head tied to the embedding. Weights are random from a seed.
Each layer is Ring(window, sinks) or Flat(), from a pattern such as 5 ring : 1
flat.

Three paths over the same weights:

- ``Model.forward_full(tokens)``, the oracle: no cache; every layer attends over
  the whole sequence through an explicit mask built from the visibility rule
  (``visibility_mask``, written from docs/design.md, not taken from kvcore);
  ``Model.forward_from`` is the same loop resumed at a position, over K/V
  arrays the caller keeps (the batch demo's incremental oracle);
- ``Model.forward_step(tokens, step, pool)`` through ``SequenceCache`` +
  ``KVPool``: each layer writes its new K/V rows, reads back the rows its plan
  names, and masks with ``step.mask(layer)``. ``Decoder`` drives it (chunked
  prefill in steps of at most ``max_step``, then decode).
- ``Model.forward_batch(tokens, step, pool)`` through ``BatchCache`` +
  ``PagedKVPool``: one step over many sequences; each layer writes the step's
  rows to their slots and attends over the group's live rows with
  ``pool.mask(step, group)`` (``kvcore demo --batch`` drives it).

K and V are stored in the pool's dtype; ``forward_full(..., kv_dtype=...)`` rounds
them the same way, so both paths see the same numbers.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

import kvcore

Array = npt.NDArray[Any]


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Shape of the reference model and its per-layer cache policy."""

    vocab_size: int = 256
    d_model: int = 64
    n_layers: int = 6
    n_heads: int = 4
    n_kv_heads: int = 2
    head_dim: int = 16
    d_ff: int = 128
    #: Ring layers: keys a query sees, counting itself.
    window: int = 16
    #: Ring layers: first positions kept visible forever.
    sinks: int = 0
    #: Layer i is flat when (i + 1) % flat_every == 0: 6 gives Gemma 3's 5 ring : 1
    #: flat, 1 makes every layer flat, 0 makes every layer a ring.
    flat_every: int = 6
    rope_base_ring: float = 10_000.0
    rope_base_flat: float = 1_000_000.0
    norm_eps: float = 1e-6
    seed: int = 0

    def __post_init__(self) -> None:
        positive = ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim", "d_ff", "window")
        for name in positive:
            value = getattr(self, name)
            if value < 1:
                raise ValueError(f"{name} = {value}: must be >= 1")
        if self.n_heads % self.n_kv_heads != 0:
            raise ValueError(
                f"n_heads = {self.n_heads}: must be a multiple of n_kv_heads = {self.n_kv_heads}"
            )
        if self.head_dim % 2 != 0:
            raise ValueError(f"head_dim = {self.head_dim}: must be even (rotary pairs)")
        if self.sinks < 0:
            raise ValueError(f"sinks = {self.sinks}: must be >= 0")
        if self.flat_every < 0:
            raise ValueError(f"flat_every = {self.flat_every}: must be >= 0")

    def is_flat(self, layer: int) -> bool:
        return self.flat_every > 0 and (layer + 1) % self.flat_every == 0

    def policy(self, layer: int) -> kvcore.LayerPolicy:
        return kvcore.Flat() if self.is_flat(layer) else kvcore.Ring(self.window, self.sinks)

    def cache_config(
        self,
        capacity: int,
        max_step: int | None = None,
        initial_capacity: int = 512,
        batch: kvcore.BatchLimits | None = None,
    ) -> kvcore.CacheConfig:
        """A CacheConfig with one LayerConfig per layer of this model (its policy, n_kv_heads, head_dim).

        capacity: largest sequence length (positions); max_step: largest step
        (tokens, default kvcore's); initial_capacity: rows a KVPool allocates
        per flat layer before growing; batch: the limits of a BatchCache built
        from it (default kvcore's). Raises kvcore.InvalidArgumentError when
        kvcore refuses a value.
        """
        layers = [kvcore.LayerConfig(self.policy(i), self.n_kv_heads, self.head_dim) for i in range(self.n_layers)]
        if batch is None:
            return kvcore.CacheConfig(capacity, layers, max_step=max_step, initial_capacity=initial_capacity)
        return kvcore.CacheConfig(
            capacity, layers, max_step=max_step, initial_capacity=initial_capacity, batch=batch
        )


def visibility_mask(policy: kvcore.LayerPolicy, q_positions: Array, k_positions: Array) -> Array:
    """mask[i, j]: may a query at q_positions[i] see the key at k_positions[j]?

    docs/design.md section 2: k <= q, and for a ring layer also q - k < window or
    k < sinks.
    """
    q = np.asarray(q_positions, dtype=np.int64)[:, None]
    k = np.asarray(k_positions, dtype=np.int64)[None, :]
    causal = k <= q
    if not policy.is_ring:
        return causal
    return causal & ((q - k < policy.window) | (k < policy.sinks))


def rms_norm(x: Array, weight: Array, eps: float) -> Array:
    """Gemma's RMSNorm: x / rms(x) * (1 + weight), over the last axis."""
    # np.add.reduce, not np.mean: the same sum with far less Python around it.
    mean_square = np.add.reduce(x * x, axis=-1, keepdims=True) * np.float32(1.0 / x.shape[-1])
    scale = np.float32(1.0) / np.sqrt(mean_square + np.float32(eps))
    out: Array = (x * scale * (np.float32(1.0) + weight)).astype(np.float32)
    return out


def gelu_tanh(x: Array) -> Array:
    c = np.float32(math.sqrt(2.0 / math.pi))
    out: Array = np.float32(0.5) * x * (np.float32(1.0) + np.tanh(c * (x + np.float32(0.044715) * x * x * x)))
    return out


def rope(x: Array, positions: Array, base: float) -> Array:
    """Rotates (T, heads, head_dim) by logical positions (rotate-half pairs)."""
    half = x.shape[-1] // 2
    # float64 angles per position: the same number whichever path computes it.
    angles = np.asarray(positions, dtype=np.float64)[:, None] * _inv_freq(base, x.shape[-1])[None, :]
    cos = np.cos(angles).astype(np.float32)[:, None, :]
    sin = np.sin(angles).astype(np.float32)[:, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    out: Array = np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(np.float32)
    return out


_INV_FREQ: dict[tuple[float, int], Array] = {}


def _inv_freq(base: float, head_dim: int) -> Array:
    """Rotary frequencies, computed once per (base, head_dim)."""
    key = (base, head_dim)
    if key not in _INV_FREQ:
        _INV_FREQ[key] = base ** (-np.arange(0, head_dim // 2, dtype=np.float64) * 2.0 / head_dim)
    return _INV_FREQ[key]


def attention(q: Array, k: Array, v: Array, mask: Array) -> Array:
    """Grouped-query attention. q (T, H, D), k/v (S, Hkv, D), mask (T, S) bool."""
    T, H, D = q.shape
    n_kv = k.shape[1]
    group = H // n_kv
    qg = q.reshape(T, n_kv, group, D)
    scores = np.einsum("tkgd,skd->kgts", qg, k) * np.float32(1.0 / math.sqrt(D))
    scores = np.where(mask[None, None, :, :], scores, np.float32(-np.inf))
    scores = scores - scores.max(axis=-1, keepdims=True)
    weights = np.exp(scores)
    weights /= weights.sum(axis=-1, keepdims=True)
    out = np.einsum("kgts,skd->tkgd", weights, v)
    result: Array = out.reshape(T, H, D).astype(np.float32)
    return result


@dataclasses.dataclass
class LayerWeights:
    input_norm: Array
    wq: Array
    wk: Array
    wv: Array
    q_norm: Array
    k_norm: Array
    wo: Array
    post_attn_norm: Array
    pre_mlp_norm: Array
    w_gate: Array
    w_up: Array
    w_down: Array
    post_mlp_norm: Array


class Model:
    """The reference decoder: random float32 weights from ``config.seed``."""

    def __init__(self, config: ModelConfig) -> None:
        self.config = config
        rng = np.random.default_rng(config.seed)
        c = config

        def normal(*shape: int, scale: float) -> Array:
            return (rng.standard_normal(shape) * scale).astype(np.float32)

        self.embed = normal(c.vocab_size, c.d_model, scale=1.0 / math.sqrt(c.d_model))
        self.final_norm = normal(c.d_model, scale=0.1)
        self.layers: list[LayerWeights] = []
        for _ in range(c.n_layers):
            self.layers.append(
                LayerWeights(
                    input_norm=normal(c.d_model, scale=0.1),
                    wq=normal(c.d_model, c.n_heads * c.head_dim, scale=1.0 / math.sqrt(c.d_model)),
                    wk=normal(c.d_model, c.n_kv_heads * c.head_dim, scale=1.0 / math.sqrt(c.d_model)),
                    wv=normal(c.d_model, c.n_kv_heads * c.head_dim, scale=1.0 / math.sqrt(c.d_model)),
                    q_norm=normal(c.head_dim, scale=0.1),
                    k_norm=normal(c.head_dim, scale=0.1),
                    wo=normal(c.n_heads * c.head_dim, c.d_model, scale=1.0 / math.sqrt(c.n_heads * c.head_dim)),
                    post_attn_norm=normal(c.d_model, scale=0.1),
                    pre_mlp_norm=normal(c.d_model, scale=0.1),
                    w_gate=normal(c.d_model, c.d_ff, scale=1.0 / math.sqrt(c.d_model)),
                    w_up=normal(c.d_model, c.d_ff, scale=1.0 / math.sqrt(c.d_model)),
                    w_down=normal(c.d_ff, c.d_model, scale=1.0 / math.sqrt(c.d_ff)),
                    post_mlp_norm=normal(c.d_model, scale=0.1),
                )
            )

    # -- the two paths ---------------------------------------------------------

    def forward_full(self, tokens: Sequence[int] | Array, kv_dtype: npt.DTypeLike = np.float32) -> Array:
        """Logits (N, vocab) for every position, with no cache (the oracle).

        K and V are rounded through ``kv_dtype``, as a pool of that dtype stores them.
        """
        ids = self._tokens(tokens)
        c = self.config
        keys = [np.empty((len(ids), c.n_kv_heads, c.head_dim), np.float32) for _ in range(c.n_layers)]
        values = [np.empty_like(a) for a in keys]
        return self.forward_from(ids, 0, keys, values, kv_dtype)

    def forward_from(
        self,
        tokens: Sequence[int] | Array,
        start: int,
        keys: Sequence[Array],
        values: Sequence[Array],
        kv_dtype: npt.DTypeLike = np.float32,
    ) -> Array:
        """Logits (len(tokens), vocab) of tokens at positions start.., with no cache: the
        oracle's loop, resumable.

        ``keys[i]`` and ``values[i]`` are float32 arrays (rows, n_kv_heads, head_dim),
        one per layer, whose rows 0..start-1 hold the K/V of the positions before
        (as an earlier call computed them). The new positions' K/V, rounded through
        ``kv_dtype``, are written to rows start..start+len(tokens)-1 and every new
        position attends over rows 0.. itself through ``visibility_mask``.
        ``forward_full(tokens)`` is ``forward_from(tokens, 0, ...)``; continuing a
        prefix this way gives the same numbers as recomputing it whole.
        Raises ValueError on a token outside the vocabulary, a negative start, or
        stores that are not one per layer or have fewer than start + len(tokens) rows.
        """
        ids = self._tokens(tokens)
        c = self.config
        end = start + len(ids)
        if start < 0:
            raise ValueError(f"start = {start}: must be >= 0")
        if len(keys) != c.n_layers or len(values) != c.n_layers:
            raise ValueError(f"{len(keys)} key and {len(values)} value stores for {c.n_layers} layers")
        if any(len(a) < end for a in (*keys, *values)):
            raise ValueError(f"positions up to {end}: a K/V store has fewer rows")
        positions = np.arange(start, end, dtype=np.int64)
        history = np.arange(end, dtype=np.int64)
        h = self._embed(ids)
        for i, w in enumerate(self.layers):
            q, k, v = self._qkv(i, w, h, positions)
            keys[i][start:end] = _round_trip(k, kv_dtype)
            values[i][start:end] = _round_trip(v, kv_dtype)
            mask = visibility_mask(c.policy(i), positions, history)
            h = self._finish_layer(w, h, attention(q, keys[i][:end], values[i][:end], mask))
        return self._logits(h)

    def forward_step(self, tokens: Sequence[int] | Array, step: kvcore.Step, pool: kvcore.KVPool) -> Array:
        """Logits (T, vocab) for the step's tokens, through the cache and the pool (a
        draft-tree step too: token i is node i of the tree)."""
        ids = self._tokens(tokens)
        if len(ids) != step.T:
            raise ValueError(f"{len(ids)} tokens for a step of T = {step.T}")
        # A draft tree's tokens stand at length + depth (docs/trees.md).
        positions = step.positions if step.is_tree else np.arange(step.position, step.end, dtype=np.int64)
        h = self._embed(ids)
        for i, w in enumerate(self.layers):
            q, k, v = self._qkv(i, w, h, positions)
            keys, values, _ = pool.update(i, step, k.astype(pool.dtype), v.astype(pool.dtype))
            mask = step.mask(i)
            attn = attention(q, keys.astype(np.float32), values.astype(np.float32), mask)
            h = self._finish_layer(w, h, attn)
        return self._logits(h)

    def forward_batch(
        self, tokens: Sequence[int] | Array, step: kvcore.BatchStep, pool: kvcore.PagedKVPool
    ) -> Array:
        """Logits (n_tokens, vocab) for a many-sequence step, through a BatchCache and its pool.

        ``tokens`` are the step's new tokens laid out entry after entry, as in
        ``begin_step``; each is embedded and rotated at its own sequence's position
        (the plan's ``positions``). Per layer: ``pool.update`` writes the step's K/V
        rows and returns the group's live rows, and attention over them uses
        ``pool.mask(step, group)``, which hides every row that is not a visible
        position of the token's own sequence. Each row of the result is therefore
        that token's logits in its own sequence alone.
        """
        ids = self._tokens(tokens)
        if len(ids) != step.n_tokens:
            raise ValueError(f"{len(ids)} tokens for a step of n_tokens = {step.n_tokens}")
        positions = np.asarray(step.plan().positions, dtype=np.int64)
        cache = pool.cache
        h = self._embed(ids)
        for i, w in enumerate(self.layers):
            q, k, v = self._qkv(i, w, h, positions)
            keys, values = pool.update(i, step, k.astype(pool.dtype), v.astype(pool.dtype))
            mask = pool.mask(step, cache.group_of(i))
            attn = attention(q, np.asarray(keys, np.float32), np.asarray(values, np.float32), mask)
            h = self._finish_layer(w, h, attn)
        return self._logits(h)

    # -- pieces ----------------------------------------------------------------

    def _tokens(self, tokens: Sequence[int] | Array) -> Array:
        ids = np.asarray(tokens, dtype=np.int64).reshape(-1)
        if ids.size and (ids.min() < 0 or ids.max() >= self.config.vocab_size):
            raise ValueError(f"token ids must be in [0, vocab_size = {self.config.vocab_size})")
        return ids

    def _embed(self, ids: Array) -> Array:
        out: Array = self.embed[ids] * np.float32(math.sqrt(self.config.d_model))
        return out

    def _qkv(self, i: int, w: LayerWeights, h: Array, positions: Array) -> tuple[Array, Array, Array]:
        c = self.config
        x = rms_norm(h, w.input_norm, c.norm_eps)
        T = x.shape[0]
        q = rms_norm((x @ w.wq).reshape(T, c.n_heads, c.head_dim), w.q_norm, c.norm_eps)
        k = rms_norm((x @ w.wk).reshape(T, c.n_kv_heads, c.head_dim), w.k_norm, c.norm_eps)
        v = (x @ w.wv).reshape(T, c.n_kv_heads, c.head_dim)
        base = c.rope_base_flat if c.is_flat(i) else c.rope_base_ring
        return rope(q, positions, base), rope(k, positions, base), np.ascontiguousarray(v)

    def _finish_layer(self, w: LayerWeights, h: Array, attn: Array) -> Array:
        c = self.config
        o = attn.reshape(attn.shape[0], -1) @ w.wo
        h = h + rms_norm(o, w.post_attn_norm, c.norm_eps)
        x = rms_norm(h, w.pre_mlp_norm, c.norm_eps)
        m = (gelu_tanh(x @ w.w_gate) * (x @ w.w_up)) @ w.w_down
        out: Array = h + rms_norm(m, w.post_mlp_norm, c.norm_eps)
        return out

    def _logits(self, h: Array) -> Array:
        out: Array = rms_norm(h, self.final_norm, self.config.norm_eps) @ self.embed.T
        return out


def _round_trip(x: Array, dtype: npt.DTypeLike) -> Array:
    out: Array = x.astype(dtype).astype(np.float32)
    return out


class Decoder:
    """Runs a Model incrementally through its own SequenceCache and KVPool."""

    def __init__(
        self,
        model: Model,
        capacity: int,
        max_step: int | None = None,
        dtype: npt.DTypeLike = np.float32,
        initial_capacity: int = 512,
    ) -> None:
        self.model = model
        self.cache = kvcore.SequenceCache(model.config.cache_config(capacity, max_step, initial_capacity))
        self.pool = kvcore.KVPool(self.cache, dtype)

    @property
    def length(self) -> int:
        return self.cache.length

    def step(self, tokens: Sequence[int] | Array) -> Array:
        """One step of len(tokens) <= max_step tokens, committed; its logits (T, vocab)."""
        ids = np.asarray(tokens, dtype=np.int64).reshape(-1)
        with self.cache.step(len(ids)) as step:
            return self.model.forward_step(ids, step, self.pool)

    def feed(self, tokens: Sequence[int] | Array) -> Array:
        """Feeds tokens in steps of at most max_step; logits for every one of them."""
        ids = np.asarray(tokens, dtype=np.int64).reshape(-1)
        C = self.cache.max_step
        chunks = [self.step(ids[i : i + C]) for i in range(0, len(ids), C)]
        if not chunks:
            return np.zeros((0, self.model.config.vocab_size), dtype=np.float32)
        return np.concatenate(chunks, axis=0)

    def rewind(self, n: int) -> None:
        self.cache.rewind(n)
