"""KVCoreCache against transformers' own DynamicCache on tiny random Gemma models.

Models are built from configs only (no download): window 8, mixed layer_types,
eager attention, float32. The reference is what transformers computes with its
default cache (or with no cache at all, for sinks and rewinds); the kvcore-backed
cache must give the same tokens and logits within 1e-5.
"""

from __future__ import annotations

import copy
from functools import partial
from typing import Any

import pytest
from needs import need

torch = need("torch", reason="the transformers integration needs torch")
transformers = need("transformers", reason="the transformers integration needs transformers")

import kvcore  # noqa: E402
from kvcore.integrations import transformers as kvt  # noqa: E402
from kvcore.integrations.transformers import KVCoreCache, prefill  # noqa: E402
from hf_generate import greedy, max_diff, model_fixture, random_prompt  # noqa: E402

WINDOW = 8
VOCAB = 256
TOL = 1e-5
S, F = "sliding_attention", "full_attention"


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def gemma2(seed: int = 0, layer_types: tuple[str, ...] = (S, F, S, S), **overrides: Any) -> Any:
    torch.manual_seed(seed)
    cfg = transformers.Gemma2Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=len(layer_types),
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=WINDOW,
        layer_types=list(layer_types), max_position_embeddings=256, attn_implementation="eager",
        initializer_range=0.02, final_logit_softcapping=None, **overrides,
    )  # fmt: skip
    return transformers.Gemma2ForCausalLM(cfg).eval()


def gemma3(seed: int = 0, attn: str = "eager", **overrides: Any) -> Any:
    torch.manual_seed(seed)
    cfg = transformers.Gemma3TextConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=WINDOW,
        layer_types=[S, S, F, S], max_position_embeddings=256, attn_implementation=attn,
        initializer_range=0.02, **overrides,
    )  # fmt: skip
    return transformers.Gemma3ForCausalLM(cfg).eval()


MODELS = {"gemma2": gemma2, "gemma3": gemma3}


model = model_fixture(MODELS)
prompt = partial(random_prompt, vocab=VOCAB)


# --- generate() ----------------------------------------------------------------------


@pytest.mark.parametrize("mirror", [True, False], ids=["mirrored", "compact"])
@pytest.mark.parametrize(
    ("prompt_len", "max_step", "chunk"),
    [(5, 16, None), (13, 16, None), (21, 8, 8), (21, 4, 4)],
    ids=["prompt-shorter-than-window", "prompt-longer-than-window", "chunked-prefill-8", "chunked-prefill-4"],
)
def test_generate_matches_dynamic_cache(
    model: Any, prompt_len: int, max_step: int, chunk: int | None, mirror: bool
) -> None:
    ids = prompt(prompt_len)
    ref = greedy(model, ids, 40)
    cache = KVCoreCache(model.config, max_step=max_step, mirror_rings=mirror)
    kwargs = {} if chunk is None else {"prefill_chunk_size": chunk}
    out = greedy(model, ids, 40, cache=cache, **kwargs)
    assert torch.equal(out.sequences, ref.sequences)
    assert max_diff(out.logits, ref.logits) <= TOL
    assert len(set(ref.sequences[0, prompt_len:].tolist())) > 3  # the model does not just repeat one token
    assert cache.get_seq_length() == ref.sequences.shape[1] - 1  # the last token is never fed back
    # The windows wrapped round the ring: compact rings gathered them, mirrored rings returned views.
    assert cache.get_seq_length() > cache.rows(model.config.layer_types.index(S)) + 1
    assert (cache.pool.workspace_nbytes == 0) == mirror


def test_generate_with_sdpa_attention_matches_dynamic_cache() -> None:
    model = gemma3(attn="sdpa")  # Gemma 3: no logit soft-capping, which sdpa refuses
    ids = prompt(13)
    ref = greedy(model, ids, 30)
    out = greedy(model, ids, 30, cache=KVCoreCache(model.config, max_step=4), prefill_chunk_size=4)
    assert torch.equal(out.sequences, ref.sequences) and max_diff(out.logits, ref.logits) <= TOL


def test_generate_batch_with_left_padding_and_beams(model: Any) -> None:
    ids = prompt(10, batch=2)
    mask = torch.ones_like(ids)
    ids[0, :3], mask[0, :3] = 0, 0
    ref = greedy(model, ids, 20, attention_mask=mask)
    out = greedy(model, ids, 20, attention_mask=mask, cache=KVCoreCache(model.config, max_step=16))
    assert torch.equal(out.sequences, ref.sequences) and max_diff(out.logits, ref.logits) <= TOL
    # Beam search reorders the cache's batch rows every step.
    ref = greedy(model, ids[1:], 20, num_beams=3)
    out = greedy(model, ids[1:], 20, num_beams=3, cache=KVCoreCache(model.config, max_step=16))
    assert torch.equal(out.sequences, ref.sequences)


