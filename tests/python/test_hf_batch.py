"""transformers' continuous batching served by kvcore (kvcore.integrations.transformers_batch).

Tiny random models of ten architectures; each run is checked token for token
against transformers' own ``generate_batch`` and ``generate()`` per prompt.
transformers' own runs get an explicit small cache (``num_blocks``), else it
sizes its cache from the machine's memory and takes a minute per run.
"""

from __future__ import annotations

from typing import Any

import pytest
from needs import need

torch = need("torch", reason="the transformers integration needs torch")
transformers = need("transformers", reason="the transformers integration needs transformers")

from transformers import GenerationConfig  # noqa: E402
from transformers.generation.configuration_utils import ContinuousBatchingConfig  # noqa: E402

import kvcore  # noqa: E402
from kvcore.integrations import transformers_batch as hf_batch  # noqa: E402
from kvcore.integrations.transformers import BatchCounters, KVCoreBatchingManager, generate_batch  # noqa: E402

VOCAB, WINDOW = 128, 8
S, F = "sliding_attention", "full_attention"
OPTIONS = dict(block_size=4, max_batch_tokens=16, capacity=64)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def build(name: str) -> Any:
    """A tiny random model of one architecture (eager attention where transformers has no sdpa)."""
    t = transformers
    attn = "eager" if name in ("gemma2", "gpt_oss") else "sdpa"
    common: dict[str, Any] = dict(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=256, attn_implementation=attn,
        pad_token_id=0, eos_token_id=1, bos_token_id=2,
    )  # fmt: skip
    mixed = dict(sliding_window=WINDOW, layer_types=[S, F])
    torch.manual_seed(0)
    configs = {
        "llama": lambda: t.LlamaForCausalLM(t.LlamaConfig(**common)),
        "qwen3": lambda: t.Qwen3ForCausalLM(t.Qwen3Config(**common)),
        "mistral_window": lambda: t.MistralForCausalLM(t.MistralConfig(sliding_window=WINDOW, **common)),
        "gemma2": lambda: t.Gemma2ForCausalLM(t.Gemma2Config(final_logit_softcapping=None, **mixed, **common)),
        "gemma3": lambda: t.Gemma3ForCausalLM(t.Gemma3TextConfig(**mixed, **common)),
        "gpt_oss": lambda: t.GptOssForCausalLM(
            t.GptOssConfig(num_local_experts=4, num_experts_per_tok=2, **mixed, **common)
        ),
        "cohere2": lambda: t.Cohere2ForCausalLM(t.Cohere2Config(**mixed, **common)),
        "qwen2_moe": lambda: t.Qwen2MoeForCausalLM(
            t.Qwen2MoeConfig(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                             shared_expert_intermediate_size=32, **common)  # fmt: skip
        ),
        # Llama 4: layers 0-2 chunked (chunks of WINDOW), layer 3 full NoPE with temperature tuning
        # (floor_scale 4, attn_scale 2: its query scale changes every 4 positions, enough to change tokens).
        "llama4": lambda: t.Llama4ForCausalLM(
            t.Llama4TextConfig(**{**common, "num_hidden_layers": 4}, intermediate_size_mlp=64,
                               attention_chunk_size=WINDOW, num_local_experts=2, floor_scale=4, attn_scale=2.0)  # fmt: skip
        ),
        # Gemma 3n: its last two layers read the K/V of layers 2 (sliding) and 3 (full), writing none.
        "gemma3n": lambda: t.Gemma3nForCausalLM(
            t.Gemma3nTextConfig(**{**common, "num_hidden_layers": 6}, vocab_size_per_layer_input=VOCAB,
                                hidden_size_per_layer_input=8, sliding_window=WINDOW, layer_types=[S, F] * 3,
                                num_kv_shared_layers=2, laurel_rank=4, altup_num_inputs=2,
                                activation_sparsity_pattern=[0.0] * 6)  # fmt: skip
        ),
    }
    return configs[name]().eval()


ARCHS = ["llama", "qwen3", "mistral_window", "gemma2", "gemma3", "gpt_oss", "cohere2", "qwen2_moe", "gemma3n"]
_models: dict[str, Any] = {}


