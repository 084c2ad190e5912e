"""KVCoreCache on hybrid models: recurrent-state layers in kvcore's State slots.

Tiny random Qwen3-Next (gated DeltaNet + full attention), LFM2 (short convolutions +
full attention) and Granite 4.0-H (Mamba-2 + attention) against transformers'
DynamicCache: greedy and sampled generation, chunked prefill, crops kvcore allows
(exact: the next logits equal a cache that decoded only up to there) and refuses
(nothing changes), and exact speculative decoding with verify steps
(``kvcore.integrations.transformers_speculative``), which a planted off-by-one slot
breaks.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Callable

import pytest
from needs import need

torch = need("torch")
transformers = need("transformers")

import kvcore  # noqa: E402
from kvcore.integrations.transformers import KVCoreCache, prefill, verify_tree  # noqa: E402
from kvcore.integrations.transformers_speculative import (  # noqa: E402
    draft_model_drafter,
    lookup_drafts,
    prompt_lookup_generate,
    speculative_generate,
)
from kvcore.torch.state_slots import TorchStateSlots  # noqa: E402
from hf_generate import generate, max_diff, model_fixture, no_eos, random_prompt  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

VOCAB = 96
TOL = 1e-4


def tiny(model_class: Any, config: Any, seed: int) -> Any:
    """``model_class(config)`` in eval mode, its weights drawn from ``seed``, that never stops at an EOS."""
    torch.manual_seed(seed)
    return no_eos(model_class(config).eval())


def qwen3_next(seed: int = 0) -> Any:
    config = transformers.Qwen3NextConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=32, num_hidden_layers=4, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=2,
        linear_key_head_dim=8, linear_value_head_dim=8, linear_conv_kernel_dim=4, num_experts=2,
        num_experts_per_tok=1, moe_intermediate_size=16, shared_expert_intermediate_size=16,
        max_position_embeddings=256, full_attention_interval=2, initializer_range=0.2,
    )  # fmt: skip
    return tiny(transformers.Qwen3NextForCausalLM, config, seed)


def lfm2(seed: int = 0) -> Any:
    config = transformers.Lfm2Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=256, conv_L_cache=3, initializer_range=0.2,
        layer_types=["conv", "full_attention", "conv", "conv"],  # the last layer holds a state
    )  # fmt: skip
    return tiny(transformers.Lfm2ForCausalLM, config, seed)


def granite(seed: int = 0) -> Any:
    config = transformers.GraniteMoeHybridConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=32, num_hidden_layers=3, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=256, layer_types=["mamba", "attention", "mamba"],
        mamba_n_heads=4, mamba_n_groups=1, mamba_d_state=8, mamba_d_head=16, mamba_d_conv=4, mamba_expand=2,
        num_local_experts=2, num_experts_per_tok=1, shared_intermediate_size=32, mamba_chunk_size=16,
        initializer_range=0.2,
    )  # fmt: skip
    return tiny(transformers.GraniteMoeHybridForCausalLM, config, seed)


MODELS: dict[str, Callable[[], Any]] = {"qwen3_next": qwen3_next, "lfm2": lfm2, "granite": granite}


# The other hybrid families, tiny: gated DeltaNet (Qwen 3.5), Mamba (Jamba), Mamba-2 (Bamba,
# Nemotron-H, whose "-" layers have neither attention nor state: transformers' "dummy" layer).
def qwen3_5(seed: int = 0) -> Any:
    config = transformers.Qwen3_5TextConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=32, num_hidden_layers=4, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=2,
        linear_key_head_dim=8, linear_value_head_dim=8, linear_conv_kernel_dim=4, max_position_embeddings=256,
        layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"], initializer_range=0.2,
    )  # fmt: skip
    return tiny(transformers.Qwen3_5ForCausalLM, config, seed)


def jamba(seed: int = 0) -> Any:
    config = transformers.JambaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=32, num_hidden_layers=4, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=256, attn_layer_period=2, attn_layer_offset=1,
        expert_layer_period=2, expert_layer_offset=1, num_experts=2, num_experts_per_tok=1, mamba_d_state=8,
        mamba_d_conv=4, mamba_expand=2, mamba_dt_rank=4, initializer_range=0.2,
    )  # fmt: skip
    return tiny(transformers.JambaForCausalLM, config, seed)


def bamba(seed: int = 0) -> Any:
    config = transformers.BambaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=32, num_hidden_layers=3, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=256, attn_layer_indices=[1], mamba_n_heads=4, mamba_d_head=16,
        mamba_n_groups=1, mamba_d_state=8, mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=16, initializer_range=0.2,
    )  # fmt: skip
    return tiny(transformers.BambaForCausalLM, config, seed)


def nemotron_h(seed: int = 0) -> Any:
    config = transformers.NemotronHConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=32, num_hidden_layers=3, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, max_position_embeddings=256, hybrid_override_pattern="M*-",
        mamba_num_heads=4, mamba_head_dim=16, n_groups=1, ssm_state_size=8, conv_kernel=4, expand=2, chunk_size=16,
        initializer_range=0.2,
    )  # fmt: skip
    return tiny(transformers.NemotronHForCausalLM, config, seed)


def falcon_h1(seed: int = 0) -> Any:
    # Every layer runs attention and a Mamba-2 mixer side by side (transformers' "hybrid" layer type).
    config = transformers.FalconH1Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=32, num_hidden_layers=3, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, max_position_embeddings=256, mamba_d_ssm=64, mamba_n_heads=4,
        mamba_d_head=16, mamba_n_groups=1, mamba_d_state=8, mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=16,
        initializer_range=0.2,
    )  # fmt: skip
    return tiny(transformers.FalconH1ForCausalLM, config, seed)


FAMILIES: dict[str, Callable[[], Any]] = {"qwen3_5": qwen3_5, "jamba": jamba, "bamba": bamba, "nemotron_h": nemotron_h,
                                          "falcon_h1": falcon_h1}  # fmt: skip
family = model_fixture(FAMILIES, name="family")


model = model_fixture(MODELS)
prompt = partial(random_prompt, vocab=VOCAB)


def state_layer_indices(model: Any) -> list[int]:
    from transformers import cache_utils

    types, _ = cache_utils.get_layer_types_and_kwargs(model.config.get_text_config(decoder=True))
    return [i for i, t in enumerate(types) if t in ("linear_attention", "conv")]


# --- generate() ---------------------------------------------------------------------------


def test_continuous_batching_refuses_hybrids_up_front_by_name(model: Any) -> None:
    from kvcore.integrations.transformers import generate_batch

    with pytest.raises(kvcore.NotSupportedError, match=r"Invalid layer type: \w+; .*\(hybrid models\) are not served"):
        generate_batch(model, [prompt(5)[0].tolist()], max_new_tokens=2)
    assert getattr(model, "_cached_continuous_batching_manager", None) is None  # nothing installed


@pytest.mark.parametrize(("max_step", "chunk"), [(16, None), (4, 4)], ids=["one-forward-prefill", "chunked-prefill"])
def test_greedy_generate_matches_dynamic_cache(model: Any, max_step: int, chunk: int | None) -> None:
    ids = prompt(13)
    ref = generate(model, ids, 12, do_sample=False)
    cache = KVCoreCache(model.config, max_step=max_step)
    kwargs = {} if chunk is None else {"prefill_chunk_size": chunk}
    out = generate(model, ids, 12, do_sample=False, cache=cache, **kwargs)
    assert torch.equal(out.sequences, ref.sequences)
    assert max_diff(out.logits, ref.logits) <= TOL
    assert len(set(ref.sequences[0, 13:].tolist())) > 2  # the model does not just repeat one token
    assert cache.get_seq_length() == ref.sequences.shape[1] - 1
    # Every state layer holds D = min(max_step, 8) + 1 snapshots of each of its states.
    D = min(max_step, 8) + 1
    for i in state_layer_indices(model):
        assert cache.state.slots(i) == D
        for name in cache.state.names(i):
            tensor = cache.state.tensor(i, name)
            assert tensor is not None and tensor.shape[:2] == (D, 1)


def test_seeded_sampling_matches_dynamic_cache(model: Any) -> None:
    ids = prompt(9)
    torch.manual_seed(7)
    ref = generate(model, ids, 10, do_sample=True, top_k=0, temperature=1.5)
    torch.manual_seed(7)
    cache = KVCoreCache(model.config, max_step=4)
    out = generate(model, ids, 10, do_sample=True, top_k=0, temperature=1.5, cache=cache, prefill_chunk_size=4)
    assert torch.equal(out.sequences, ref.sequences)
    assert max_diff(out.logits, ref.logits) <= TOL


def test_reset_cache_serves_a_new_sequence(model: Any) -> None:
    cache = KVCoreCache(model.config, max_step=16)
    generate(model, prompt(7, seed=3), 5, do_sample=False, cache=cache)
    cache.reset()
    ids = prompt(11)
    out = generate(model, ids, 6, do_sample=False, cache=cache)
    assert torch.equal(out.sequences, generate(model, ids, 6, do_sample=False).sequences)


def test_a_batch_and_beam_search_match_dynamic_cache(model: Any) -> None:
    # Beams repeat, select and reorder the batch of every state slot.
    ids = torch.randint(3, VOCAB, (2, 9), generator=torch.Generator().manual_seed(4))
    out = generate(model, ids, 8, do_sample=False, cache=KVCoreCache(model.config, max_step=16))
    assert torch.equal(out.sequences, generate(model, ids, 8, do_sample=False).sequences)
    out = generate(model, ids[:1], 6, do_sample=False, num_beams=2, cache=KVCoreCache(model.config, max_step=16))
    assert torch.equal(out.sequences, generate(model, ids[:1], 6, do_sample=False, num_beams=2).sequences)


# --- crops --------------------------------------------------------------------------------


def decode(model: Any, cache: Any, ids: torch.Tensor) -> torch.Tensor:
    """Prefill ``ids[:, :8]`` then feed the rest one token per forward; the last logits."""
    with torch.no_grad():
        out = model(input_ids=ids[:, :8], cache=cache, use_cache=True)
        for i in range(8, ids.shape[1]):
            out = model(input_ids=ids[:, i : i + 1], cache=cache, use_cache=True)
    return out.logits[:, -1]


@pytest.mark.parametrize("removed", [1, 3, 4])
def test_crop_within_the_slots_restores_exactly(model: Any, removed: int) -> None:
    ids = prompt(20)
    cache = KVCoreCache(model.config, max_step=8, state_slots=5)  # one-token forwards: the last 5 states held
    decode(model, cache, ids[:, :16])
    assert cache.can_rewind(16 - removed)
    cache.crop(-removed)
    assert cache.get_seq_length() == 16 - removed
    with torch.no_grad():
        out = model(input_ids=ids[:, 16 - removed : 17 - removed], cache=cache, use_cache=True).logits[:, -1]
    ref = decode(model, transformers.DynamicCache(config=model.config), ids[:, : 17 - removed])
    assert float((out - ref).abs().max()) <= TOL
    # Not what the cache held before the crop: the crop selected an older slot.
    longer = decode(model, transformers.DynamicCache(config=model.config), ids[:, :17])
    assert float((out - longer).abs().max()) > 1e-3


def test_crop_beyond_the_slots_is_refused_and_changes_nothing(model: Any) -> None:
    ids = prompt(17)
    cache = KVCoreCache(model.config, max_step=8, state_slots=5)
    decode(model, cache, ids[:, :16])
    assert not cache.can_rewind(11)
    first = state_layer_indices(model)[0]
    with pytest.raises(kvcore.InvalidStateError, match=rf"rewind\(n = 11\): layer {first} no longer holds the state "
                                                       r"after position 10"):  # fmt: skip
        cache.crop(-5)
    assert cache.get_seq_length() == 16
    with torch.no_grad():
        out = model(input_ids=ids[:, 16:17], cache=cache, use_cache=True).logits[:, -1]
    ref = decode(model, transformers.DynamicCache(config=model.config), ids)
    assert float((out - ref).abs().max()) <= TOL


def test_a_prefill_chunk_keeps_only_its_last_state(model: Any) -> None:
    cache = KVCoreCache(model.config, max_step=8)
    with torch.no_grad():
        prefill(model, cache, prompt(12))  # chunks of 8 and 4
    assert [n for n in range(13) if cache.can_rewind(n)] == [0, 8, 12]


# --- speculative decoding -----------------------------------------------------------------


def repetitive_prompt() -> torch.Tensor:
    ids = prompt(10)
    return torch.cat([ids, ids[:, :6], ids[:, 2:9]], dim=1)  # repeats give n-gram matches


def corrupting_drafter(reference: list[int]) -> Callable[[list[int], int], list[int]]:
    """Drafts that follow the reference continuation, every third one wrong: partial accepts."""
    calls = [0]

    def draft(tokens: list[int], n: int) -> list[int]:
        calls[0] += 1
        right = reference[len(tokens) : len(tokens) + n]
        return [(t + 1) % VOCAB if (calls[0] + i) % 3 == 0 else t for i, t in enumerate(right)]

    return draft


def test_verify_steps_with_partial_accepts_equal_plain_greedy(model: Any) -> None:
    ids = prompt(11)
    ref = generate(model, ids, 24, do_sample=False).sequences
    cache = KVCoreCache(model.config, max_step=8)  # D = 9: verify steps of up to 4 tokens
    stats: dict[str, int] = {}
    out = speculative_generate(model, cache, ids, corrupting_drafter(ref[0].tolist()), max_new_tokens=24,
                               num_draft_tokens=3, stats=stats)  # fmt: skip
    assert torch.equal(out, ref)
    # Drafts were accepted and rejected: rewinds into verify steps selected earlier slots.
    assert stats["drafted"] > stats["accepted"] > 0, stats
    assert stats["forwards"] < 24, stats
    assert cache.get_seq_length() >= ref.shape[1] - 1  # accepted drafts past the last token stay cached


def test_prompt_lookup_and_a_draft_model_equal_plain_greedy(model: Any) -> None:
    ids = repetitive_prompt()
    ref = generate(model, ids, 16, do_sample=False).sequences
    out = prompt_lookup_generate(model, KVCoreCache(model.config, max_step=8), ids, max_new_tokens=16)
    assert torch.equal(out, ref)
    drafter = draft_model_drafter(type(model)(model.config).eval())  # same shape, other weights
    out = speculative_generate(model, KVCoreCache(model.config, max_step=8), ids, drafter, max_new_tokens=8)
    assert torch.equal(out, ref[:, : ids.shape[1] + 8])


def test_the_other_hybrid_families_decode_and_look_up_prompts_as_dynamic_cache(family: Any) -> None:
    # Greedy with chunked prefill past the state slots, and prompt lookup (verify steps, rewinds
    # into them) equal to plain greedy decoding with transformers' own cache.
    ids = repetitive_prompt()
    ref = generate(family, ids, 12, do_sample=False, prefill_chunk_size=4)  # the same float path as below
    cache = KVCoreCache(family.config, max_step=4)
    out = generate(family, ids, 12, do_sample=False, cache=cache, prefill_chunk_size=4)
    assert torch.equal(out.sequences, ref.sequences)
    assert max_diff(out.logits, ref.logits) <= TOL
    assert len(set(ref.sequences[0, ids.shape[1] :].tolist())) > 2
    assert cache.state_layers, "the model has state layers"
    # (Prompt lookup prefills in one forward: against greedy decoding that does too, as chunked
    # and whole prefills of a recurrent layer differ in float rounding.)
    whole = generate(family, ids, 12, do_sample=False).sequences
    lookup = KVCoreCache(family.config, max_step=8)
    stats: dict[str, int] = {}
    looked_up = prompt_lookup_generate(family, lookup, ids, max_new_tokens=12, stats=stats)
    assert torch.equal(looked_up, whole)
    assert stats["drafted"] > 0  # verify steps ran, their rejected drafts rewound


def test_a_layer_without_attention_or_state_holds_nothing_and_refuses_updates() -> None:
    model = nemotron_h()
    cache = KVCoreCache(model.config, max_step=8)
    assert cache.layer_types == ["linear_attention", "full_attention", "dummy"]
    assert cache.writing_layers == [0, 1] and repr(cache.layers[2]) == "KVCoreEmptyLayer(2)"
    with torch.no_grad():
        prefill(model, cache, prompt(6))
    assert cache.get_seq_length() == 6 and cache.layers[2].get_seq_length() == 6
    assert cache.pool.layer(2) is None  # never allocated
    with pytest.raises(kvcore.InvalidArgumentError, match=r"^update of layer 2: the model's config gives it no attention"):
        cache.layers[2].update(torch.zeros(1, 1, 1, 1), torch.zeros(1, 1, 1, 1))
    assert cache.get_seq_length() == 6


def test_transformers_refuses_prompt_lookup_on_models_it_marks_stateful() -> None:
    model = qwen3_next()
    with pytest.raises(ValueError, match="assisted generation is not supported with stateful models"):
        generate(model, prompt(8), 4, do_sample=False, cache=KVCoreCache(model.config, max_step=8),
                 prompt_lookup_num_tokens=3)  # fmt: skip


def test_transformers_prompt_lookup_on_lfm2_through_the_cache_equals_plain_greedy() -> None:
    # LFM2 is not marked stateful: transformers runs its own prompt lookup. activate_past_recording
    # makes each forward a verify step (state_slots > the longest forward), so its crops are exact.
    model = lfm2()
    ids = repetitive_prompt()
    ref = generate(model, ids, 20, do_sample=False).sequences
    cache = KVCoreCache(model.config, max_step=32, state_slots=33)
    out = generate(model, ids, 20, do_sample=False, cache=cache, prompt_lookup_num_tokens=3).sequences
    assert torch.equal(out, ref)


def test_a_verify_step_without_per_token_states_is_refused_and_changes_nothing() -> None:
    model = qwen3_next()
    ids = prompt(12)
    cache = KVCoreCache(model.config, max_step=8)
    with torch.no_grad():
        prefill(model, cache, ids[:, :8])
        cache.begin_verify(3)
        with pytest.raises(kvcore.NotSupportedError, match=r"layer 0: a verify step of 3 tokens keeps the state "
                                                           r"after each, and transformers' layer computes only its "
                                                           r"last recurrent state"):  # fmt: skip
            model(input_ids=ids[:, 8:11], cache=cache, use_cache=True)
        assert cache.get_seq_length() == 8 and cache.sequence.active_step is None
        out = prefill(model, cache, ids[:, 8:12]).logits[:, -1]
        ref = model(input_ids=ids, use_cache=False).logits[:, -1]
    assert float((out - ref).abs().max()) <= TOL


def test_a_planted_off_by_one_slot_breaks_speculative_decoding(monkeypatch: pytest.MonkeyPatch) -> None:
    model = qwen3_next()
    ids = prompt(11)
    ref = generate(model, ids, 24, do_sample=False).sequences
    span = TorchStateSlots.span

    def off_by_one(self: TorchStateSlots, layer: int, plan: Any, first: int, count: int) -> Any:
        s = span(self, layer, plan, first, count)
        if s.read is None:
            return s
        return type(s)(s.layer, s.first, s.count, (s.read + 1) % self.slots(layer), s.keep)  # the slot after

    def run() -> torch.Tensor:
        cache = KVCoreCache(model.config, max_step=8)
        return speculative_generate(model, cache, ids, corrupting_drafter(ref[0].tolist()), max_new_tokens=24)

    assert torch.equal(run(), ref)
    monkeypatch.setattr(TorchStateSlots, "span", off_by_one)
    assert not torch.equal(run(), ref)


def test_lookup_drafts_follow_the_latest_match() -> None:
    assert lookup_drafts([1, 2, 3, 9, 1, 2, 5, 6, 1, 2], 2, 3) == [5, 6, 1]
    assert lookup_drafts([1, 2, 3, 4], 2, 3) == []
    assert lookup_drafts([7, 8, 7], 3, 2) == [8, 7]


# --- refusals -----------------------------------------------------------------------------


def test_state_slots_below_one_are_refused() -> None:
    with pytest.raises(kvcore.InvalidArgumentError, match=r"state_slots = 0: must be >= 1"):
        KVCoreCache(lfm2().config, state_slots=0)


def test_a_verify_step_longer_than_the_slots_allow_is_refused() -> None:
    cache = KVCoreCache(lfm2().config, max_step=8, state_slots=3)
    with pytest.raises(kvcore.InvalidArgumentError, match=r"T = 3: a verify or tree step keeps the state"):
        cache.begin_verify(3)
    assert cache.sequence.active_step is None


def test_a_draft_tree_on_a_hybrid_equals_recomputation_and_commits_off_the_main_line(model: Any) -> None:
    draft_tree_equals_recomputation(model)


def test_a_draft_tree_on_the_other_hybrid_families_equals_recomputation(family: Any) -> None:
    # (max_step 16: the history in one forward, as Jamba's multi-token scan starts from zero.)
    draft_tree_equals_recomputation(family, max_step=16)


def draft_tree_equals_recomputation(model: Any, max_step: int = 8) -> None:
    """Each node's recurrent state follows its parent (mixers run node by node in the tree
    forward), and commit_tree copies the accepted path's state slots into place."""
    from test_transformers_trees import PARENTS, no_cache_logits, root_path

    g = torch.Generator().manual_seed(3)
    history = torch.randint(3, VOCAB, (1, 11), generator=g).tolist()[0]
    tokens = torch.randint(3, VOCAB, (len(PARENTS),), generator=g).tolist()
    cache = KVCoreCache(model.config, max_step=max_step, capacity=64)
    with torch.no_grad():
        prefill(model, cache, torch.tensor([history]))
        rows = verify_tree(model, cache, tokens, PARENTS)
    for node in range(len(PARENTS)):
        ids = history + [tokens[i] for i in root_path(PARENTS, node)]
        assert float((rows[node] - no_cache_logits(model, ids)).abs().max()) <= TOL, node
    path = root_path(PARENTS, 4)  # 0 2 4: off the main line, state slots copied
    cache.commit_tree(path)
    accepted = history + [tokens[i] for i in path]
    with torch.no_grad():
        for t in (7, 9, 11):  # decoding goes on from the accepted path's states
            accepted.append(t)
            out = prefill(model, cache, torch.tensor([[t]])).logits[0, -1].float()
            assert float((out - no_cache_logits(model, accepted)).abs().max()) <= TOL