def test_reset_cache_is_reused_for_a_new_sequence(model: Any) -> None:
    cache = KVCoreCache(model.config, max_step=16)
    greedy(model, prompt(9, seed=3), 20, cache=cache)
    cache.reset()
    assert cache.get_seq_length() == 0
    ids = prompt(11, seed=4, batch=2)  # another batch size: the pool is re-laid at position 0
    assert torch.equal(greedy(model, ids, 20, cache=cache).sequences, greedy(model, ids, 20).sequences)


# --- a manual forward loop ---------------------------------------------------------------


def test_manual_loop_logits_match_dynamic_cache_step_by_step(model: Any) -> None:
    kw = kvt.cache_keyword(model)
    assert kw == "cache"  # transformers 5.24 renamed past_key_values
    ids = prompt(19)
    ours = KVCoreCache(model.config, max_step=4)
    theirs = transformers.DynamicCache(config=model.config)
    with torch.no_grad():
        out = prefill(model, ours, ids)  # chunks of 4, 4, 4, 4, 3
        ref = None
        for start in range(0, 19, 4):
            ref = model(input_ids=ids[:, start : start + 4], use_cache=True, **{kw: theirs})
        assert ref is not None
        assert float((out.logits - ref.logits).abs().max()) <= TOL
        token = ref.logits[:, -1:].argmax(-1)
        for _ in range(30):
            out = model(input_ids=token, use_cache=True, **{kw: ours})
            ref = model(input_ids=token, use_cache=True, **{kw: theirs})
            assert float((out.logits - ref.logits).abs().max()) <= TOL
            token = ref.logits[:, -1:].argmax(-1)
    assert ours.get_seq_length() == theirs.get_seq_length() == 49


def test_interrupted_forward_changes_nothing_and_the_retry_is_exact(model: Any) -> None:
    ids = prompt(17)
    cache = KVCoreCache(model.config, max_step=4)
    with torch.no_grad():
        prefill(model, cache, ids[:, :16])

        def fail(*_: Any) -> None:
            raise RuntimeError("interrupted")

        hook = model.model.layers[2].register_forward_pre_hook(fail)
        try:
            with pytest.raises(RuntimeError, match="interrupted"):
                prefill(model, cache, ids[:, 16:])
        finally:
            hook.remove()
        assert cache.get_seq_length() == 16  # layers 0 and 1 wrote, nothing committed
        out = prefill(model, cache, ids[:, 16:])
        ref = model(input_ids=ids, use_cache=False)
    assert float((out.logits[:, -1] - ref.logits[:, -1]).abs().max()) <= TOL


def test_a_different_forward_after_an_interrupted_one_needs_discard_forward(model: Any) -> None:
    ids = prompt(20)
    cache = KVCoreCache(model.config, max_step=4)
    with torch.no_grad():
        prefill(model, cache, ids[:, :16])
        hook = model.model.layers[2].register_forward_pre_hook(lambda *_: (_ for _ in ()).throw(RuntimeError("boom")))
        try:
            with pytest.raises(RuntimeError, match="boom"):
                prefill(model, cache, ids[:, 16:19])  # T = 3, stops after layers 0 and 1
        finally:
            hook.remove()
        with pytest.raises(kvcore.InvalidStateError, match="updated layers 0..1 of this cache's 4 and stopped"):
            prefill(model, cache, ids[:, 16:17])  # T = 1: not the retry
        assert cache.get_seq_length() == 16
        cache.discard_forward()
        out = prefill(model, cache, ids[:, 16:17])
        ref = model(input_ids=ids[:, :17], use_cache=False)
    assert cache.get_seq_length() == 17
    assert float((out.logits[:, -1] - ref.logits[:, -1]).abs().max()) <= TOL


@pytest.mark.parametrize("prompt_len", [1, 6])
def test_a_model_with_fewer_layers_than_the_cache_is_detected_at_the_next_forward(prompt_len: int) -> None:
    # The cache is built for 4 layers, the model runs 3: no step would ever commit.
    cache = KVCoreCache(gemma2().config, max_step=8)
    small = gemma2(layer_types=(S, F, S))
    with pytest.raises(kvcore.InvalidStateError, match="updated layers 0..2 of this cache's 4 and stopped.*3 layers"):
        greedy(small, prompt(prompt_len), 4, cache=cache)
    assert cache.get_seq_length() == 0