def model(name: str) -> Any:
    if name not in _models:
        _models[name] = build(name)
    return _models[name]


def tokens(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (n,), generator=g).tolist()


SYSTEM = tokens(12, 100)  # a shared system prompt: 3 blocks of 4
PROMPTS = [SYSTEM + tokens(n, i) for i, n in enumerate((3, 9, 14))]  # 15..26 tokens: all longer than the window


def greedy(new: int = 6, **kw: Any) -> GenerationConfig:
    return GenerationConfig(max_new_tokens=new, do_sample=False, eos_token_id=-1, pad_token_id=0, **kw)


def transformers_own(m: Any, prompts: list[list[int]], gen: GenerationConfig) -> dict[str, Any]:
    cb = ContinuousBatchingConfig(num_blocks=64, max_batch_tokens=32)
    return m.generate_batch(prompts, generation_config=gen, continuous_batching_config=cb)


def generated(out: dict[str, Any]) -> dict[str, list[int]]:
    return {k: list(v.generated_tokens) for k, v in out.items()}


def one_by_one(m: Any, prompts: list[list[int]], gen: GenerationConfig) -> list[list[int]]:
    return [m.generate(torch.tensor([p]), generation_config=gen)[0, len(p) :].tolist() for p in prompts]


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_outputs_equal_transformers_generate_batch_and_generate(arch: str) -> None:
    m = model(arch)
    gen = greedy()
    counters = BatchCounters()
    ours = generate_batch(m, PROMPTS, gen, counters=counters, **OPTIONS)
    theirs = transformers_own(m, PROMPTS, gen)
    assert list(ours) == list(theirs) == ["req_0", "req_1", "req_2"]
    assert generated(ours) == generated(theirs)
    assert list(generated(ours).values()) == one_by_one(m, PROMPTS, gen)
    assert all(r.error is None and r.is_finished() for r in ours.values())
    # Requests after the first in a forward adopt the shared system prompt (sliding layers too).
    assert counters.prefix_hit_tokens > 0
    assert counters.prompt_tokens_computed == sum(map(len, PROMPTS)) - counters.prefix_hit_tokens
    assert counters.peak_blocks > 0 and counters.peak_kv_bytes > 0


@pytest.mark.parametrize("arch", ["llama", "gemma3", "gemma3n"])
@pytest.mark.parametrize("samples", [2, 3])
def test_parallel_samples_fork_the_prompt_and_equal_greedy(arch: str, samples: int) -> None:
    m = model(arch)
    # top_k = 1 samples the argmax: every sample must be the greedy continuation.
    gen = GenerationConfig(max_new_tokens=5, do_sample=True, top_k=1, eos_token_id=-1, pad_token_id=0,
                           num_return_sequences=samples)  # fmt: skip
    counters = BatchCounters()
    ours = generate_batch(m, PROMPTS[:2], gen, counters=counters, **OPTIONS)
    expected = one_by_one(m, PROMPTS[:2], greedy(5))
    assert len(ours) == 2 * samples
    for i, want in enumerate(expected):
        ids = [f"req_{i}__child#{c}" for c in range(samples - 1)] + [f"req_{i}"]
        assert [list(ours[k].generated_tokens) for k in ids] == [want] * samples
    assert counters.forks == 2 * (samples - 1)
    # transformers prefills a request with children up to its last prompt token, forks there,
    # and each sample computes that token for its own logits: once more per fork, nothing else
    # twice (the fork shares every block).
    prompt = sum(map(len, PROMPTS[:2]))
    assert counters.prompt_tokens_computed == prompt + counters.forks - counters.prefix_hit_tokens
    assert generated(ours) == generated(transformers_own(m, PROMPTS[:2], gen))