def test_a_tree_forward_whose_mixers_run_over_all_nodes_is_refused_and_changes_nothing() -> None:
    model = qwen3_next()
    cache = KVCoreCache(model.config, max_step=8)
    with torch.no_grad():
        prefill(model, cache, prompt(6))
    with pytest.raises(kvcore.InvalidStateError, match=r"tree_node: no draft tree is begun"):
        cache.tree_node(0)
    step = cache.begin_tree([-1, 0, 0])
    with pytest.raises(kvcore.InvalidArgumentError, match=r"tree_node\(3\): the draft tree has nodes \[0, 3\)"):
        cache.tree_node(3)
    masks = cache.attention_masks(model.config, 3)
    positions = torch.tensor(step.positions.tolist())[None]
    with torch.no_grad(), pytest.raises(kvcore.InvalidStateError, match=r"over a draft tree of 3 nodes: each node reads"):
        model(input_ids=prompt(3), position_ids=positions, attention_mask=masks, cache=cache, use_cache=True)
    cache.discard_forward()
    assert cache.get_seq_length() == 6 and cache.sequence.active_step is None
    with torch.no_grad():  # and the cache goes on exactly
        out = prefill(model, cache, prompt(1, seed=9)).logits[0, -1].float()
        ref = model(input_ids=torch.cat([prompt(6), prompt(1, seed=9)], 1)).logits[0, -1].float()
    assert float((out - ref).abs().max()) <= TOL