# --- copies ---------------------------------------------------------------------------


def test_deepcopy_continues_identically_and_independently(model: Any) -> None:
    # transformers' prompt-reuse recipe: prefill a shared prompt once, deep-copy the cache per continuation.
    ids = prompt(30)
    shared = KVCoreCache(model.config, max_step=16)
    reference = transformers.DynamicCache(config=model.config)
    with torch.no_grad():
        prefill(model, shared, ids[:, :12])
        model(input_ids=ids[:, :12], cache=reference)
        for suffix in (ids[:, 12:20], ids[:, 20:30]):
            ours = copy.deepcopy(shared)
            theirs = copy.deepcopy(reference)
            assert ours.sequence is not shared.sequence and ours.get_seq_length() == 12
            full = torch.cat([ids[:, :12], suffix], dim=1)
            got = greedy(model, full, 5, cache=ours)
            want = greedy(model, full, 5, cache=theirs)
            assert torch.equal(got.sequences, want.sequences)
            assert max_diff(got.logits, want.logits) <= TOL
        assert shared.get_seq_length() == 12  # the shared prompt's cache is untouched
        out = prefill(model, shared, ids[:, 12:13])
        ref = model(input_ids=ids[:, :13], use_cache=False)
    assert float((out.logits[:, -1] - ref.logits[:, -1]).abs().max()) <= TOL


# --- speculative decoding and rewinds ------------------------------------------------


class RecordingCache(KVCoreCache):
    """Records (length before, tokens removed) of every non-empty crop."""

    crops: list[tuple[int, int]]

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove < 0:
            self.crops = [*getattr(self, "crops", []), (self.get_seq_length(), -tokens_to_remove)]
        super().crop(tokens_to_remove)


@pytest.mark.parametrize("drafter", ["assistant-model", "prompt-lookup"])
def test_speculative_generation_equals_plain_greedy(model: Any, drafter: str) -> None:
    ids = prompt(13)
    if drafter == "assistant-model":
        draft = gemma2(seed=5, layer_types=(S, F))  # a different, smaller model
        draft.generation_config.num_assistant_tokens = 3
        draft.generation_config.num_assistant_tokens_schedule = "constant"
        kwargs: dict[str, Any] = {"assistant_model": draft}
    else:
        ids = torch.cat([ids, ids[:, :6], ids[:, 2:9]], dim=1)  # repeats give n-gram matches
        kwargs = {"prompt_lookup_num_tokens": 3}
    ref = greedy(model, ids, 40)
    # The first verify forward carries the prompt and the drafts.
    cache = RecordingCache(model.config, max_step=ids.shape[1] + 3)
    out = greedy(model, ids, 40, cache=cache, **kwargs)
    assert torch.equal(out.sequences, ref.sequences)
    # Rejected drafts were rolled back after the sliding rows had wrapped.
    rows = cache.rows(model.config.layer_types.index(S))
    assert any(length > rows and removed > 0 for length, removed in cache.crops), cache.crops


@pytest.mark.parametrize("mirror", [True, False], ids=["mirrored", "compact"])
@pytest.mark.parametrize("removed", [1, 2, 3, 4])
def test_crop_after_wrap_within_max_step_continues_exactly(model: Any, removed: int, mirror: bool) -> None:
    ids = prompt(40)
    cache = KVCoreCache(model.config, max_step=4, mirror_rings=mirror)  # sliding rows: 8 + 4 - 1 = 11
    with torch.no_grad():
        prefill(model, cache, ids[:, :30])
        cache.crop(-removed)
        assert cache.get_seq_length() == 30 - removed
        out = prefill(model, cache, ids[:, 30 - removed : 33])
        ref = model(input_ids=ids[:, :33], use_cache=False)
    assert float((out.logits - ref.logits[:, -out.logits.shape[1] :]).abs().max()) <= TOL


def test_crop_beyond_max_step_after_wrap_is_refused_and_changes_nothing(model: Any) -> None:
    ids = prompt(31)
    cache = KVCoreCache(model.config, max_step=4)
    with torch.no_grad():
        prefill(model, cache, ids[:, :30])
        assert not cache.can_rewind(25)
        with pytest.raises(kvcore.InvalidStateError, match=r"rewind\(n = 25\): layer \d needs position 18"):
            cache.crop(-5)
        assert cache.get_seq_length() == 30
        out = prefill(model, cache, ids[:, 30:31])
        ref = model(input_ids=ids, use_cache=False)
    assert float((out.logits[:, -1] - ref.logits[:, -1]).abs().max()) <= TOL
    # Rewinding to <= sinks (here 0) is always allowed.
    cache.crop(-31)
    assert cache.get_seq_length() == 0


