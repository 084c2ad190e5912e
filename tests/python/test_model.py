"""The reference model: incremental decoding through SequenceCache + KVPool equals
full recomputation (the oracle) over a grid of layouts, step sizes, prompt
lengths and rewinds. float32 K/V: max |logit difference| <= 1e-4.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from needs import need

import kvcore
from kvcore_demo.model import Decoder, Model, ModelConfig, rms_norm, rope, visibility_mask

Array = npt.NDArray[Any]
W = 5  # window of every ring layer in the grid
TOL = 1e-4

LAYOUTS = {
    # name: (flat_every, n_layers)
    "all-flat": (1, 2),
    "all-ring": (0, 2),
    "mixed": (3, 3),  # ring, ring, flat
}


def small_model(layout: str, sinks: int = 0, seed: int = 0, **kw: Any) -> Model:
    flat_every, n_layers = LAYOUTS[layout]
    cfg = ModelConfig(
        vocab_size=48,
        d_model=32,
        n_layers=n_layers,
        n_heads=4,
        n_kv_heads=2,
        head_dim=8,
        d_ff=48,
        window=W,
        sinks=sinks,
        flat_every=flat_every,
        seed=seed,
        **kw,
    )
    return Model(cfg)


def greedy_run(model: Model, prompt: list[int], n_new: int, max_step: int, capacity: int = 64) -> tuple[list[int], Array]:
    """Chunked prefill, then greedy decoding; the tokens fed and every logits row."""
    dec = Decoder(model, capacity, max_step, np.float32, initial_capacity=4)
    rows = [dec.feed(prompt)]
    fed = list(prompt)
    for _ in range(n_new):
        nxt = int(np.argmax(rows[-1][-1]))
        rows.append(dec.step([nxt]))
        fed.append(nxt)
    assert dec.length == len(fed)
    return fed, np.concatenate(rows)


GRID = [
    (layout, sinks, max_step, prompt_len)
    for layout in LAYOUTS
    for sinks in ([0] if layout == "all-flat" else [0, 2])
    for max_step in (1, 3, W)
    for prompt_len in (W - 2, 3 * W + 1)  # shorter than the window, and wrapping the ring
]


@pytest.mark.parametrize("layout,sinks,max_step,prompt_len", GRID)
def test_incremental_equals_oracle(layout: str, sinks: int, max_step: int, prompt_len: int) -> None:
    model = small_model(layout, sinks, seed=prompt_len + max_step)
    prompt = np.random.default_rng(prompt_len).integers(0, 48, prompt_len).tolist()
    fed, logits = greedy_run(model, prompt, n_new=2 * W, max_step=max_step)
    oracle = model.forward_full(fed)
    assert logits.shape == oracle.shape == (len(fed), 48)
    assert float(np.abs(logits - oracle).max()) <= TOL


REWINDS = [
    # (layout, sinks, max_step, length before the speculative step, drafts, accepted)
    ("all-ring", 0, 3, 3, 2, 0),  # before the ring wraps (rows = W + C - 1 = 7)
    ("all-ring", 0, 3, 20, 2, 0),  # after it wraps: rewind by 2 = C - 1
    ("all-ring", 2, 3, 20, 2, 1),
    ("mixed", 2, 4, 4, 3, 1),
    ("mixed", 2, 4, 23, 3, 0),  # rewind by 3 after the wrap
    ("mixed", 0, W, 17, W - 1, 2),
    ("all-flat", 0, 3, 20, 2, 0),
]


@pytest.mark.parametrize("layout,sinks,max_step,length,drafts,accepted", REWINDS)
def test_speculative_rewind_equals_never_drafting(
    layout: str, sinks: int, max_step: int, length: int, drafts: int, accepted: int
) -> None:
    model = small_model(layout, sinks, seed=length)
    rng = np.random.default_rng(length)
    tokens = rng.integers(0, 48, length + 8).tolist()
    dec = Decoder(model, 64, max_step, np.float32)
    dec.feed(tokens[:length])
    # One step carrying the next token and `drafts` guesses; keep `accepted` of them.
    guesses = rng.integers(0, 48, drafts).tolist()
    guesses[:accepted] = tokens[length + 1 : length + 1 + accepted]
    dec.step([tokens[length], *guesses])
    keep = length + 1 + accepted
    assert dec.cache.can_rewind(keep)
    dec.rewind(keep)
    # Continue with the true tokens, then compare with the oracle that never drafted.
    rest = dec.feed(tokens[keep:])
    oracle = model.forward_full(tokens)
    assert float(np.abs(rest - oracle[keep:]).max()) <= TOL


def test_rewind_into_the_sinks_after_the_wrap_then_continue() -> None:
    model = small_model("mixed", sinks=2)
    tokens = np.random.default_rng(5).integers(0, 48, 30).tolist()
    dec = Decoder(model, 64, 3, np.float32)
    dec.feed(tokens[:25])
    assert not dec.cache.can_rewind(10)  # the window below 10 was overwritten
    dec.rewind(2)  # positions < S are never evicted
    rest = dec.feed(tokens[2:])
    assert float(np.abs(rest - model.forward_full(tokens)[2:]).max()) <= TOL


def test_the_masks_matter() -> None:
    # The equivalence above is not vacuous: windowed layers give different logits
    # from full attention once the sequence is longer than the window.
    tokens = np.random.default_rng(1).integers(0, 48, 3 * W).tolist()
    ring = small_model("all-ring").forward_full(tokens)
    cfg = small_model("all-ring").config
    # Same weights and rotary base, but every layer flat.
    flat_cfg = dataclasses.replace(cfg, flat_every=1, rope_base_flat=cfg.rope_base_ring)
    flat = Model(flat_cfg).forward_full(tokens)
    assert np.abs(ring[:W] - flat[:W]).max() <= TOL  # every key is inside the window
    assert np.abs(ring[W:] - flat[W:]).max() > 1e-2


@pytest.mark.parametrize("dtype,tol", [(np.float16, 2e-2), ("bfloat16", 5e-2)])
def test_16_bit_pools_match_an_oracle_that_rounds_kv_the_same_way(dtype: Any, tol: float) -> None:
    if dtype == "bfloat16":
        dtype = need("ml_dtypes").bfloat16
    model = small_model("mixed", sinks=1)
    tokens = np.random.default_rng(2).integers(0, 48, 24).tolist()
    dec = Decoder(model, 64, 3, dtype)
    logits = dec.feed(tokens)
    assert float(np.abs(logits - model.forward_full(tokens, kv_dtype=dtype)).max()) <= tol


# --- pieces ----------------------------------------------------------------------


def test_visibility_mask_follows_the_design_rule() -> None:
    # W = 4, S = 2: a query at 10 sees the sinks 0, 1 and its window 7..10.
    mask = visibility_mask(kvcore.Ring(4, 2), np.array([10]), np.arange(12))
    assert np.flatnonzero(mask[0]).tolist() == [0, 1, 7, 8, 9, 10]
    flat = visibility_mask(kvcore.Flat(), np.array([3]), np.arange(6))
    assert np.flatnonzero(flat[0]).tolist() == [0, 1, 2, 3]


def test_rope_is_a_rotation_by_logical_position() -> None:
    x = np.random.default_rng(0).standard_normal((3, 2, 8)).astype(np.float32)
    # Position 0 rotates by angle 0: cos 1 and sin 0 exactly, so x comes back exactly (1e-7 is below
    # float32's spacing at these values, |x| up to 2.3).
    np.testing.assert_allclose(rope(x, np.zeros(3, np.int64), 10_000.0), x, atol=1e-7)
    r = rope(x, np.array([5, 17, 2**20]), 10_000.0)
    # A rotation keeps the norm; float32 rounds each of the 8 products to 2^-24 relative, so 1e-5 is
    # about 100x that.
    np.testing.assert_allclose(np.linalg.norm(r, axis=-1), np.linalg.norm(x, axis=-1), rtol=1e-5)
    # Relative: <rope(q, m), rope(k, n)> depends on m - n only.
    q, k = x[:1], x[1:2]
    a = float((rope(q, np.array([7]), 1e4) * rope(k, np.array([3]), 1e4)).sum())
    b = float((rope(q, np.array([104]), 1e4) * rope(k, np.array([100]), 1e4)).sum())
    assert abs(a - b) < 1e-4


def test_rms_norm_scales_to_unit_rms_times_one_plus_weight() -> None:
    x = np.random.default_rng(0).standard_normal((4, 16)).astype(np.float32) * 3
    w = np.full(16, 0.5, np.float32)
    y = rms_norm(x, w, 1e-6)
    np.testing.assert_allclose(np.sqrt(np.mean(y * y, axis=-1)), 1.5, rtol=1e-5)


def test_weights_come_from_the_seed() -> None:
    a, b, c = small_model("mixed", seed=3), small_model("mixed", seed=3), small_model("mixed", seed=4)
    tokens = [1, 2, 3]
    np.testing.assert_array_equal(a.forward_full(tokens), b.forward_full(tokens))
    assert not np.array_equal(a.forward_full(tokens), c.forward_full(tokens))


def test_forward_from_continues_a_prefix_as_forward_full_computes_it() -> None:
    model = small_model("mixed", sinks=1)
    c = model.config
    tokens = np.random.default_rng(2).integers(0, 48, size=11).tolist()
    keys = [np.zeros((16, c.n_kv_heads, c.head_dim), np.float32) for _ in range(c.n_layers)]
    values = [np.zeros_like(a) for a in keys]
    head = model.forward_from(tokens[:7], 0, keys, values, np.float16)
    tail = model.forward_from(tokens[7:], 7, keys, values, np.float16)
    full = model.forward_full(tokens, kv_dtype=np.float16)
    np.testing.assert_array_equal(head, model.forward_full(tokens[:7], kv_dtype=np.float16))
    assert float(np.abs(head - full[:7]).max()) <= TOL
    assert float(np.abs(tail - full[7:]).max()) <= TOL
    with pytest.raises(ValueError, match="fewer rows"):
        model.forward_from(tokens, 7, keys, values)
    with pytest.raises(ValueError, match="for 3 layers"):
        model.forward_from(tokens[:1], 0, keys[:2], values)
    with pytest.raises(ValueError, match="start = -1"):
        model.forward_from(tokens[:1], -1, keys, values)


def test_layer_pattern_five_ring_one_flat() -> None:
    cfg = ModelConfig(n_layers=12, flat_every=6, window=8, sinks=1)
    assert [cfg.is_flat(i) for i in range(12)] == [False] * 5 + [True] + [False] * 5 + [True]
    assert cfg.policy(0) == kvcore.Ring(8, 1) and cfg.policy(5) == kvcore.Flat()
    cache = kvcore.SequenceCache(cfg.cache_config(64, 4))
    assert cache.n_groups == 2


def test_cache_config_carries_batch_limits() -> None:
    cfg = ModelConfig(n_layers=6, flat_every=3, window=8)
    limits = kvcore.BatchLimits(block_size=4, max_seqs=3)
    cc = cfg.cache_config(40, 5, batch=limits)
    assert (cc.capacity, cc.max_step, cc.batch.block_size, cc.batch.max_seqs) == (40, 5, 4, 3)
    assert [layer.policy for layer in cc.layers] == [cfg.policy(i) for i in range(6)]
    assert cfg.cache_config(40).batch.block_size == kvcore.CacheConfig(40, cc.layers).batch.block_size
    cache = kvcore.BatchCache(cc)
    # 4 ring and 2 flat layers: groups of 2 (page_layers' default, the fewest layers any policy has).
    assert cache.block_size == 4 and cache.n_groups == 3


@pytest.mark.parametrize(
    "kw,message",
    [
        ({"n_heads": 3}, "multiple of n_kv_heads"),
        ({"head_dim": 7}, "must be even"),
        ({"window": 0}, "window = 0"),
        ({"sinks": -1}, "sinks = -1"),
        ({"flat_every": -2}, "flat_every = -2"),
        ({"d_model": 0}, "d_model = 0"),
    ],
)
def test_model_config_rejects_bad_values(kw: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ModelConfig(**kw)


def test_bad_tokens_and_step_size_are_rejected() -> None:
    model = small_model("mixed")
    with pytest.raises(ValueError, match="vocab_size = 48"):
        model.forward_full([0, 48])
    dec = Decoder(model, 16, 3)
    with dec.cache.step(2) as step, pytest.raises(ValueError, match="3 tokens for a step of T = 2"):
        model.forward_step([1, 2, 3], step, dec.pool)
