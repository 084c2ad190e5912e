"""`kvcore demo --batch`: many chats through BatchCache + PagedKVPool, each checked against its own oracle."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from needs import need

import kvcore
from kvcore import cli
from kvcore_demo import batch as demo_batch
from kvcore_demo import batch_server
from kvcore_demo.options import TOLERANCE
from kvcore_demo import footprint, trees
from kvcore_demo.model import Model, ModelConfig
from kvcore_demo.runner import single_threaded_blas


def test_forward_batch_equals_forward_full_per_sequence() -> None:
    # Three sequences of different lengths, chunked prefill side by side, one forked
    # mid-way (a shared partial block, copied on write): each row is its own sequence's.
    model = Model(ModelConfig(n_layers=4, flat_every=2, window=5, sinks=1, d_model=32, d_ff=64, head_dim=8,
                              vocab_size=64))
    cfg = model.config
    layers = [kvcore.LayerConfig(cfg.policy(i), cfg.n_kv_heads, cfg.head_dim) for i in range(cfg.n_layers)]
    cache = kvcore.BatchCache(kvcore.CacheConfig(64, layers, max_step=4,
                                                 batch=kvcore.BatchLimits(block_size=8, max_seqs=4)))
    pool = kvcore.PagedKVPool(cache, np.float32)
    rng = np.random.default_rng(3)
    seqs = {s: rng.integers(0, 64, size=n).tolist() for s, n in ((0, 23), (1, 9), (2, 17))}
    rows: dict[int, dict[int, Any]] = {s: {} for s in (0, 1, 2, 3)}
    for s in (0, 1, 2):
        cache.add_sequence(s)
    forked = False
    while True:
        entries = []
        for s, ids in seqs.items():
            L = cache.length(s)
            if L < len(ids):
                entries.append((s, min(4, len(ids) - L), ids[L : L + 4]))
        if not entries:
            break
        with cache.step(entries) as step:
            logits = model.forward_batch([t for _, _, ids in entries for t in ids], step, pool)
        start = 0
        for s, T, _ in entries:
            L = cache.length(s) - T
            for j in range(T):
                rows[s][L + j] = logits[start + j]
            start += T
        if not forked and cache.length(0) == 12:  # fork inside block 1
            cache.fork(0, 3)
            seqs[3] = seqs[0][:12] + rng.integers(0, 64, size=8).tolist()
            rows[3] = {p: r for p, r in rows[0].items() if p < 12}
            forked = True
    assert forked
    for s, ids in seqs.items():
        ref = model.forward_full(ids)
        assert sorted(rows[s]) == list(range(len(ids)))
        got = np.stack([rows[s][p] for p in range(len(ids))])
        assert np.abs(got - ref).max() <= 1e-4, s


def test_forward_batch_refuses_a_token_count_that_is_not_the_steps() -> None:
    model = Model(ModelConfig(n_layers=1, d_model=16, d_ff=32, head_dim=4, n_heads=2, n_kv_heads=1, vocab_size=16))
    cache = kvcore.BatchCache(kvcore.CacheConfig(16, [kvcore.LayerConfig(kvcore.Flat(), 1, 4)], max_step=4,
                                                 batch=kvcore.BatchLimits(block_size=2, max_seqs=1)))
    pool = kvcore.PagedKVPool(cache, np.float32)
    cache.add_sequence(0)
    step = cache.begin_step([(0, 2, [1, 2])])
    with pytest.raises(ValueError, match="3 tokens for a step of n_tokens = 2"):
        model.forward_batch([1, 2, 3], step, pool)


def test_incremental_oracle_is_forward_full() -> None:
    model = Model(ModelConfig(n_layers=3, flat_every=3, window=4, sinks=1, d_model=32, d_ff=64, head_dim=8,
                              vocab_size=64))
    oracle = demo_batch.Oracle(model, capacity=40)
    rng = np.random.default_rng(5)
    tokens: list[int] = []
    for _ in range(12):  # grow, cut back (a rewind), change a token in the middle
        action = rng.integers(0, 3)
        if action == 0 or len(tokens) < 4:
            tokens = tokens + rng.integers(0, 64, size=int(rng.integers(1, 5))).tolist()
        elif action == 1:
            tokens = tokens[: int(rng.integers(1, len(tokens)))]
        else:
            tokens = list(tokens)
            tokens[int(rng.integers(0, len(tokens)))] = int(rng.integers(0, 64))
        tokens = tokens[:40]
        got = oracle.logits(tokens).copy()
        assert np.abs(got - model.forward_full(tokens)).max() <= 1e-5
    assert oracle.copy().logits(tokens).shape == (len(tokens), 64)


# Small enough to run in about a second, still every feature: joins after the
# start, a queue, hits, forks with copy-on-write, drafts with rewinds, ring
# groups releasing blocks.
SMALL = demo_batch.BatchDemoOptions(
    chats=6, concurrency=4, shared_len=8, prompt_len=6, gen_len=14, arrive_every=2, samples=2, fork_every=3,
    draft=2, draft_every=2, block_size=4, layers=3, flat_every=3, window=5, sinks=1, max_step=4,
    d_model=32, n_heads=2, n_kv_heads=1, head_dim=8, d_ff=64, vocab_size=64,
)
# The command line's widths are the default model's; these keep it to a fraction of a second.
SMALL_LAYERS = 2
SMALL_ARGS = ["--chats", "4", "--concurrency", "3", "--shared-len", "8", "--prompt-len", "4", "--gen-len", "8",
              "--samples", "2", "--fork-every", "2", "--draft-every", "2", "--block-size", "4", "--layers", "2",
              "--flat-every", "2", "--window", "4", "--sinks", "1", "--max-step", "4", "--arrive-every", "2"]
# The same run with trees: no chain drafts (--tree refuses --draft and --draft-every).
_DRAFTS = SMALL_ARGS.index("--draft-every")
TREE_ARGS = SMALL_ARGS[:_DRAFTS] + SMALL_ARGS[_DRAFTS + 2 :]


def _run(opts: demo_batch.BatchDemoOptions) -> dict[str, Any]:
    with single_threaded_blas():
        return demo_batch.run_batch_demo(opts)


def test_small_run_passes_and_shows_every_feature() -> None:
    r = _run(SMALL)
    assert r["ok"] and all(c["ok"] for c in r["checks"]) and r["first_failure"] is None
    o = r["oracle"]
    assert o["max_abs_logit_diff"] <= o["tolerance"] == 1e-4 and o["final_max_abs_logit_diff"] <= 1e-4
    assert o["positions_checked"] == r["tokens"]["total"]  # every new position of every step
    assert o["positions_computed"] < o["positions_per_step_forward_full"]
    ch = r["chats"]
    assert ch["finished"] == ch["total"] == 6 and ch["sequences"] == 6 + 2  # two forks of 2 samples
    assert ch["joined_mid_run"] > 0 and ch["left_mid_run"] > 0 and ch["ids_reused"] > 0
    assert ch["peak_sequences"] <= ch["concurrency"] == 4
    assert r["prefix"]["hits"] > 0 and r["prefix"]["tokens_reused"] % 4 == 0
    assert r["forks"]["forks"] == 2 and r["forks"]["copy_on_write_blocks"] > 0
    s = r["speculative"]
    assert s["rewinds"] > 0 and 0 < s["accepted"] < s["drafted"]
    assert s["accepted"] + s["rewound_tokens"] == s["drafted"]
    kv = r["kv"]
    assert 0 < kv["peak_bytes"] < kv["peak_no_sharing_bytes"] < kv["peak_all_flat_bytes"]
    assert kv["ring_blocks_released_peak"] > 0 and kv["reserved_bytes"] >= kv["peak_bytes"]
    for c in r["per_chat"]:
        assert c["joined"] >= c["arrival"] and c["left"] >= c["joined"]
        assert len(c["generated"]) == c["samples"] == len(c["sequence_ids"])
    forked = [c for c in r["per_chat"] if c["samples"] > 1]
    assert all(len({g[0] for g in c["generated"]}) == c["samples"] for c in forked)  # samples diverge


@pytest.mark.parametrize("tree", [0, 4])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_16_bit_kv(dtype: str, tree: int) -> None:
    if dtype == "bfloat16":
        need("ml_dtypes")
    r = _run(demo_batch.BatchDemoOptions(**{**SMALL.__dict__, "dtype": dtype, "chats": 3, "tree": tree}))
    assert r["ok"] and r["oracle"]["tolerance"] == TOLERANCE[dtype]
    assert (r["trees"]["steps"] > 0) == (tree > 0)


class _CorruptRow(kvcore.PagedKVPool):
    """Returns one live K row changed, once (the 5th step, layer 1): the row of the step's first token."""

    calls = 0

    def update(self, layer: Any, step: Any, k: Any, v: Any) -> tuple[Any, Any]:
        k_rows, v_rows = super().update(layer, step, k, v)
        _CorruptRow.calls += 1
        if _CorruptRow.calls == 4 * SMALL_LAYERS + 2:
            row = int(step.plan().groups[self.cache.group_of(layer)].slots[0])
            k_rows = k_rows.copy()
            k_rows[row] += 1.0
        return k_rows, v_rows


