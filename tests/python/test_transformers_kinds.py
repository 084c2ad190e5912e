"""KVCoreCache on chunked attention (Llama 4) and KV-shared layers (Gemma 3n), against DynamicCache.

Tiny random models built from configs (no download), float32: a Llama 4 text model with
chunks of 8 (layers 0-2 chunked, layer 3 full NoPE with temperature tuning) and a Gemma 3n
text model whose last two layers read the K/V of layers 2 (sliding, window 8) and 3 (full).
Prompts are longer than two chunks / windows, and ``max_step`` makes the chunked prefill
cross chunk boundaries. The reference is transformers' own cache (or no cache at all, for
rewinds and draft trees); float32 logits must agree within 1e-5.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import pytest
from needs import need

torch = need("torch", reason="the transformers integration needs torch")
transformers = need("transformers", reason="the transformers integration needs transformers")

import kvcore  # noqa: E402
from kvcore.hf_config import model_shape_from_hf  # noqa: E402
from kvcore.integrations.transformers import (  # noqa: E402
    KVCoreCache,
    KVCoreSharedLayer,
    cache_config_for,
    prefill,
    verify_tree,
)
from kvcore.memory import kv_bytes  # noqa: E402
from kvcore.torch import TorchKVPool  # noqa: E402
from hf_generate import generate, max_diff, model_fixture, random_prompt  # noqa: E402

VOCAB = 256
CHUNK = WINDOW = 8
TOL = 1e-5
S, F, C = "sliding_attention", "full_attention", "chunked_attention"

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def llama4(attn: str = "eager") -> Any:
    torch.manual_seed(0)
    cfg = transformers.Llama4TextConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=64, intermediate_size_mlp=128, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, attention_chunk_size=CHUNK,
        num_local_experts=2, max_position_embeddings=256, floor_scale=4, attn_implementation=attn,
        pad_token_id=0, eos_token_id=1, bos_token_id=2,
    )  # fmt: skip
    return transformers.Llama4ForCausalLM(cfg).eval()


def gemma3n(attn: str = "eager") -> Any:
    torch.manual_seed(0)
    types = [S, F, S, F, S, F]
    cfg = transformers.Gemma3nTextConfig(
        vocab_size=VOCAB, vocab_size_per_layer_input=VOCAB, hidden_size=64, hidden_size_per_layer_input=8,
        intermediate_size=128, num_hidden_layers=len(types), num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, sliding_window=WINDOW, layer_types=types, num_kv_shared_layers=2, laurel_rank=4,
        altup_num_inputs=2, activation_sparsity_pattern=[0.0] * len(types), max_position_embeddings=256,
        attn_implementation=attn,
    )  # fmt: skip
    return transformers.Gemma3nForCausalLM(cfg).eval()


MODELS = {"llama4": llama4, "gemma3n": gemma3n}


model = model_fixture(MODELS)
prompt = partial(random_prompt, vocab=VOCAB)


# --- the config ----------------------------------------------------------------------------


def test_cache_config_reads_chunked_and_shared_layers() -> None:
    cfg, types = cache_config_for(llama4().config, max_step=4)
    assert types == [C, C, C, F]
    assert [str(layer.policy) for layer in cfg.layers] == ["Chunked(chunk=8)"] * 3 + ["Flat()"]
    g3n = gemma3n()
    cfg, types = cache_config_for(g3n.config, max_step=4)
    assert types == [S, F, S, F, S, F]  # a shared layer reports its attention type: the model's masks key
    assert [str(layer.policy) for layer in cfg.layers][4:] == ["Shared(source=2)", "Shared(source=3)"]
    cache = KVCoreCache(g3n.config, max_step=4)
    assert isinstance(cache.layers[4], KVCoreSharedLayer) and cache.writing_layers == [0, 1, 2, 3]
    assert cache.rows(4) == cache.rows(5) == 0 and cache.layers[4].keys is None
    with torch.no_grad():
        prefill(g3n, cache, prompt(12))
    assert cache.layers[4].get_mask_sizes(3) == cache.layers[2].get_mask_sizes(3) == (WINDOW - 1 + 3, 12 - WINDOW + 1)
    assert cache.layers[5].get_mask_sizes(3) == cache.layers[3].get_mask_sizes(3) == (15, 0)


def test_the_cache_reads_the_layers_config_from_hf_reads(model: Any) -> None:
    cfg, _ = cache_config_for(model.config, capacity=256)
    planned = kvcore.config_from_hf(model.config.to_dict(), context=256)
    assert [layer.policy for layer in cfg.layers] == [layer.policy for layer in planned.layers]


def test_a_layer_without_a_storing_source_is_refused_by_name() -> None:
    cfg = gemma3n().config
    modes = [None, None, None, None, "reuse", "reuse"]  # nothing stores the K/V the last layers reuse
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(type(cfg), "kv_sharing_modes", property(lambda self: modes))
        with pytest.raises(kvcore.NotSupportedError, match=r"layer 4 reuses the K/V of an earlier 'sliding_attention'"):
            cache_config_for(cfg)


# --- generate ------------------------------------------------------------------------------


@pytest.mark.parametrize("mirror", [True, False], ids=["mirrored", "compact"])
@pytest.mark.parametrize(("prompt_len", "max_step"), [(5, 16), (21, 6), (21, 4)], ids=["short", "prefill-6", "prefill-4"])
def test_greedy_generate_matches_dynamic_cache(model: Any, prompt_len: int, max_step: int, mirror: bool) -> None:
    ids = prompt(prompt_len)
    ref = generate(model, ids, 24, do_sample=False)
    cache = KVCoreCache(model.config, max_step=max_step, mirror_rings=mirror)
    out = generate(model, ids, 24, do_sample=False, cache=cache, prefill_chunk_size=max_step)
    assert torch.equal(out.sequences, ref.sequences)
    assert max_diff(out.logits, ref.logits) <= TOL
    assert len(set(ref.sequences[0, prompt_len:].tolist())) > 3  # not one token repeated
    assert cache.get_seq_length() == ref.sequences.shape[1] - 1
    ring = 0  # layer 0 is chunked (Llama 4) or sliding (Gemma 3n): its rows wrapped
    assert cache.get_seq_length() > cache.rows(ring) + 1 == CHUNK + max_step
    assert (cache.pool.workspace_nbytes == 0) == mirror  # compact rings gathered wrapped reads


def test_seeded_sampling_matches_dynamic_cache(model: Any) -> None:
    ids = prompt(19, seed=2)
    kwargs = {"do_sample": True, "temperature": 1.5, "top_k": 0}
    torch.manual_seed(7)
    ref = generate(model, ids, 24, **kwargs)
    torch.manual_seed(7)
    out = generate(model, ids, 24, cache=KVCoreCache(model.config, max_step=5), prefill_chunk_size=5, **kwargs)
    assert torch.equal(out.sequences, ref.sequences) and max_diff(out.logits, ref.logits) <= TOL


@pytest.mark.parametrize("name", sorted(MODELS))
def test_sdpa_attention_matches_dynamic_cache(name: str) -> None:
    model = MODELS[name]("sdpa")
    ids = prompt(21, seed=3)
    ref = generate(model, ids, 16, do_sample=False)
    out = generate(model, ids, 16, do_sample=False, cache=KVCoreCache(model.config, max_step=6), prefill_chunk_size=6)
    assert torch.equal(out.sequences, ref.sequences) and max_diff(out.logits, ref.logits) <= TOL


def test_gemma3n_batches_with_left_padding_and_beams_match_dynamic_cache() -> None:
    model = gemma3n()
    ids = torch.cat([prompt(14, seed=8), prompt(14, seed=9)])
    mask = torch.ones_like(ids)
    ids[0, :3], mask[0, :3] = 0, 0
    ref = generate(model, ids, 16, do_sample=False, attention_mask=mask)
    out = generate(model, ids, 16, do_sample=False, attention_mask=mask, cache=KVCoreCache(model.config, max_step=16))
    assert torch.equal(out.sequences, ref.sequences) and max_diff(out.logits, ref.logits) <= TOL
    ref = generate(model, ids[1:], 16, do_sample=False, num_beams=3)  # beams reorder the batch rows each step
    out = generate(model, ids[1:], 16, do_sample=False, num_beams=3, cache=KVCoreCache(model.config, max_step=16))
    assert torch.equal(out.sequences, ref.sequences)


def test_quantized_rows_serve_shared_layers_their_sources_keys() -> None:
    # The source's dequantized K/V live in a workspace the next layers reuse: the cache keeps a
    # copy for the shared layers. Against a cache that copies every layer's output, exactly.
    model = gemma3n()
    ids = prompt(21, seed=4)
    ours = KVCoreCache(model.config, max_step=6, kv_dtype="int8")
    ref = generate(model, ids, 12, do_sample=False)
    out = generate(model, ids, 12, do_sample=False, cache=ours, prefill_chunk_size=6)
    assert max_diff(out.logits, ref.logits) < 0.05  # int8 rows: close to the float32 reference
    copying = KVCoreCache(model.config, max_step=6, kv_dtype="int8")
    copying._sources = frozenset(range(6))  # every layer's output copied: nothing can be overwritten
    again = generate(model, ids, 12, do_sample=False, cache=copying, prefill_chunk_size=6)
    assert torch.equal(again.sequences, out.sequences) and max_diff(again.logits, out.logits) == 0


# --- crop / rewind ---------------------------------------------------------------------------


def test_crop_after_the_rings_wrapped_is_exact_where_can_rewind_allows(model: Any) -> None:
    ids = prompt(40, seed=5)
    cache = KVCoreCache(model.config, max_step=4)
    with torch.no_grad():
        prefill(model, cache, ids[:, :36])
        assert cache.get_seq_length() == 36 > cache.rows(0)  # layer 0's ring wrapped
        assert cache.can_rewind(33) and not cache.can_rewind(20)
        with pytest.raises(kvcore.InvalidStateError, match="rewind"):
            cache.crop(-16)
        assert cache.get_seq_length() == 36  # the refused crop changed nothing
        cache.crop(-3)  # to 33: then feed positions 33..39
        out = prefill(model, cache, ids[:, 33:40])
        ref = model(input_ids=ids, use_cache=False)
    assert cache.get_seq_length() == 40
    assert float((out.logits[:, -1] - ref.logits[:, -1]).abs().max()) <= TOL


def test_a_draft_tree_on_gemma3n_equals_recomputation_and_commits_off_the_main_line() -> None:
    from test_transformers_trees import PARENTS, no_cache_logits, root_path

    model = gemma3n()
    g = torch.Generator().manual_seed(3)
    history = torch.randint(3, VOCAB, (1, 13), generator=g).tolist()[0]  # past the window of 8
    tokens = torch.randint(3, VOCAB, (len(PARENTS),), generator=g).tolist()
    cache = KVCoreCache(model.config, max_step=6, capacity=64)
    with torch.no_grad():
        prefill(model, cache, torch.tensor([history]))
        rows = verify_tree(model, cache, tokens, PARENTS)
    for node in range(len(PARENTS)):  # the shared layers attend over their sources' tree rows
        ids = history + [tokens[i] for i in root_path(PARENTS, node)]
        assert float((rows[node] - no_cache_logits(model, ids)).abs().max()) <= TOL, node
    path = root_path(PARENTS, 4)  # off the main line: row copies
    cache.commit_tree(path)
    accepted = history + [tokens[i] for i in path] + [7]
    with torch.no_grad():
        out = prefill(model, cache, torch.tensor([[7]])).logits[0, -1].float()
    assert float((out - no_cache_logits(model, accepted)).abs().max()) <= TOL


# --- memory --------------------------------------------------------------------------------


def test_nbytes_matches_the_memory_planner(model: Any, tmp_path: Any) -> None:
    capacity, max_step = 64, 4
    cache = KVCoreCache(model.config, max_step=max_step, capacity=capacity, initial_capacity=capacity,
                        mirror_rings=False)  # fmt: skip
    with torch.no_grad():
        prefill(model, cache, prompt(4))  # allocates every layer that holds rows
    path = tmp_path / "config.json"
    model.config.to_json_file(path)
    planned = kv_bytes(model_shape_from_hf(path), capacity, max_step=max_step, dtype="float32")
    assert cache.nbytes() == planned
    shared = [i for i in range(len(cache.layers)) if i not in cache.writing_layers]
    assert all(cache.nbytes(i) == 0 for i in shared)


# --- refusals ------------------------------------------------------------------------------


def test_updating_a_shared_layer_is_refused_and_changes_nothing() -> None:
    model = gemma3n()
    ids = prompt(12, seed=6)
    cache = KVCoreCache(model.config, max_step=8)
    with torch.no_grad():
        prefill(model, cache, ids[:, :8])
        k = torch.zeros(1, 2, 4, 16)
        with pytest.raises(kvcore.InvalidArgumentError, match=r"update of layer 4: it shares layer 2's K/V"):
            cache.update(k, k, 4)
        with pytest.raises(kvcore.InvalidArgumentError, match=r"update of layer 5: it shares layer 3's K/V"):
            cache.layers[5].update(k, k)
        assert cache.get_seq_length() == 8 and cache.sequence.active_step is None
        out = prefill(model, cache, ids[:, 8:])
        ref = model(input_ids=ids, use_cache=False)
    assert float((out.logits[:, -1] - ref.logits[:, -1]).abs().max()) <= TOL


def test_a_batch_on_chunked_layers_is_refused_before_anything_changes() -> None:
    model = llama4()
    cache = KVCoreCache(model.config, max_step=8)
    ids = prompt(6).repeat(2, 1)
    with torch.no_grad(), pytest.raises(kvcore.NotSupportedError, match=r"a batch of 2 sequences on chunked layers"):
        model(input_ids=ids, use_cache=True, cache=cache)
    assert cache.get_seq_length() == 0 and cache.sequence.active_step is None and cache.nbytes() == 0
    ref = generate(model, ids[:1], 8, do_sample=False)  # one sequence is served
    assert torch.equal(generate(model, ids[:1], 8, do_sample=False, cache=cache).sequences, ref.sequences)


def test_torch_pool_hands_a_shared_layer_its_sources_rows() -> None:
    kv = lambda policy: kvcore.LayerConfig(policy, n_kv_heads=1, head_dim=4)  # noqa: E731
    seq = kvcore.SequenceCache(kvcore.CacheConfig(
        capacity=64, layers=[kv(kvcore.Chunked(4)), kv(kvcore.Flat()), kv(kvcore.Shared(0))], max_step=3))  # fmt: skip
    pool = TorchKVPool(seq, order="positions", mirror_rings=True)
    rows: list[torch.Tensor] = []
    for t in range(4):  # positions 0..11 in steps of 3: chunk boundaries at 4 and 8 inside steps
        step = seq.begin_step(3)
        new = torch.arange(3 * t, 3 * t + 3, dtype=torch.float32).view(1, 1, 3, 1).expand(1, 1, 3, 4)
        with pytest.raises(kvcore.InvalidStateError, match=r"read of layer 2: layer 0 has not written"):
            pool.read(2, step)
        keys, _ = pool.update(0, step, new, new)
        pool.update(1, step, new, new)
        with pytest.raises(kvcore.InvalidArgumentError, match=r"update of layer 2: it is Shared\(0\)"):
            pool.update(2, step, new, new)
        shared, _ = pool.read(2, step)
        assert torch.equal(shared, keys)
        # The chunk of the step's first query onwards, in position order.
        first = 4 * ((3 * t) // 4)
        assert shared[0, 0, :, 0].tolist() == [float(p) for p in range(first, 3 * t + 3)]
        rows.append(shared)
        seq.commit(step)
    with pytest.raises(kvcore.InvalidArgumentError, match=r"allocate of layer 2: it is Shared\(0\)"):
        pool.allocate(2, batch_size=1, dtype=torch.float32, device="cpu")
    assert pool.layer(2) is None and pool.nbytes(2) == 0 and pool.mirror_rows(2) == 0
    assert pool.nbytes() == pool.nbytes(0) + pool.nbytes(1)


def test_a_quantized_torch_pool_reads_a_shared_layer_dequantized() -> None:
    from kvcore.torch import TorchQuantizedKVPool

    kv = lambda policy: kvcore.LayerConfig(policy, n_kv_heads=2, head_dim=4)  # noqa: E731
    seq = kvcore.SequenceCache(kvcore.CacheConfig(
        capacity=32, layers=[kv(kvcore.Ring(4)), kv(kvcore.Shared(0))], max_step=2))  # fmt: skip
    pool = TorchQuantizedKVPool(seq, "int8", order="positions")
    step = seq.begin_step(2)
    new = torch.randn(1, 2, 2, 4)
    keys, values = pool.update(0, step, new, new)
    keys, values = keys.clone(), values.clone()
    with pytest.raises(kvcore.InvalidArgumentError, match=r"read: dtype = torch.int8: a quantized pool returns"):
        pool.read(1, step, dtype=torch.int8)
    shared_k, shared_v = pool.read(1, step)
    assert shared_k.dtype == torch.float32 and torch.equal(shared_k, keys) and torch.equal(shared_v, values)
    assert float((shared_k - new).abs().max()) < 0.05  # int8 rows of the written values
    assert pool.read(1, step, dtype=torch.bfloat16)[0].dtype == torch.bfloat16


def test_continuous_batching_serves_chunked_and_shared_models(model: Any) -> None:
    # (tests/python/test_hf_batch.py holds the full continuous-batching suite of both kinds.)
    from kvcore.integrations.transformers import generate_batch

    gen = transformers.GenerationConfig(max_new_tokens=4, do_sample=False, eos_token_id=-1, pad_token_id=0)
    prompts = [prompt(11, seed=s)[0].tolist() for s in (1, 2)]  # past a chunk / window of 8
    out = generate_batch(model, prompts, gen, block_size=4, max_batch_tokens=16, capacity=32)
    want = [model.generate(torch.tensor([p]), generation_config=gen)[0, len(p) :].tolist() for p in prompts]
    assert [list(r.generated_tokens) for r in out.values()] == want