def test_crop_arguments_are_checked() -> None:
    cache = KVCoreCache(gemma2().config, max_step=4)
    with pytest.raises(kvcore.InvalidArgumentError, match=r"crop\(3\): pass minus the number"):
        cache.crop(3)
    with pytest.raises(kvcore.InvalidArgumentError):
        cache.crop(-1)  # longer than the sequence (length 0)
    cache.crop(0)
    with pytest.raises(kvcore.NotSupportedError, match="crop the KVCoreCache"):
        cache.layers[0].crop(-1)


# --- memory --------------------------------------------------------------------------


@pytest.mark.parametrize("mirror", [True, False], ids=["mirrored", "compact"])
@pytest.mark.parametrize("max_step", [1, 4, 16])
def test_sliding_layers_hold_window_plus_max_step_minus_one_rows(max_step: int, mirror: bool) -> None:
    model = gemma2()
    cache = KVCoreCache(model.config, max_step=max_step, initial_capacity=16, mirror_rings=mirror)
    assert cache.mirror_rings == mirror
    with torch.no_grad():
        prefill(model, cache, prompt(60))
    heads, dim = model.config.num_key_value_heads, model.config.head_dim
    rows = WINDOW + max_step - 1
    mirror_rows = rows - 1 if mirror else 0  # a copy of the first R - 1 ring rows
    for i, kind in enumerate(model.config.layer_types):
        layer = cache.layers[i]
        if kind == S:
            assert cache.rows(i) == cache.allocated_rows(i) == rows
            assert cache.mirror_rows(i) == mirror_rows
            assert layer.keys.shape == (1, heads, rows + mirror_rows, dim)
            assert cache.nbytes(i) == 2 * heads * (rows + mirror_rows) * dim * 4
        else:  # full layers grow by doubling from 16 rows: 16 -> 32 -> 64 holds 60 positions
            assert cache.allocated_rows(i) == 64 and cache.rows(i) == 256 and cache.mirror_rows(i) == 0


@pytest.mark.parametrize("sinks", [0, 2])
def test_only_sliding_layers_without_sinks_are_mirrored(sinks: int) -> None:
    # With sinks the read is two spans and gathered anyway: a mirror would buy nothing.
    model = gemma2()
    cache = KVCoreCache(model.config, max_step=4, sinks=sinks)
    assert cache.mirror_rings
    with torch.no_grad():
        prefill(model, cache, prompt(40))
    rows = sinks + WINDOW + 4 - 1
    for i, kind in enumerate(model.config.layer_types):
        if kind == S:
            mirror = WINDOW + 4 - 2 if sinks == 0 else 0
            assert cache.mirror_rows(i) == mirror and cache.layers[i].keys.shape[2] == rows + mirror


def test_early_initialization_allocates_every_layer_up_front() -> None:
    cache = KVCoreCache(gemma2().config, max_step=4, initial_capacity=32)
    assert cache.allocated_rows(0) == 0 and not cache.is_initialized and cache.batch_size == -1
    cache.early_initialization(batch_size=2, num_heads=2, head_dim=16, dtype=torch.float64, device="cpu")
    assert cache.is_initialized and cache.batch_size == 2
    assert [cache.allocated_rows(i) for i in range(4)] == [8 + 4 - 1, 32, 8 + 4 - 1, 8 + 4 - 1]
    assert cache.layers[1].keys.dtype == torch.float64


# --- errors ---------------------------------------------------------------------------


def test_layer_tensors_are_the_pools_and_cannot_be_assigned() -> None:
    model = gemma2()
    cache = KVCoreCache(model.config, max_step=4)
    layer = cache.layers[0]
    assert layer.keys is None and not layer.is_initialized
    with torch.no_grad():
        prefill(model, cache, prompt(5))
    pool = cache.pool.layer(0)
    assert pool is not None and layer.keys is pool.keys and layer.values is pool.values and layer.is_initialized
    with pytest.raises(kvcore.NotSupportedError, match="layer 0: keys is read from the kvcore pool"):
        layer.keys = torch.zeros(1)
    with pytest.raises(kvcore.NotSupportedError, match="offloading is not supported"):
        layer.offload()  # transformers' offload assigns the tensors
    for name, value in (("values", torch.zeros(1)), ("is_initialized", True)):
        with pytest.raises(kvcore.NotSupportedError, match=f"layer 0: {name} is read from the kvcore pool"):
            setattr(layer, name, value)
    layer.is_initialized = False  # what CacheLayerMixin.__init__ assigns: accepted, and still read from the pool
    assert layer.keys is pool.keys and layer.values is pool.values and layer.is_initialized