@pytest.mark.parametrize("build", [qwen3_next, granite, lfm2], ids=["qwen3_next", "granite", "lfm2"])
def test_tree_speculative_decoding_on_a_hybrid_equals_greedy(build: Any) -> None:
    # The documented loop (docs/transformers.md, "Draft trees on hybrid models"): per forward a tree
    # whose main line is a wrong guess and whose side branch holds the true next tokens, so every
    # accepted path leaves the main line and its state slots are copied into place.
    model = build()
    ids = repetitive_prompt()
    want = generate(model, ids, 12, do_sample=False).sequences[0].tolist()
    n = ids.shape[1]

    def draft(at: int) -> tuple[list[int], list[int]]:
        """The tree after the pending token at position ``at``: nodes and parents (0 = the pending)."""
        true = want[at + 1 : at + 3]
        wrong = [(t + 1) % VOCAB for t in true]
        return wrong + true, [0, 1][: len(wrong)] + [0, len(wrong) + 1][: len(true)]

    cache = KVCoreCache(model.config, max_step=8)
    with torch.no_grad():
        pending = int(prefill(model, cache, ids).logits[0, -1].argmax())
        out, off_main = [pending], 0
        while len(out) < 12:
            nodes, parents = draft(n + len(out) - 1)
            nodes, parents = [pending] + nodes, [-1] + parents
            rows = verify_tree(model, cache, nodes, parents)
            choice = rows.argmax(-1).tolist()
            path = [0]
            while len(out) + len(path) <= 12:  # follow the child the model agrees with
                kids = [i for i in range(len(nodes)) if parents[i] == path[-1] and nodes[i] == choice[path[-1]]]
                if not kids:
                    break
                path.append(kids[0])
            cache.commit_tree(path)
            off_main += path != list(range(len(path)))
            out += [nodes[i] for i in path[1:]]
            pending = choice[path[-1]]
            out.append(pending)
    assert want[: n + 12] == want[:n] + out[:12]
    assert off_main > 0