def test_sampling_with_a_fixed_seed_equals_transformers_own() -> None:
    m = model("gemma3")
    gen = GenerationConfig(max_new_tokens=8, do_sample=True, temperature=1.0, top_k=0, top_p=1.0, eos_token_id=-1,
                           pad_token_id=0)  # fmt: skip
    prompt = [PROMPTS[1]]  # one request: both schedule it identically, so the draws line up
    cb = ContinuousBatchingConfig(seed=1234)
    given = repr(vars(cb))
    ours = generate_batch(m, prompt, gen, continuous_batching_config=cb, **OPTIONS)
    assert repr(vars(cb)) == given  # kvcore works on a copy, as transformers' own does
    theirs = m.generate_batch(prompt, generation_config=gen,
                              continuous_batching_config=ContinuousBatchingConfig(seed=1234, num_blocks=64, max_batch_tokens=16))  # fmt: skip
    assert generated(ours) == generated(theirs)


def test_llama4_chunked_layers_equal_generate_where_transformers_refuses() -> None:
    m = model("llama4")
    assert m.config.layer_types == ["chunked_attention"] * 3 + [F]
    gen = greedy(10)  # every prompt crosses chunk boundaries in prefill and in decoding
    counters = BatchCounters()
    ours = generate_batch(m, PROMPTS, gen, counters=counters, **OPTIONS)
    assert list(generated(ours).values()) == one_by_one(m, PROMPTS, gen)
    assert counters.prefix_hit_tokens > 0  # the system prompt's blocks, chunked group included
    # One request per forward: the later ones adopt the whole system prompt.
    counters = BatchCounters()
    ours = generate_batch(m, PROMPTS, greedy(4), counters=counters, block_size=4, max_batch_tokens=16, capacity=64,
                          max_seqs=1)  # fmt: skip
    assert list(generated(ours).values()) == one_by_one(m, PROMPTS, greedy(4))
    assert counters.prefix_hits == 2 and counters.prefix_hit_tokens == 2 * len(SYSTEM)
    # Parallel samples fork the prompt (top_k = 1: each is the greedy continuation).
    gen = GenerationConfig(max_new_tokens=5, do_sample=True, top_k=1, eos_token_id=-1, pad_token_id=0,
                           num_return_sequences=2)  # fmt: skip
    ours = generate_batch(m, PROMPTS[:2], gen, **OPTIONS)
    want = one_by_one(m, PROMPTS[:2], greedy(5))
    assert [list(ours[k].generated_tokens) for k in ("req_0__child#0", "req_0", "req_1__child#0", "req_1")] == [
        want[0], want[0], want[1], want[1]]  # fmt: skip
    with pytest.raises(ValueError, match="Invalid layer type: chunked_attention"):  # transformers' own
        transformers_own(m, PROMPTS, greedy())