def test_a_forward_longer_than_max_step_is_refused_with_a_hint(model: Any) -> None:
    cache = KVCoreCache(model.config, max_step=8)
    with pytest.raises(kvcore.InvalidArgumentError, match=r"T = 13 tokens: must be <= max_step = 8.*prefill_chunk_size=8"):
        greedy(model, prompt(13), 5, cache=cache)
    assert cache.get_seq_length() == 0


def test_layers_must_be_updated_in_order_with_one_T() -> None:
    cache = KVCoreCache(gemma2().config, max_step=4)
    k = torch.zeros(1, 2, 2, 16)
    with pytest.raises(kvcore.InvalidStateError, match="layer 0 is next"):
        cache.update(k, k, 1)
    cache.update(k, k, 0)
    with pytest.raises(kvcore.InvalidStateError, match="layer 1 is next"):
        cache.update(k, k, 2)
    with pytest.raises(kvcore.InvalidStateError, match="T = 1 tokens, but this forward's step has T = 2"):
        cache.update(k[:, :, :1], k[:, :, :1], 1)
    for layer in (1, 2, 3):
        cache.update(k, k, layer)
    assert cache.get_seq_length() == 2


def decode_random(cache: KVCoreCache, n: int, seed: int = 0) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    """``n`` one-token forwards of random K/V straight through ``cache.update``; each layer's returned history."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        k = torch.randn(1, 2, 1, 16, generator=g)
        v = torch.randn(1, 2, 1, 16, generator=g)
        out.append([tuple(t.clone() for t in cache.update(k, v, i)) for i in range(len(cache.layers))])
    return out


BAD_INPUTS = {
    "heads": lambda: (torch.randn(1, 3, 1, 16), torch.randn(1, 3, 1, 16)),
    "head_dim": lambda: (torch.randn(1, 2, 1, 8), torch.randn(1, 2, 1, 8)),
    "3-D": lambda: (torch.randn(2, 1, 16), torch.randn(2, 1, 16)),
    "dtype": lambda: (torch.randn(1, 2, 1, 16, dtype=torch.float64), torch.randn(1, 2, 1, 16, dtype=torch.float64)),
    "key/value dtypes": lambda: (torch.randn(1, 2, 1, 16), torch.randn(1, 2, 1, 16, dtype=torch.float64)),
    "batch": lambda: (torch.randn(2, 2, 1, 16), torch.randn(2, 2, 1, 16)),
    "T > max_step": lambda: (torch.randn(1, 2, 5, 16), torch.randn(1, 2, 5, 16)),
}


@pytest.mark.parametrize("sized", [False, True], ids=["no-step", "masks-sized"])
@pytest.mark.parametrize("bad", sorted(BAD_INPUTS))
def test_bad_input_to_layer_0_is_refused_and_changes_nothing(bad: str, sized: bool) -> None:
    cache = KVCoreCache(gemma2().config, max_step=4)
    decode_random(cache, 30)
    if sized:  # transformers sizes the masks before layer 0: a query, it begins nothing
        cache.get_mask_sizes(1, 0)
    assert cache.sequence.active_step is None
    rewindable = [cache.can_rewind(n) for n in range(31)]
    assert rewindable[26] and not rewindable[25]  # after a wrap, back by at most max_step
    k, v = BAD_INPUTS[bad]()
    with pytest.raises(kvcore.InvalidArgumentError, match="layer 0|T = 5"):
        cache.update(k, v, 0)
    assert [cache.can_rewind(n) for n in range(31)] == rewindable
    assert cache.sequence.length == cache.get_seq_length() == 30
    assert cache.sequence.active_step is None
    # The next good forward continues exactly as on a cache that never saw the bad input.
    twin = KVCoreCache(gemma2().config, max_step=4)
    decode_random(twin, 30)
    for a, b in zip(decode_random(cache, 3, seed=5), decode_random(twin, 3, seed=5)):
        assert all(torch.equal(x, y) for (xa, xb), (ya, yb) in zip(a, b) for x, y in ((xa, ya), (xb, yb)))


@pytest.mark.parametrize("bad", ["heads", "dtype", "batch"])
def test_bad_input_to_a_later_layer_interrupts_the_forward_and_the_retry_is_exact(bad: str) -> None:
    # docs/transformers.md: an interrupted forward leaves the length as it was; its retry is exact.
    cache, twin = (KVCoreCache(gemma2().config, max_step=4) for _ in range(2))
    decode_random(cache, 30)
    decode_random(twin, 30)
    g = torch.Generator().manual_seed(9)
    k, v = torch.randn(1, 2, 1, 16, generator=g), torch.randn(1, 2, 1, 16, generator=g)
    cache.update(k, v, 0)
    cache.update(k, v, 1)
    before = cache.pool.layer(2).keys.clone()  # type: ignore[union-attr]
    with pytest.raises(kvcore.InvalidArgumentError, match="layer 2"):
        cache.update(*BAD_INPUTS[bad](), 2)
    assert torch.equal(cache.pool.layer(2).keys, before)  # type: ignore[union-attr]
    assert cache.get_seq_length() == 30
    for a, b in zip(decode_random(cache, 3, seed=5), decode_random(twin, 3, seed=5)):
        assert all(torch.equal(x, y) for (xa, xb), (ya, yb) in zip(a, b) for x, y in ((xa, ya), (xb, yb)))
    assert cache.get_seq_length() == twin.get_seq_length() == 33


@pytest.mark.parametrize("sinks", [0, 1])
def test_one_layer_type_with_two_windows_is_refused(sinks: int) -> None:
    # transformers builds one mask per layer type: layer 2's window 4 would get layer 0's window-8 mask.
    def config(window_2: int) -> Any:  # a config only: Gemma2's modeling reads one global window
        return transformers.Gemma2Config(
            vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, sliding_window=WINDOW, layer_types=[S, F, S],
            max_position_embeddings=256, per_layer_config={"2": {"sliding_window": window_2}},
        )  # fmt: skip

    cfg = config(4)
    assert kvt.cache_utils.get_layer_types_and_kwargs(cfg)[1][2] == {"sliding_window": 4}
    with pytest.raises(
        kvcore.NotSupportedError,
        match=rf"layers 0 and 2 are both 'sliding_attention'.*window=8, sinks={sinks}.*window=4, "
        rf"sinks={sinks}.*one mask per layer type",
    ):
        KVCoreCache(cfg, max_step=4, sinks=sinks)
    assert KVCoreCache(config(WINDOW), max_step=4, sinks=sinks).rows(2) == sinks + WINDOW + 4 - 1


def test_configs_kvcore_cannot_serve_are_refused() -> None:
    with pytest.raises(kvcore.NotSupportedError, match="bidirectional"):
        KVCoreCache(gemma3(use_bidirectional_attention=True).config)
    cfg = gemma2().config
    cfg.layer_types = [S, F, "hybrid_sliding", S]  # a sliding window beside a Mamba mixer in one layer
    with pytest.raises(kvcore.NotSupportedError, match="layer 2 is 'hybrid_sliding'"):
        KVCoreCache(cfg)  # (chunked, KV-shared and hybrid layers are served: test_transformers_kinds/state.py)
    cfg.layer_types = [S, F, "mlp", S]  # a layer without attention: transformers' "dummy", served as empty
    assert repr(KVCoreCache(cfg).layers[2]) == "KVCoreEmptyLayer(2)"
    with pytest.raises(kvcore.InvalidArgumentError, match="sinks = -1: must be >= 0"):
        KVCoreCache(gemma2().config, sinks=-1)
    with pytest.raises(kvcore.InvalidArgumentError, match="max_step = 300: must be <= capacity = 256"):
        KVCoreCache(gemma2().config, max_step=300)


def test_unsupported_transformers_versions_are_refused() -> None:
    kvt.check_transformers()  # the installed one is supported
    for version in ("4.57.1", "5.0.0", "5.23.0", "6.0.0"):
        with pytest.raises(kvcore.NotSupportedError, match=f"found {version}"):
            kvt.check_transformers(version)


# --- attention sinks ----------------------------------------------------------------------


def reference_masks(config: Any, n: int, sinks: int) -> dict[str, torch.Tensor]:
    """Eager masks over positions 0..n-1 straight from docs/design.md's visibility rule."""
    q = torch.arange(n)[:, None]
    k = torch.arange(n)[None, :]
    full = k <= q
    sliding = full & ((q - k < config.sliding_window) | (k < sinks))
    neg = torch.finfo(torch.float32).min
    return {
        kind: torch.where(m, 0.0, neg)[None, None] for kind, m in ((F, full), (S, sliding))
    }