def test_bad_conv_input_aborts_the_forward_and_changes_nothing() -> None:
    model = lfm2()
    ids = prompt(10)
    cache = KVCoreCache(model.config, max_step=8)
    with torch.no_grad():
        prefill(model, cache, ids[:, :6])
        cache.get_mask_sizes(2, 1)  # what the model's mask function announces
        with pytest.raises(kvcore.InvalidArgumentError, match=r"update_conv_state of layer 0: conv_states \(1, 32, 3\) "
                                                             r"must be \[batch, channels, 2\]"):  # fmt: skip
            cache.update_conv_state(torch.zeros(1, 32, 3), 0, conv_kernel_size=3)
        assert cache.sequence.active_step is None and cache.get_seq_length() == 6
        out = prefill(model, cache, ids[:, 6:10]).logits[:, -1]
        ref = model(input_ids=ids, use_cache=False).logits[:, -1]
    assert float((out - ref).abs().max()) <= TOL


def test_a_state_call_without_a_token_count_is_refused() -> None:
    cache = KVCoreCache(lfm2().config, max_step=8)
    with pytest.raises(kvcore.InvalidStateError, match=r"layer 0 holds a recurrent state and its calls carry no token"):
        cache.get_conv_state(0)
    assert cache.sequence.active_step is None