def test_no_forward_carries_a_request_across_a_chunk_boundary(monkeypatch: pytest.MonkeyPatch) -> None:
    m = model("llama4")
    steps: list[tuple[int, int]] = []
    original = hf_batch.paged_cache.KVCorePagedCache.extend_read_and_write_indices

    def spy(self: Any, request_id: str, past_length: int, query_length: int, *rest: Any) -> None:
        steps.append((past_length, query_length))
        original(self, request_id, past_length, query_length, *rest)

    monkeypatch.setattr(hf_batch.paged_cache.KVCorePagedCache, "extend_read_and_write_indices", spy)
    generate_batch(m, PROMPTS, greedy(3), block_size=4, max_batch_tokens=32, capacity=64)
    assert any(q > 1 for _, q in steps)
    assert all(past // WINDOW == (past + q - 1) // WINDOW for past, q in steps), steps


def test_chunked_layers_beside_sliding_ones_are_refused_and_change_nothing() -> None:
    m = build("gemma3")
    m.config.layer_types = [S, "chunked_attention"]
    with pytest.raises(kvcore.NotSupportedError, match=r"kvcore serves 'chunked_attention' beside 'full_attention' only"):
        generate_batch(m, PROMPTS, greedy())
    assert getattr(m, "_cached_continuous_batching_manager", None) is None  # no manager left installed


@pytest.mark.parametrize("arch", ["gemma3", "gpt_oss", "gemma3n"])
def test_a_shared_system_prompt_is_reused_on_sliding_window_models(arch: str) -> None:
    m = model(arch)
    gen = greedy(4)
    # One request per forward (max_seqs = 1): each later request finds the system prompt cached.
    counters = BatchCounters()
    ours = generate_batch(m, PROMPTS, gen, counters=counters, block_size=4, max_batch_tokens=16, capacity=64, max_seqs=1)
    assert list(generated(ours).values()) == one_by_one(m, PROMPTS, gen)
    assert counters.prefix_hits == 2 and counters.prefix_hit_tokens == 2 * len(SYSTEM)
    # transformers' own turns sharing off for any model with a sliding layer.
    manager = m.init_continuous_batching(generation_config=gen,
                                         continuous_batching_config=ContinuousBatchingConfig(num_blocks=16, max_batch_tokens=16))  # fmt: skip
    assert manager._create_batch_processor().cache.use_prefix_sharing is False


@pytest.mark.parametrize("wait", [True, False])
def test_requests_admitted_together_wait_for_the_one_computing_their_shared_prompt(wait: bool) -> None:
    m = model("gemma3")
    gen = greedy(3)
    counters = BatchCounters()
    # A budget of 64 tokens, 16 per request: the three requests could all start in the first forward.
    ours = generate_batch(m, PROMPTS, gen, counters=counters, wait_for_shared_prefill=wait, block_size=4,
                          max_batch_tokens=64, max_step=16, capacity=64)  # fmt: skip
    assert list(generated(ours).values()) == one_by_one(m, PROMPTS, gen)
    own = sum(len(p) - len(SYSTEM) for p in PROMPTS)
    if wait:  # the system prompt is computed once, by the first request; the others adopt it
        assert counters.prompt_tokens_computed == len(SYSTEM) + own
    else:  # all three start in the first forward: each computes it
        assert counters.prompt_tokens_computed > len(SYSTEM) + own


def results(manager: KVCoreBatchingManager, ids: list[str]) -> dict[str, list[int]]:
    out = {}
    for request_id in ids:
        for result in manager.request_id_iter(request_id):
            if result.is_finished():
                out[request_id] = list(result.generated_tokens)
                break
    return out


def test_requests_arriving_while_others_decode() -> None:
    m = model("gemma3")
    gen = greedy(10)
    with KVCoreBatchingManager(m, gen, **OPTIONS) as manager:
        first = manager.add_request(PROMPTS[2], streaming=True)
        for partial in manager.request_id_iter(first):
            if len(partial.generated_tokens) >= 2:  # the first request is decoding
                break
        later = [manager.add_request(p) for p in PROMPTS[:2]]
        got = results(manager, [first, *later])
    assert [got[first], *(got[r] for r in later)] == one_by_one(m, [PROMPTS[2], *PROMPTS[:2]], gen)
    assert manager.counters.prefix_hit_tokens > 0


def test_requests_that_run_the_cache_out_of_blocks_wait_and_finish() -> None:
    m = model("llama")
    gen = greedy(12)
    prompts = [tokens(16, 50 + i) for i in range(4)]  # no shared prefix; 28 positions = 7 blocks each
    counters = BatchCounters()
    ours = generate_batch(m, prompts, gen, counters=counters, block_size=4, max_batch_tokens=16, capacity=32,
                          num_blocks=10)  # fmt: skip
    assert list(generated(ours).values()) == one_by_one(m, prompts, gen)
    assert all(r.error is None for r in ours.values())
    assert counters.peak_blocks <= 10
    assert counters.preempted > 0  # a starved request was released, requeued and finished exactly


class CountingBatch:
    """A BatchCache whose begin_step calls are counted (every other call goes to the cache)."""

    def __init__(self, batch: Any) -> None:
        self._batch = batch
        self.begun = 0

    def begin_step(self, *args: Any, **kwargs: Any) -> Any:
        self.begun += 1
        return self._batch.begin_step(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._batch, name)


@pytest.mark.parametrize("options", [OPTIONS, dict(OPTIONS, num_blocks=20, max_batch_tokens=64, max_step=16)])
def test_each_forward_begins_one_kvcore_step(options: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    # Admission adds up what kvcore says each request needs (blocks_needed); the forward's step is
    # begun once, when transformers builds its inputs: not once per admitted request and again.
    rounds: list[CountingBatch] = []
    init = hf_batch.step_round.StepRound.__init__

    def counting_init(self: Any, batch: Any, views: Any) -> None:
        rounds.append(CountingBatch(batch))
        init(self, rounds[-1], views)

    monkeypatch.setattr(hf_batch.step_round.StepRound, "__init__", counting_init)
    m = model("gemma3")
    gen = greedy(5)
    counters = BatchCounters()
    prompts = [*PROMPTS, tokens(10, 7), tokens(5, 8)]
    ours = generate_batch(m, prompts, gen, counters=counters, **options)
    assert list(generated(ours).values()) == one_by_one(m, prompts, gen)
    assert len(rounds) == 1
    assert counters.forwards > 0 and rounds[0].begun == counters.forwards


def test_generate_batch_builds_its_kvcore_config_once(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    build_config = hf_batch.options.cache_config_for

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return build_config(*args, **kwargs)

    monkeypatch.setattr(hf_batch.options, "cache_config_for", counting)
    m = model("gemma3")
    assert list(generated(generate_batch(m, PROMPTS[:1], greedy(2), **OPTIONS)).values()) == one_by_one(
        m, PROMPTS[:1], greedy(2)
    )
    assert len(calls) == 1


def test_a_cancelled_request_returns_its_blocks() -> None:
    m = model("gemma3")
    manager = KVCoreBatchingManager(m, greedy(40), **OPTIONS)
    with manager:
        victim = manager.add_request(PROMPTS[0], streaming=True)
        for partial in manager.request_id_iter(victim):
            if partial.generated_tokens:
                break
        manager.cancel_request(victim)
        after = manager.add_request(PROMPTS[1], max_new_tokens=3)
        got = results(manager, [after])
    assert got[after] == one_by_one(m, [PROMPTS[1]], greedy(3))[0]
    cache = manager.cache
    assert cache is not None and cache.active_sequences == 0
    batch = cache.batch
    assert [batch.num_blocks(g) - batch.free_blocks(g) for g in range(batch.n_groups)] == [0] * batch.n_groups


BAD_OPTIONS = [
    (dict(block_size=0), kvcore.InvalidArgumentError, "block_size = 0: must be >= 1"),
    (dict(max_seqs=0), kvcore.InvalidArgumentError, "max_seqs = 0: must be >= 1"),
    (dict(max_seqs=2**21), kvcore.InvalidArgumentError, "max_seqs = 2097152: must be <= 2\\*\\*20"),
    (dict(max_batch_tokens="16"), kvcore.InvalidArgumentError, "max_batch_tokens = '16': must be an int"),
    (dict(capacity=64, num_blocks=3), kvcore.InvalidArgumentError, "num_blocks = 3: a request of capacity = 64"),
    (dict(num_blocks=3), kvcore.InvalidArgumentError, "num_blocks = 3: a request of capacity = 256"),
    (dict(page_size=4), kvcore.InvalidArgumentError, "unknown option 'page_size'"),
    (dict(wait_for_shared_prefill=1), kvcore.InvalidArgumentError, "wait_for_shared_prefill = 1: must be a bool"),
    (dict(max_batch_tokens=16, max_step=32), kvcore.InvalidArgumentError, "max_step = 32: must be <= max_batch_tokens = 16"),
]


@pytest.mark.parametrize("options, error, message", BAD_OPTIONS)
def test_bad_options_fail_before_anything_runs(options: dict[str, Any], error: type, message: str) -> None:
    m = model("gemma3")
    before = m.config._attn_implementation
    with pytest.raises(error, match=message):
        generate_batch(m, PROMPTS, greedy(), **options)
    assert m.config._attn_implementation == before
    assert not hasattr(m, "_cached_continuous_batching_manager")


def test_requests_kvcore_cannot_hold_fail_before_anything_runs() -> None:
    m = model("gemma2")  # eager: a manager switches it to paged|eager, so a refusal must come first
    with pytest.raises(kvcore.InvalidArgumentError, match=r"inputs\[1\]: 30 prompt tokens \+ max_new_tokens = 6"):
        generate_batch(m, [PROMPTS[0], tokens(30, 9)], greedy(), capacity=32)
    assert m.config._attn_implementation == "eager"
    gen = GenerationConfig(max_new_tokens=2, do_sample=True, num_return_sequences=3)
    with pytest.raises(kvcore.InvalidArgumentError, match="num_return_sequences = 3: must be <= max_seqs = 2"):
        generate_batch(m, PROMPTS, gen, max_seqs=2)
    assert gen.eos_token_id is None  # the refused call left the caller's config as it was
    unset = GenerationConfig(do_sample=False, pad_token_id=0)  # no max_new_tokens: kvcore cannot size a request
    with pytest.raises(kvcore.InvalidArgumentError, match=r"inputs\[0\]: \d+ prompt tokens \+ max_new_tokens = None"):
        generate_batch(m, PROMPTS, unset)
    assert m.config._attn_implementation == "eager" and unset.eos_token_id is None
    m = model("llama")
    manager = KVCoreBatchingManager(m, unset, capacity=32)
    assert unset.eos_token_id is None and manager.generation_config.eos_token_id == -1  # set on its own copy
    manager = KVCoreBatchingManager(m, greedy(), capacity=32)
    with pytest.raises(kvcore.InvalidArgumentError, match="capacity = 32"):
        manager.add_request(tokens(30, 9))
    # add_requests checks every request before it queues one or takes an id.
    with pytest.raises(kvcore.InvalidArgumentError, match=r"inputs\[1\]: 30 prompt tokens"):
        manager.add_requests([PROMPTS[0], tokens(30, 9)])
    assert manager.input_queue.qsize() == 0 and manager._request_counter == 0
    assert manager.add_requests([PROMPTS[0]]) == ["req_0"] and manager.input_queue.qsize() == 1


def test_unsupported_models_fail_before_anything_runs() -> None:
    m = build("gemma3")
    m.config.layer_types = [S, "chunked_attention"]
    with pytest.raises(kvcore.NotSupportedError, match="chunked_attention"):
        generate_batch(m, PROMPTS, greedy())
    m = build("llama")
    m.config._attn_implementation = "flex_attention"
    with pytest.raises(kvcore.NotSupportedError, match="attn_implementation = 'flex_attention'"):
        generate_batch(m, PROMPTS, greedy())
    with pytest.raises(kvcore.NotSupportedError, match="not a transformers generation model"):
        generate_batch(object(), PROMPTS, greedy())


@pytest.mark.parametrize("version", ["5.23.0", "5.25.0", "6.0.0", "4.57.1"])
def test_transformers_outside_the_supported_range_is_refused(version: str) -> None:
    with pytest.raises(kvcore.NotSupportedError, match=r"needs transformers >=5\.24,<5\.25 \(tested with 5\.24\.0\)"):
        hf_batch.check_batching_support(version)
    hf_batch.check_batching_support("5.24.0")


def test_demo_runs_a_tiny_model_and_matches_transformers(capsys: pytest.CaptureFixture[str]) -> None:
    from kvcore import cli

    args = ["--requests", "3", "--shared-len", "16", "--prompt-len", "4", "--gen-len", "4", "--block-size", "4", "--max-batch-tokens", "20"]
    assert cli.main(["demo", "--hf-batch", *args, "--samples", "2", "--json"]) == 0
    out = capsys.readouterr().out
    report = __import__("json").loads(out[out.index("{") :])
    assert report["ok"] and report["identical"] == report["sequences"] == 6
    assert report["kvcore"]["forks"] == 3 and report["kvcore"]["prefix_hit_tokens"] > 0


@pytest.mark.parametrize("args, message", [
    (["--requests", "0"], "--requests = 0: must be >= 1"),
    (["--model", "bert"], "invalid choice: 'bert'"),
])  # fmt: skip
def test_demo_refuses_bad_options(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    from kvcore import cli

    try:
        code = cli.main(["demo", "--hf-batch", *args])
    except SystemExit as e:  # argparse's own refusals
        code = int(e.code or 0)
    assert code == 2
    assert message in capsys.readouterr().err


def test_the_docs_example_runs() -> None:
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "transformers.md").read_text()
    section = text[text.index("## Continuous batching") :]
    code = section[section.index("```python") + len("```python") : section.index("```", section.index("```python") + 9)]
    exec(compile(code, "docs/transformers.md", "exec"), {})