@pytest.mark.parametrize("mirror", [True, False], ids=["mirrored", "compact"])
@pytest.mark.parametrize("sinks", [1, 3])
def test_sinks_decode_matches_a_full_forward_with_the_sink_mask(model: Any, sinks: int, mirror: bool) -> None:
    ids = prompt(36)
    cache = KVCoreCache(model.config, max_step=4, sinks=sinks, mirror_rings=mirror)
    assert cache.rows(model.config.layer_types.index(S)) == sinks + WINDOW + 4 - 1
    with torch.no_grad():
        prefill(model, cache, ids[:, :12])
        for n in range(12, 36):
            out = prefill(model, cache, ids[:, n : n + 1])
            ref = model(input_ids=ids[:, : n + 1], attention_mask=reference_masks(model.config, n + 1, sinks))
            assert float((out.logits[:, -1] - ref.logits[:, -1]).abs().max()) <= TOL, n


def no_layer_types_model(name: str) -> Any:
    """A tiny model whose config has no layer_types (every layer sliding)."""
    torch.manual_seed(0)
    common = dict(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, sliding_window=WINDOW, max_position_embeddings=256, attn_implementation="eager",
    )  # fmt: skip
    if name == "mistral":
        return transformers.MistralForCausalLM(transformers.MistralConfig(head_dim=16, **common)).eval()
    if name == "phi3":
        return transformers.Phi3ForCausalLM(transformers.Phi3Config(pad_token_id=0, eos_token_id=1, **common)).eval()
    return transformers.Starcoder2ForCausalLM(transformers.Starcoder2Config(**common)).eval()