def test_state_calls_out_of_layer_order_are_refused() -> None:
    cache = KVCoreCache(lfm2().config, max_step=8)
    cache.get_mask_sizes(2, 1)
    assert cache.get_conv_state(0) is None  # position 0: no previous state
    with pytest.raises(kvcore.InvalidStateError, match=r"state call of layer 2: a forward serves layers 0..3 in "
                                                       r"order, and layer 1 is next"):  # fmt: skip
        cache.get_conv_state(2)
    assert cache.sequence.active_step is None  # the forward was aborted
    with pytest.raises(kvcore.InvalidArgumentError, match=r"layer 1: not a recurrent-state layer of this cache"):
        cache.get_conv_state(1)


# --- memory -------------------------------------------------------------------------------


def test_state_bytes_are_slots_times_dynamic_caches(model: Any) -> None:
    ids = prompt(12)
    dynamic = transformers.DynamicCache(config=model.config)
    cache = KVCoreCache(model.config, max_step=8)
    with torch.no_grad():
        model(input_ids=ids, cache=dynamic, use_cache=True)
        prefill(model, cache, ids)
    for i in state_layer_indices(model):
        layer = dynamic.layers[i]
        held = sum(t.numel() * t.element_size() for d in (layer.conv_states, layer.recurrent_states)
                   for t in d.values() if t is not None)  # fmt: skip
        assert cache.state.nbytes(i) == 9 * held  # D = min(8, 8) + 1 snapshots