class _LeakyMask(kvcore.PagedKVPool):
    """Lets the first entry's tokens also see the row the second entry's first token wrote."""

    def mask(self, step: Any, group: Any) -> Any:
        m = np.array(super().mask(step, group))
        plan = step.plan()
        if plan.n_entries > 1:
            starts = plan.query_starts
            m[int(starts[0]) : int(starts[1]), int(plan.groups[group].slots[int(starts[1])])] = True
        return m


@pytest.mark.parametrize("pool", [_CorruptRow, _LeakyMask])
def test_a_broken_pool_is_caught_and_exits_1(
    pool: type[kvcore.PagedKVPool], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _CorruptRow.calls = 0
    monkeypatch.setattr(kvcore, "PagedKVPool", pool)
    assert cli.main(["demo", "--batch", *SMALL_ARGS, "--json"]) == 1
    r = json.loads(capsys.readouterr().out)
    assert r["ok"] is False and r["checks"][0]["ok"] is False
    f = r["first_failure"]
    assert f["check"] == "step" and f["diff"] > r["oracle"]["tolerance"]
    if pool is _CorruptRow:
        # Found at the step it happened; the kept logits hold it too; the bookkeeping was right.
        assert f["step"] == 5 and r["checks"][1]["ok"] is False and r["checks"][2]["ok"] is True


def test_a_lost_rewind_is_caught(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # Rejected drafts stay in the cache: lengths disagree and later tokens land at
    # the wrong positions, which the oracle sees.
    monkeypatch.setattr(kvcore.BatchCache, "rewind", lambda self, seq, n: None)
    assert cli.main(["demo", "--batch", *SMALL_ARGS]) == 1
    out = capsys.readouterr().out
    assert "[FAIL] the cache's lengths and positions agree" in out
    assert "[FAIL] every step's logits equal" in out and "CHECKS FAILED" in out


def test_a_kvcore_error_mid_run_exits_1(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    def refuse(self: kvcore.BatchCache, src: int, dst: int, upto: int | None = None) -> None:
        raise kvcore.InvalidStateError(f"fork({src}, {dst}): refused for the test")

    monkeypatch.setattr(kvcore.BatchCache, "fork", refuse)
    assert cli.main(["demo", "--batch", *SMALL_ARGS]) == 1
    assert "kvcore demo --batch: FAILED: fork(" in capsys.readouterr().err


@pytest.mark.parametrize(
    "args,message",
    [
        (["--chats", "0"], "--chats = 0: must be >= 1"),
        (["--gen-len", "0"], "--gen-len = 0: must be >= 1"),
        (["--window", "0"], "--window = 0: must be >= 1"),
        (["--draft", "-1"], "--draft = -1: must be >= 0"),
        (["--block-size", "0"], "--block-size = 0: must be >= 1"),
        (["--samples", "4", "--concurrency", "3"], "--samples = 4: a forking chat needs that many sequences"),
        (["--max-step", "0"], "--max-step = 0: must be >= 1"),
    ],
)
def test_bad_options_exit_2_with_a_message(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["demo", "--batch", *args]) == 2
    assert message in capsys.readouterr().err


def test_unknown_options_and_int8_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    for args in (["--dtype", "int8"], ["--prompt-len", "x"], ["--bogus", "1"]):
        with pytest.raises(SystemExit) as e:
            cli.main(["demo", "--batch", *args])
        assert e.value.code == 2
    assert "kvcore demo --batch: error:" in capsys.readouterr().err


def test_help_lists_the_knobs(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        cli.main(["--batch", "--help"])  # no subcommand: the demo, in its batch form
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: kvcore demo --batch")
    for knob in ("--chats", "--concurrency", "--shared-len", "--samples", "--draft", "--block-size", "--window",
                 "--sinks", "--max-step", "--seed", "--dtype", "--json", "--progress", "--no-progress"):
        assert knob in out
    with pytest.raises(SystemExit):
        cli.main(["demo", "--help"])
    assert "--batch" in capsys.readouterr().out  # the single-sequence demo points to it


def test_cli_flag_forms(capsys: pytest.CaptureFixture[str]) -> None:
    # --batch anywhere after `demo`, abbreviated as argparse would allow, or with no subcommand.
    for argv in (["demo", "--seed", "1", "--batch", *SMALL_ARGS, "--json"], ["demo", "--bat", *SMALL_ARGS, "--json"],
                 ["--batch", *SMALL_ARGS, "--json"]):
        assert cli.main(argv) == 0
        out, err = capsys.readouterr()
        assert json.loads(out)["ok"] is True and err == ""  # no progress bar off a terminal
    assert cli.main(["demo", "--batch", *SMALL_ARGS, "--progress"]) == 0
    out, err = capsys.readouterr()
    assert "serving" in err and out.startswith("kvcore demo --batch: 4 chats")
    assert "result: all checks passed" in out


def test_the_default_run(tmp_path: Any) -> None:
    """The command a user runs: every check passes and every feature shows."""
    proc = subprocess.run(
        [sys.executable, "-m", "kvcore", "demo", "--batch", "--json"],
        capture_output=True, text=True, env=dict(os.environ), cwd=tmp_path, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    assert r["ok"] is True
    assert set(r) >= {"checks", "first_failure", "model", "options", "steps", "tokens", "tokens_per_s",
                      "generated_tokens_per_s", "chats", "prefix", "forks", "speculative", "kv", "oracle", "per_chat"}
    assert r["chats"]["joined_mid_run"] > 0 and r["chats"]["left_mid_run"] > 0 and r["chats"]["waited"] > 0
    assert r["prefix"]["hits"] == r["chats"]["total"] - 1  # every chat after the first
    assert r["forks"]["forks"] > 0 and r["forks"]["copy_on_write_blocks"] > 0
    assert r["speculative"]["rewinds"] > 0 and r["speculative"]["accepted"] > 0
    assert r["kv"]["ring_blocks_released_peak"] > 0
    assert r["kv"]["peak_bytes"] < r["kv"]["peak_no_sharing_bytes"] < r["kv"]["peak_all_flat_bytes"]


ROOT = Path(__file__).resolve().parents[2]


def _untimed(line: str) -> str:
    """A report line without what a rerun may change: the token rates (the machine's
    load) and the |diff| figures (the float kernels NumPy's BLAS picks for the CPU)."""
    return re.sub(r"\d\.\d\de-\d\d", "<diff>", re.sub(r"\d+ tok/s", "<rate> tok/s", line))


def _fenced(path: Path) -> list[str]:
    """The fenced blocks of a Markdown file, each without its fences."""
    return [m[1] for m in re.finditer(r"^```[^\n]*\n(.*?)^```$", path.read_text(), flags=re.S | re.M)]


def test_the_docs_quote_the_default_run() -> None:
    """docs/demo.md's sample output and README's excerpt are a default run's, but for timings and |diff|."""
    ran = [_untimed(line) for line in demo_batch.format_report(_run(demo_batch.BatchDemoOptions())).splitlines()]
    blocks = [b for b in _fenced(ROOT / "docs" / "demo.md") if b.startswith("$ kvcore demo --batch\n")]
    assert len(blocks) == 1
    assert [_untimed(line) for line in blocks[0].splitlines()[1:]] == ran
    # README quotes its head and its last line, eliding the rest with "  ...".
    quoted = [b for b in _fenced(ROOT / "README.md") if b.startswith("kvcore demo --batch:")]
    assert len(quoted) == 1
    lines = [_untimed(line) for line in quoted[0].splitlines()]
    cut = lines.index("  ...")
    assert 0 < cut < len(lines) - 1
    assert lines[:cut] == ran[:cut] and lines[cut + 1 :] == ran[len(ran) - (len(lines) - cut - 1) :]


# --- refusals and the memory a run holds ------------------------------------------------------


def test_a_max_step_past_the_longest_sequence_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    # Was: silently run with max_step = the longest sequence (8 + 4 + 8 + 3 + 1 = 24 here).
    assert cli.main(["demo", "--batch", *SMALL_ARGS, "--max-step", "1000"]) == 2
    err = capsys.readouterr().err
    assert err == ("kvcore demo --batch: error: --max-step = 1000: must be <= 24, the longest sequence of this run "
                   "(--shared-len + --prompt-len + --gen-len + --draft + 1); see kvcore demo --batch --help\n")


def test_more_drafts_than_a_step_holds_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    # Was: silently drafted max_step - 1 = 3 tokens per step.
    assert cli.main(["demo", "--batch", *SMALL_ARGS, "--draft", "5"]) == 2
    assert "error: --draft = 5: must be <= --max-step - 1 = 3" in capsys.readouterr().err


def test_a_run_larger_than_the_memory_is_refused(monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(footprint, "available_memory", lambda: 2**30)
    assert cli.main(["demo", "--batch", "--concurrency", "100000000"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvcore demo --batch: error: --concurrency = 100000000: the run needs about ")
    assert "(each sequence in flight keeps its own oracle), more than the 1.0 GiB of memory available; " \
        "at most --concurrency = " in err and err.count("\n") == 1


@pytest.mark.parametrize("tree", [0, 4])
def test_the_estimate_bounds_what_a_run_allocates(tree: int) -> None:
    opts = demo_batch.BatchDemoOptions(**{**SMALL.__dict__, "prompt_len": 100, "concurrency": 6, "tree": tree})
    tracemalloc.start()
    try:
        assert _run(opts)["ok"]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak <= opts.bytes_needed() <= 3 * peak


def test_a_released_oracle_keeps_its_work_and_no_arrays() -> None:
    model = Model(ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=8, d_ff=64))
    oracle = demo_batch.Oracle(model, capacity=40)
    oracle.logits(list(range(10)))
    oracle.release()
    assert oracle.work == 10 and oracle.k == [] and oracle.v == [] and oracle.rows.size == 0


# --- kvcore demo --batch --tree ---------------------------------------------------------------

# Every chat decodes with trees of up to 4 nodes from the early-exit drafter (the first layer);
# seed 5: three accepted paths leave the main line (a second guess), so commits move rows.
TREE = demo_batch.BatchDemoOptions(**{**SMALL.__dict__, "tree": 4, "seed": 5})


def test_tree_batch_run_is_exact_and_commits_paths_off_the_main_line() -> None:
    r = _run(TREE)
    assert r["ok"] and all(c["ok"] for c in r["checks"]) and r["first_failure"] is None
    assert r["oracle"]["positions_checked"] == r["tokens"]["total"]  # every tree node of every step
    t = r["trees"]
    assert t["size"] == 4 and t["draft_layers"] == 1 and t["draft_forwards"] >= t["steps"] > 0
    assert t["nodes"] <= 4 * t["steps"] and 1 < t["tokens_per_forward"] <= 4
    # One row per path in each of the 3 groups: 2 ring layers and 1 flat make groups of one layer
    # (page_layers' default, the fewest layers any policy has).
    assert t["paths_off_main_line"] == 3 and t["copies"] == 9
    assert r["speculative"]["steps"] == 0  # the trees replace --draft's chains
    greedy = r["checks"][3]
    assert greedy["name"].startswith("every generated token is plain greedy decoding's")
    n = int(greedy["detail"].split("/")[1].split()[0])
    assert greedy["detail"] == f"{n}/{n} tokens" and n > 0
    assert r["chats"]["finished"] == 6 and r["forks"]["forks"] == 2
    report = demo_batch.format_report(r)
    assert "accepted tokens per forward" in report and "3 paths off the main line" in report
    assert "  drafts  " not in report  # no all-zero chain-drafts line beside the trees


def test_tree_batch_run_catches_commit_copies_not_applied(monkeypatch: pytest.MonkeyPatch) -> None:
    # An accepted second guess stays in its draft row: a later step reads the main
    # line's rejected draft in its place, and that chat's logits leave the oracle's.
    monkeypatch.setattr(kvcore.PagedKVPool, "apply_copies", lambda self, copies: None)
    r = _run(TREE)
    assert r["ok"] is False and r["checks"][0]["ok"] is False and r["first_failure"]["check"] == "step"


def test_a_token_that_is_not_greedy_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    # Decoding the second choice keeps every logit exact (the oracle follows the tokens),
    # so only the greedy check can tell.
    monkeypatch.setattr(batch_server, "greedy", lambda row: int(np.argsort(row, kind="stable")[-2]))
    r = _run(SMALL)
    assert [c["ok"] for c in r["checks"]] == [True, True, True, False]


def test_root_paths_cover_every_node() -> None:
    assert trees.root_paths([-1, 0, 0, 1, 2], 5) == [[0, 1, 3], [0, 2, 4]]
    assert trees.root_paths([-1, 0, 1], 3) == [[0, 1, 2]] == trees.root_paths(None, 3)


def test_tree_batch_cli(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["demo", "--batch", *TREE_ARGS, "--tree", "3", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["ok"] is True and r["trees"]["steps"] > 0 and r["options"]["tree"] == 3
    d = demo_batch.BatchDemoOptions()
    assert (r["options"]["draft"], r["options"]["draft_every"]) == (d.draft, d.draft_every)  # not given: defaults
    for value in ("1", "5", "-1"):
        assert cli.main(["demo", "--batch", *TREE_ARGS, "--tree", value]) == 2
        assert f"--tree = {value}: must be" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["demo", "--batch", "--help"])
    assert "--tree" in capsys.readouterr().out
    # --draft does not apply with trees (and cannot be given): its default 3 does not refuse a step of 2.
    assert cli.main(["demo", "--batch", *TREE_ARGS, "--tree", "2", "--max-step", "2"]) == 0, capsys.readouterr().err


@pytest.mark.parametrize(("chain", "name"), [
    (["--draft", "2"], "--draft"), (["--draft-every=1"], "--draft-every"),
    (["--draft-ev", "1"], "--draft-every"),  # an abbreviation argparse takes is given all the same
    (["--draft", "3"], "--draft"),  # the default value, given: still refused
])
def test_tree_batch_refuses_chain_drafts(chain: list[str], name: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["demo", "--batch", *TREE_ARGS, "--tree", "3", *chain])
    assert exit_.value.code == 2
    assert f"{name} with --tree = 3: trees replace the chain drafts" in capsys.readouterr().err