@pytest.mark.parametrize("name", ["mistral", "phi3", "starcoder2"])
def test_sinks_on_models_without_layer_types_match_a_full_forward(name: str) -> None:
    model = no_layer_types_model(name)
    assert getattr(model.config, "layer_types", None) is None
    ids = prompt(30)
    sinks = 2
    cache = KVCoreCache(model.config, max_step=4, sinks=sinks)
    with torch.no_grad():
        masks = cache.attention_masks(model.config, 4)
        assert isinstance(masks, torch.Tensor) and masks.dim() == 4  # one mask, as these models take it
        prefill(model, cache, ids[:, :12])
        for n in range(12, 30):
            out = prefill(model, cache, ids[:, n : n + 1])
            ref = model(input_ids=ids[:, : n + 1], attention_mask=reference_masks(model.config, n + 1, sinks)[S])
            assert float((out.logits[:, -1] - ref.logits[:, -1]).abs().max()) <= TOL, n


def test_sinks_refuse_masks_transformers_would_build_wrong(model: Any) -> None:
    cache = KVCoreCache(model.config, max_step=16, sinks=2)
    with pytest.raises(kvcore.NotSupportedError, match="2 attention sinks.*attention_masks"):
        greedy(model, prompt(5), 3, cache=cache)
    assert cache.get_seq_length() == 0


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_attention_masks_without_sinks_reproduce_transformers_masks(impl: str) -> None:
    model = gemma3(attn=impl)  # Gemma 3: no logit soft-capping, which sdpa refuses
    ids = prompt(30)
    mask2d = torch.ones(1, 30, dtype=torch.long)
    ours, theirs = KVCoreCache(model.config, max_step=4), KVCoreCache(model.config, max_step=4)
    with torch.no_grad():
        prefill(model, ours, ids[:, :20])
        prefill(model, theirs, ids[:, :20])
        for n in range(20, 30):
            masks = ours.attention_masks(model.config, 1, attention_mask=mask2d[:, : n + 1])
            assert masks[S].dtype == (torch.bool if impl == "sdpa" else torch.float32)
            out = model(input_ids=ids[:, n : n + 1], cache=ours, attention_mask=masks)
            ref = model(input_ids=ids[:, n : n + 1], cache=theirs)
            assert float((out.logits - ref.logits).abs().max()) <= TOL


@pytest.mark.parametrize("T", [1, 3, 4])
def test_mask_sizes_are_dynamic_caches_at_every_length(T: int) -> None:
    # transformers' own sliding and full layers are the reference for (kv_length, kv_offset).
    config = gemma2(layer_types=(S, F, S)).config
    ours = KVCoreCache(config, max_step=4)
    theirs = transformers.DynamicCache(config=config)
    for length in range(0, 40, T):
        for layer in range(3):
            assert ours.get_mask_sizes(T, layer) == theirs.get_mask_sizes(T, layer), (length, layer)
            k = torch.randn(1, 2, T, 16)
            ours.update(k, k, layer)
            theirs.update(k, k, layer)
        assert ours.get_seq_length() == theirs.get_seq_length() == length + T