def held_bytes_match_the_memory_planner(model: Any, tmp_path: Any) -> None:
    """After a prefill, what KVCoreCache holds equals what the memory planner (``kvcore memory
    --hf-config``) plans for the model's config.json at capacity 64, max_step 8, float32: K/V rows
    and state slots (cache.nbytes(i): a state layer's is cache.state.nbytes(i)), layer by layer
    and in total."""
    from kvcore.hf_config import model_shape_from_hf
    from kvcore.memory import plan_memory

    cache = KVCoreCache(model.config, max_step=8, capacity=64, initial_capacity=64)
    with torch.no_grad():
        prefill(model, cache, prompt(12))  # allocates every K/V layer and every state slot
    path = tmp_path / "config.json"
    model.config.to_json_file(path)
    plan = plan_memory(model_shape_from_hf(path), context=64, max_step=8, dtype="float32", state_dtype="float32")
    planned = {i: (k.kind, k.bytes_per_layer) for k in plan.kinds for i in k.layers}
    assert sorted(planned) == list(range(len(cache.layers)))
    # The planner's state layers are transformers' (get_layer_types_and_kwargs) and the cache's.
    state = [i for i, (kind, _) in sorted(planned.items()) if kind == "state"]
    if model.config.model_type == "falcon_h1":  # its states are appended after its n "hybrid" layers
        n = model.config.num_hidden_layers
        assert state == [s.layer_idx for s in cache.state_layers] == list(cache.state.layers) == list(range(n, 2 * n))
    else:
        assert state == state_layer_indices(model) == list(cache.state.layers)
    held = {i: cache.nbytes(i) for i in planned}
    assert all(held[i] == cache.state.nbytes(i) for i in state)
    assert held == {i: b for i, (_, b) in planned.items()}
    assert all(held[i] > 0 for i in state)
    assert sum(held.values()) == plan.total_bytes == cache.nbytes() == cache.pool.nbytes() + cache.state.nbytes()
    # Layers without attention or state (transformers' "dummy": Nemotron-H's "-") hold nothing, planned as nothing.
    dummy = [i for i, t in enumerate(cache.layer_types) if t == "dummy"]
    assert [i for i, (kind, _) in sorted(planned.items()) if kind == "empty"] == dummy
    assert all(held[i] == 0 for i in dummy)


