"""`kvcore demo`, the main job: runs, reports, and fails loudly when a check fails."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tracemalloc
from typing import Any

import numpy as np
import pytest
from needs import need

import kvcore
from kvcore import cli
from kvcore_demo import early_exit, footprint, options, runner, sequence, trees
from kvcore_demo.drafts import accepted_prefix, corrupt_drafts
from kvcore_demo.model import Decoder, Model

# Small enough to run in well under a second, large enough to wrap the rings.
SMALL = ["--layers", "3", "--flat-every", "3", "--window", "6", "--sinks", "1", "--max-step", "4",
         "--prompt-len", "14", "--gen-len", "12", "--draft", "3"]
SMALL_OPTS = sequence.DemoOptions(layers=3, flat_every=3, window=6, sinks=1, max_step=4, prompt_len=14, gen_len=12,
                              draft=3, d_model=32, d_ff=64, head_dim=8, vocab_size=64)


def test_report_passes_and_says_what_it_did() -> None:
    r = sequence.run_demo(SMALL_OPTS)
    assert r["ok"] and all(c["ok"] for c in r["checks"])
    assert r["max_abs_logit_diff"] <= r["tolerance"] == 1e-4
    assert r["generated"] == len(r["tokens"]) == 12
    assert r["model"]["ring_layers"] == 2 and r["model"]["flat_layers"] == 1
    s = r["speculative"]
    assert s["tokens_equal"] and s["drafted"] > 0 and s["rewinds"] > 0
    assert s["accepted"] + s["rewound_tokens"] == s["drafted"]
    # Two ring layers of min(length, S + W + C - 1) rows and one flat layer of `length` rows.
    length = 14 + 12 - 1
    row = 2 * 2 * 8 * 4  # K + V, 2 kv heads x head_dim 8 x float32
    assert r["kv_bytes"] == (2 * min(length, 1 + 6 + 4 - 1) + length) * row
    assert r["kv_bytes_all_flat"] == 3 * length * row
    assert r["kv_reserved_bytes"] >= r["kv_bytes"]


def test_model_summary_counts_ring_and_flat_layers() -> None:
    m = options.model_summary(SMALL_OPTS.model_config())
    assert (m["layers"], m["ring_layers"], m["flat_layers"], m["window"], m["sinks"]) == (3, 2, 1, 6, 1)
    assert (m["d_model"], m["head_dim"], m["vocab_size"], m["seed"]) == (32, 8, 64, 0)


def test_corrupt_drafts_changes_at_most_one_token() -> None:
    rng = np.random.default_rng(0)
    drafts = [3, 4, 5]
    seen = set()
    for _ in range(200):
        out = corrupt_drafts(drafts, rng, 8)
        changed = [j for j in range(3) if out[j] != drafts[j]]
        assert len(changed) <= 1 and all(0 <= t < 8 for t in out)
        seen.add(changed[0] if changed else 3)
    assert seen == {0, 1, 2, 3} and drafts == [3, 4, 5]
    before = rng.bit_generator.state
    assert corrupt_drafts([], rng, 8) == [] and rng.bit_generator.state == before


def test_accepted_prefix_stops_at_the_first_miss() -> None:
    logits = np.eye(5, dtype=np.float32)[[1, 2, 3, 4]]  # greedy tokens 1, 2, 3, 4
    assert accepted_prefix([1, 2, 3], logits) == 3
    assert accepted_prefix([1, 0, 3], logits) == 1
    assert accepted_prefix([0, 2], logits) == 0
    assert accepted_prefix([], logits) == 0


def test_cli_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["demo", *SMALL, "--json"]) == 0
    out, err = capsys.readouterr()
    report = json.loads(out)
    assert report["ok"] is True and report["dtype"] == "float32"
    assert err == ""  # no progress bar when stderr is not a terminal


def test_no_subcommand_runs_the_demo(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(SMALL) == 0
    out = capsys.readouterr().out
    assert out.startswith("kvcore demo: 3-layer Gemma-style model (2 ring W=6 S=1 : 1 flat)")
    assert "result: all checks passed" in out


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_16_bit_dtypes(dtype: str, capsys: pytest.CaptureFixture[str]) -> None:
    if dtype == "bfloat16":
        need("ml_dtypes")
    assert cli.main(["demo", *SMALL, "--dtype", dtype, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["dtype"] == dtype and report["tolerance"] == options.TOLERANCE[dtype]


@pytest.mark.parametrize(
    "args,message",
    [
        (["--gen-len", "0"], "--gen-len = 0: must be >= 1"),
        (["--window", "0"], "--window = 0: must be >= 1"),
        (["--draft", "-1"], "--draft = -1: must be >= 0"),
        (["--sinks", "-2"], "sinks = -2"),
        (["--layers", "0"], "--layers = 0"),
    ],
)
def test_bad_options_exit_2_with_a_message(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["demo", *SMALL, *args]) == 2
    assert message in capsys.readouterr().err


def test_int8_is_refused_by_argparse(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        cli.main(["demo", "--dtype", "int8"])
    assert e.value.code == 2
    assert "invalid choice: 'int8'" in capsys.readouterr().err


def test_a_failed_logit_check_exits_1(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(options.TOLERANCE, "float32", -1.0)  # no difference can pass
    assert cli.main(["demo", *SMALL]) == 1
    out = capsys.readouterr().out
    assert "[FAIL] logits equal the oracle" in out and "CHECKS FAILED" in out


def test_a_broken_rewind_is_caught(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # Drop the rewinds: rejected drafts stay in the cache, so the speculative run
    # must stop matching plain decoding.
    def no_rewind(self: Decoder, n: int) -> None:
        del self, n

    monkeypatch.setattr(Decoder, "rewind", no_rewind)
    code = cli.main(["demo", *SMALL, "--json"])
    out = capsys.readouterr().out
    assert code == 1
    report = json.loads(out)
    assert report["ok"] is False
    assert report["checks"][0]["ok"] is True  # the plain run is still exact
    assert report["checks"][1]["ok"] is False


def test_a_kvcore_error_mid_run_exits_1(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    def refuse(self: Decoder, n: int) -> None:
        raise kvcore.InvalidStateError(f"rewind(n = {n}): refused for the test")

    monkeypatch.setattr(Decoder, "rewind", refuse)
    assert cli.main(["demo", *SMALL]) == 1
    assert "FAILED: rewind(n = " in capsys.readouterr().err


def test_progress_bar_draws_on_the_stream_it_is_given() -> None:
    import io

    stream = io.StringIO()
    bar = runner.Progress(stream)
    bar.update("decode", 3, 12)
    bar.close()
    assert "decode" in stream.getvalue() and "3/12" in stream.getvalue()


def test_python_dash_m_kvcore(tmp_path: Any) -> None:
    env = dict(os.environ)
    proc = subprocess.run(
        [sys.executable, "-m", "kvcore", "demo", *SMALL, "--json"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["ok"] is True


# --- refusals: a value the run cannot honour is an error, one line, never replaced ------------


def _one_line_error(err: str, command: str = "kvcore demo") -> str:
    """The message of a one-line CLI error (prefix once, a pointer to --help, no usage block)."""
    assert err.count("\n") == 1 and "usage:" not in err, err
    assert err.startswith(f"{command}: error: ") and err.endswith(f"; see {command} --help\n"), err
    return err[len(f"{command}: error: ") : -len(f"; see {command} --help\n")]


def test_a_max_step_past_the_longest_sequence_is_an_error_naming_the_limit(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Was: silently run with max_step = the longest sequence (14 + 12 + 3 + 1 = 30 here).
    assert cli.main(["demo", *SMALL, "--max-step", "100000000000"]) == 2
    message = _one_line_error(capsys.readouterr().err)
    assert message == ("--max-step = 100000000000: must be <= 30, the longest sequence of this run "
                       "(--prompt-len + --gen-len + --draft + 1)")
    assert cli.main(["demo", *SMALL, "--max-step", "30"]) == 0  # the limit itself runs


def test_more_drafts_than_a_step_holds_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    # Was: silently drafted max_step - 1 = 3 tokens per step.
    assert cli.main(["demo", *SMALL, "--draft", "4"]) == 2
    assert _one_line_error(capsys.readouterr().err).startswith("--draft = 4: must be <= --max-step - 1 = 3")


def test_the_default_max_step_fits_a_short_run(capsys: pytest.CaptureFixture[str]) -> None:
    # A default adapts (16, or the longest sequence when shorter); only a value the user gave is checked.
    assert cli.main(["demo", "--layers", "2", "--prompt-len", "3", "--gen-len", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["max_step"] == 3 + 2 + 3 + 1


def test_a_run_larger_than_the_memory_is_refused_before_it_allocates(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(footprint, "available_memory", lambda: 8 * 2**30)
    assert cli.main(["demo", "--prompt-len", "100000000"]) == 2
    message = _one_line_error(capsys.readouterr().err)
    head = "--prompt-len = 100000000: the run needs about "
    assert message.startswith(head) and "(the oracle attends over every position at once), more than the " \
        "8.0 GiB of memory available; at most --prompt-len = " in message
    fits = int(message.rsplit("= ", 1)[1].removesuffix(" fits"))
    need = [dataclasses.replace(sequence.DemoOptions(), prompt_len=n).bytes_needed() for n in (fits, fits + 1)]
    assert need[0] <= 8 * 2**30 < need[1]  # the largest that fits, exactly by the estimate
    assert 1000 < fits < 100000000


def test_the_memory_check_names_the_longer_of_prompt_and_generation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(footprint, "available_memory", lambda: 2**30)
    with pytest.raises(ValueError, match=r"^--gen-len = 10000000: .* at most --gen-len = \d+ fits$"):
        sequence.DemoOptions(gen_len=10**7).check()
    with pytest.raises(ValueError, match=r"^--prompt-len = 10000000: .*; even --prompt-len = 1 would not fit$"):
        sequence.DemoOptions(prompt_len=10**7, gen_len=10**7).check()
    monkeypatch.setattr(footprint, "available_memory", lambda: None)  # unknown: nothing to check against
    sequence.DemoOptions(prompt_len=10**7).check()


def test_the_estimate_bounds_what_a_run_allocates() -> None:
    opts = dataclasses.replace(SMALL_OPTS, prompt_len=300)
    tracemalloc.start()
    try:
        with runner.single_threaded_blas():
            assert sequence.run_demo(opts)["ok"]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak <= opts.bytes_needed() <= 3 * peak


def test_available_memory_reads_the_kernel_then_sysconf(monkeypatch: pytest.MonkeyPatch) -> None:
    assert footprint.available_memory() is None or footprint.available_memory() > 0

    def no_proc(*args: Any, **kwargs: Any) -> Any:
        raise OSError("no /proc here")

    monkeypatch.setattr(footprint, "open", no_proc, raising=False)
    pages = {"SC_AVPHYS_PAGES": 1000, "SC_PAGE_SIZE": 4096}
    monkeypatch.setattr(footprint.os, "sysconf", lambda name: pages[name])
    assert footprint.available_memory() == 4096000


def test_a_cli_usage_error_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        cli.main(["demo", "--layers", "x"])
    assert e.value.code == 2
    assert _one_line_error(capsys.readouterr().err) == "argument --layers: invalid int value: 'x'"


def test_an_unknown_command_lists_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    # Was: taken for the demo, whose parser then said "unrecognized arguments: bogus".
    with pytest.raises(SystemExit) as e:
        cli.main(["bogus"])
    assert e.value.code == 2
    assert _one_line_error(capsys.readouterr().err, "kvcore") == (
        "unknown command 'bogus': the commands are tour, memory, demo, export (no command runs the demo)"
    )


def test_a_command_error_names_its_command_once(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["tour", "--window", "0"]) == 2
    assert _one_line_error(capsys.readouterr().err, "kvcore tour").startswith("window = 0")


# --- kvcore demo --tree ---------------------------------------------------

# Seed 7: one accepted path leaves the main line (a second guess), so a commit moves a row.
TREE_OPTS = dataclasses.replace(SMALL_OPTS, tree=4, gen_len=40, prompt_len=14, seed=7)


def test_tree_demo_equals_plain_decoding_and_compares_with_chains() -> None:
    r = sequence.run_demo(TREE_OPTS)
    assert r["ok"] and all(c["ok"] for c in r["checks"])
    assert r["checks"][-1]["name"] == "tree speculative decoding equals plain decoding"
    t = r["tree"]
    assert t["tokens_equal"] and t["max_abs_logit_diff"] <= r["tolerance"]
    assert 1 <= t["tokens_per_forward"] <= 4 and 1 <= t["chain_tokens_per_forward"] <= 4
    assert t["paths_off_main_line"] >= 1 and t["copies_layer0"] > 0  # a second guess was accepted: rows moved
    assert t["draft_layers"] == 1 and t["draft_forwards"] >= t["forwards"]
    assert "trees" in sequence.format_report(r)


def test_the_tree_drafter_never_reads_the_plain_run() -> None:
    # The plain run's tokens only feed the check: wrong ones change nothing but its verdict.
    o = TREE_OPTS
    model = Model(o.model_config())
    prompt = np.random.default_rng(o.seed + 1).integers(0, o.vocab_size, size=o.prompt_len).tolist()
    args = (model, o.tree, o.capacity, o.max_step, np.float32, prompt)
    right = trees.run_trees(*args, sequence.run_demo(o)["tokens"], o.gen_len)
    wrong = trees.run_trees(*args, [0] * o.gen_len, o.gen_len)
    assert right["tokens_equal"] and not wrong["tokens_equal"]
    assert {k: v for k, v in right.items() if k != "tokens_equal"} == {k: v for k, v in wrong.items() if k != "tokens_equal"}


def test_tree_demo_catches_copies_not_applied(monkeypatch: pytest.MonkeyPatch) -> None:
    # Without the commit's copies an accepted second guess stays in its draft row,
    # and a later step reads the main line's rejected draft in its place.
    monkeypatch.setattr(kvcore.KVPool, "apply_copies", lambda self, copies: None)
    r = sequence.run_demo(TREE_OPTS)
    assert r["ok"] is False and r["checks"][-1]["ok"] is False


def test_draft_tree_is_a_main_line_with_second_guesses() -> None:
    parents, tokens = trees.draft_tree([5, 6, 7], [[15], [16], [17]], 5)
    assert parents == [0, 1, 2, 0, 1] and tokens == [5, 6, 7, 15, 16]  # second guesses beside drafts 1 and 2
    assert trees.draft_tree([5, 6], [[], [16]], 4) == ([0, 1, 1], [5, 6, 16])  # no second guess: none added
    assert trees.main_line_depth(3) == 2 and trees.main_line_depth(4) == 2
    logits = np.zeros((6, 64))
    full = [-1, *parents]
    logits[0, 5] = logits[1, 16] = 1.0  # greedy takes draft 5, then the second guess 16 beside 6
    assert trees.accepted_path(full, [1, *tokens], logits) == [0, 1, 5]


def test_early_exit_drafter_drafts_the_shallow_models_greedy_continuation() -> None:
    model = Model(SMALL_OPTS.model_config())
    shallow = early_exit.shallow_model(model, 2)
    assert shallow.config.n_layers == 2 and shallow.layers[1] is model.layers[1] and model.config.n_layers == 3
    drafter = early_exit.EarlyExitDrafter(model, 2, 64, 4, np.float32)
    base = np.random.default_rng(0).integers(0, 64, size=14).tolist()
    # Longer, shorter, then a different token: the drafter keeps the common prefix and re-feeds the rest.
    for context in (base[:9], base[:11], base[:10], base[:12], [*base[:6], (base[6] + 1) % 64, *base[7:]]):
        main, others = drafter.draft(context, 3, 3)
        seq = list(context)
        for d in range(3):
            row = shallow.forward_full(seq)[-1]
            ranked = np.argsort(-row, kind="stable")
            assert main[d] == ranked[0] and others[d] == ranked[1:3].tolist()
            seq.append(main[d])
    with pytest.raises(ValueError, match="draft layers = 4: must be in"):
        early_exit.shallow_model(model, 4)


@pytest.mark.parametrize("value", ["1", "5"])
def test_a_tree_budget_outside_the_step_is_refused(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["demo", *SMALL, "--tree", value]) == 2
    assert f"--tree = {value}: must be 0 (no trees) or in [2, --max-step = 4]" in capsys.readouterr().err


def test_tree_demo_cli(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["demo", *SMALL, "--tree", "3"]) == 0
    out = capsys.readouterr().out
    assert "tree speculative decoding equals plain decoding" in out and "tokens per forward" in out