def test_sizing_masks_changes_nothing(model: Any) -> None:
    ids = prompt(31)
    cache = KVCoreCache(model.config, max_step=4)
    sliding = model.config.layer_types.index(S)
    with torch.no_grad():
        prefill(model, cache, ids[:, :30])
        rewindable = [cache.can_rewind(n) for n in range(31)]
        assert rewindable[26] and not rewindable[25] and cache.sequence.active_step is None
        for T in (1, 4):
            assert cache.get_mask_sizes(T, sliding) == (WINDOW + T - 1, 30 - WINDOW + 1)
        assert cache.sequence.active_step is None and cache.get_seq_length() == 30
        assert [cache.can_rewind(n) for n in range(31)] == rewindable
        cache.crop(-4)  # as an assisted-generation round that sized masks, then rejected drafts
        assert cache.get_seq_length() == 26
        prefill(model, cache, ids[:, 26:30])
        out = prefill(model, cache, ids[:, 30:31])
        ref = model(input_ids=ids, use_cache=False)
    assert float((out.logits[:, -1] - ref.logits[:, -1]).abs().max()) <= TOL
    assert cache.get_seq_length() == 31 and cache.sequence.active_step is None


def test_attention_masks_check_their_arguments() -> None:
    model = gemma2()
    cache = KVCoreCache(model.config, max_step=4, sinks=1)
    with pytest.raises(kvcore.InvalidArgumentError, match=r"query_length = 5: must be in \[1, max_step = 4\]"):
        cache.attention_masks(model.config, 5)
    with pytest.raises(kvcore.InvalidArgumentError, match=r"must be 2-D \[batch, >= 2\]"):
        cache.attention_masks(model.config, 2, attention_mask=torch.ones(1, 1))
    model.config._attn_implementation = "flash_attention_2"
    with pytest.raises(kvcore.NotSupportedError, match="'flash_attention_2'"):
        cache.attention_masks(model.config, 1)


def test_prefill_checks_its_arguments() -> None:
    model = gemma2()
    cache = KVCoreCache(model.config, max_step=4)
    with pytest.raises(kvcore.InvalidArgumentError, match=r"input_ids \(1, 0\)"):
        prefill(model, cache, torch.zeros(1, 0, dtype=torch.long))
    with pytest.raises(kvcore.InvalidArgumentError, match="must cover the 0 cached tokens and the 3 new ones"):
        prefill(model, cache, prompt(3), attention_mask=torch.ones(1, 2))


def test_bad_input_to_a_later_layer_aborts_the_step() -> None:
    # kvcore.forward_step: the forward failed, so its step is aborted rather than
    # left begun (was: begun until a retry replaced it); the cache is as before the forward.
    cache = KVCoreCache(gemma2().config, max_step=4)
    decode_random(cache, 30)
    k = torch.randn(1, 2, 1, 16)
    cache.update(k, k, 0)
    assert cache.sequence.active_step is not None
    with pytest.raises(kvcore.InvalidArgumentError, match="layer 1"):
        cache.update(*BAD_INPUTS["heads"](), 1)
    assert cache.sequence.active_step is None and cache.get_seq_length() == 30
    with pytest.raises(kvcore.InvalidStateError, match="layer 0 is next"):
        cache.update(k, k, 1)


def test_discard_forward_aborts_the_unfinished_step(model: Any) -> None:
    cache = KVCoreCache(model.config, max_step=4)
    ids = prompt(18)
    with torch.no_grad():
        prefill(model, cache, ids[:, :16])
        hook = model.model.layers[2].register_forward_pre_hook(lambda *_: (_ for _ in ()).throw(RuntimeError("boom")))
        try:
            with pytest.raises(RuntimeError, match="boom"):
                prefill(model, cache, ids[:, 16:18])
        finally:
            hook.remove()
        step = cache.sequence.active_step
        assert step is not None  # the model raised between layers: the cache saw no error
        cache.discard_forward()
        assert cache.sequence.active_step is None and not step.is_current and cache.get_seq_length() == 16
        with pytest.raises(kvcore.InvalidStateError, match=r"step \(position 16, T 2\): no step is begun"):
            cache.sequence.abort(step)  # aborted already: a stale abort changes nothing


def test_a_layer_type_the_integration_does_not_know_is_named() -> None:
    # Every kind kvcore plans is served (chunked and KV-shared: test_transformers_kinds.py;
    # recurrent state: test_transformers_state.py); a type outside them is refused by name.
    config = transformers.Gemma3TextConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                                           num_key_value_heads=2, vocab_size=256, num_hidden_layers=2,
                                           head_dim=16, sliding_window=8)
    config.layer_types = ["full_attention", "mystery_attention"]
    with pytest.raises(kvcore.NotSupportedError, match=r"layer 1 is 'mystery_attention': kvcore's transformers "
                       r"cache supports 'full_attention', 'sliding_attention', 'chunked_attention', KV-shared"):
        KVCoreCache(config, capacity=256)