def test_held_bytes_match_the_memory_planner(model: Any, tmp_path: Any) -> None:
    held_bytes_match_the_memory_planner(model, tmp_path)


def test_held_bytes_of_the_other_hybrid_families_match_the_memory_planner(family: Any, tmp_path: Any) -> None:
    held_bytes_match_the_memory_planner(family, tmp_path)
    if family.config.model_type == "nemotron_h":
        assert "dummy" in KVCoreCache(family.config, max_step=8).layer_types  # the "-" layer was checked


def one_column_too_many(module: Any, args: Any, kwargs: dict[str, Any]) -> Any:
    """A forward pre-hook giving a conv layer one more input column than tokens (a bad update_conv_state)."""
    h = kwargs["hidden_states"]
    return args, {**kwargs, "hidden_states": torch.cat([h, h[:, -1:]], dim=1)}


def test_an_error_in_the_last_layers_state_call_after_its_commit_rewinds_the_forward() -> None:
    # LFM2's last layer holds a state: the forward commits at its first call (get_conv_state),
    # and a bad update after it rewinds the cache to where the forward began.
    model = lfm2()
    ids = prompt(10)
    cache = KVCoreCache(model.config, max_step=8)
    conv = model.model.layers[3].conv

    with torch.no_grad():
        prefill(model, cache, ids[:, :6])
        hook = conv.register_forward_pre_hook(one_column_too_many, with_kwargs=True)
        try:
            bad = r"update_conv_state of layer 3: conv_states \(1, 32, 3\) must be \[batch, channels, 2\]"
            with pytest.raises(kvcore.InvalidArgumentError, match=bad):
                model(input_ids=ids[:, 6:8], cache=cache, use_cache=True)
        finally:
            hook.remove()
        assert cache.get_seq_length() == 6 and cache.sequence.active_step is None
        out = prefill(model, cache, ids[:, 6:10]).logits[:, -1]
        ref = model(input_ids=ids, use_cache=False).logits[:, -1]
    assert float((out - ref).abs().max()) <= TOL


def test_a_verify_step_whose_last_layer_fails_cannot_be_committed() -> None:
    model = lfm2()
    ids = prompt(10)
    cache = KVCoreCache(model.config, max_step=8)
    conv = model.model.layers[3].conv

    with torch.no_grad():
        prefill(model, cache, ids[:, :6])
        cache.begin_verify(2)
        hook = conv.register_forward_pre_hook(one_column_too_many, with_kwargs=True)
        try:
            with pytest.raises(kvcore.InvalidArgumentError, match=r"update_conv_state of layer 3"):
                model(input_ids=ids[:, 6:8], cache=cache, use_cache=True)
        finally:
            hook.remove()
        with pytest.raises(kvcore.InvalidStateError, match=r"commit_tree: no verified draft tree or verify step"):
            cache.commit_verify(2)
        assert cache.get_seq_length() == 6 and cache.sequence.active_step is None
        out = prefill(model, cache, ids[:, 6:10]).logits[:, -1]
        ref = model(input_ids=ids, use_cache=False).logits[:, -1]
    assert float((out - ref).abs().max()) <= TOL


def test_deepcopy_continues_identically_and_independently(model: Any) -> None:
    import copy

    ids = prompt(14)
    cache = KVCoreCache(model.config, max_step=8)
    with torch.no_grad():
        prefill(model, cache, ids[:, :10])
        twin = copy.deepcopy(cache)
        a = prefill(model, cache, ids[:, 10:14]).logits[:, -1]
        assert twin.get_seq_length() == 10  # the original's forward did not touch the copy
        b = prefill(model, twin, ids[:, 10:14]).logits[:, -1]
    assert torch.equal(a, b) and twin.state is not cache.state and twin.state.cache is twin.sequence


def test_records_of_a_hybrid_cache_are_refused_by_name_and_change_nothing() -> None:
    # The torch pool's records carry K/V rows only: a model with State layers is refused at
    # export and at import (not a helper pool's complaint about missing state tensors).
    model = lfm2()
    cache = KVCoreCache(model.config, max_step=8)
    with torch.no_grad():
        prefill(model, cache, prompt(6))
    with pytest.raises(kvcore.NotSupportedError, match=r"export: layer 0 is a State layer; records do not carry"):
        cache.pool.export_sequence()
    fresh = KVCoreCache(model.config, max_step=8)
    with pytest.raises(kvcore.NotSupportedError, match=r"import: layer 0 is a State layer; records do not carry"):
        fresh.pool.import_sequence(b"\0" * 64)
    assert cache.get_seq_length() == 6 and fresh.get_seq_length() == 0
