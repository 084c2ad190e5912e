"""bench/compare.py at tiny sizes, so the benchmark cannot rot.

No timing is asserted: the run must finish, prove every cache returned the same
history (its --check), and write a complete JSON report. A deliberately broken
cache must fail that check, so the check itself is known to bite.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

import numpy as np
import pytest
from needs import need

need("torch")
need("transformers")

BENCH = Path(__file__).resolve().parents[2] / "bench"
TINY = ["--layers", "6", "--kv-heads", "2", "--head-dim", "8", "--window", "8", "--max-step", "4"]


def test_compare_runs_checks_and_writes_a_complete_report(tmp_path: Path) -> None:
    out = tmp_path / "compare.json"
    args = [*TINY, "--contexts", "24,40", "--reps", "2", "--tokens", "3", "--layer-calls", "20"]
    args += ["--memory-context", "32", "--out", str(out)]
    done = subprocess.run(
        [sys.executable, str(BENCH / "compare.py"), *args],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    caches = ["kvcore", "kvcore-positions", "kvcore-mirror", "kvcore-hf", "dynamic", "static", "numpy", "floor"]
    assert report["check"]["passed"] and set(report["check"]["caches"]) == set(caches) - {"floor"}
    rows = {(r["context"], r["cache"]): r for r in report["per_token"]}
    assert set(rows) == {(c, n) for c in (24, 40) for n in caches}
    for r in rows.values():
        assert len(r["samples_us"]) == 2 and r["per_token_us"] > 0
    assert {m["cache"] for m in report["memory"]} == set(caches) - {"floor"}
    # Held bytes follow from the shape: kvcore's flat layer holds capacity rows, its
    # five ring layers R = W + C - 1 = 11 rows each (2 heads x 8 float16 = 32 bytes per K or V row).
    kv = next(m for m in report["memory"] if m["cache"] == "kvcore")
    capacity = 32 + 3
    assert kv["held_bytes"] == (capacity + 5 * 11) * 2 * 32
    assert len(report["layer_update_T1"]) == 5
    assert "per-token cache cost" in done.stdout


def _broken(name: str) -> Any:
    """The candidate `name` with one wrong byte in the oldest row each layer returns."""
    sys.path.insert(0, str(BENCH))
    try:
        import candidates
    finally:
        sys.path.remove(str(BENCH))
    base = candidates.CANDIDATES[name]

    class Broken(base):  # type: ignore[misc, valid-type]
        def step(self, position: int, k: Any, v: Any, check: bool = False) -> Optional[Any]:
            out = super().step(position, k, v, check)
            if out is not None:
                for _, keys, _ in out:
                    keys[0].flat[0] += np.asarray(1, keys.dtype)
            return out

    return Broken


def test_check_rejects_a_cache_that_returns_a_wrong_row(monkeypatch: pytest.MonkeyPatch) -> None:
    sys.path.insert(0, str(BENCH))
    try:
        import candidates
        import compare
    finally:
        sys.path.remove(str(BENCH))
    shape = candidates.Shape(n_layers=6, n_kv_heads=2, head_dim=8, window=8, max_step=4)
    steps = compare.check_steps(shape)
    compare.check_candidate("numpy", shape, steps, seed=0)  # the honest cache passes
    monkeypatch.setitem(candidates.CANDIDATES, "numpy", _broken("numpy"))  # the dict compare uses
    with pytest.raises(AssertionError, match="K rows differ"):
        compare.check_candidate("numpy", shape, steps, seed=0)


def test_batch_python_runs_both_forms_and_admits_from_the_cache(tmp_path: Path) -> None:
    out = tmp_path / "batch_python.json"
    done = subprocess.run(
        [sys.executable, str(BENCH / "batch_python.py"), "--quick", "--seqs", "2,3", "--out", str(out)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    assert {(r["seqs"], r["form"]) for r in report["decode"]} == {(n, f) for n in (2, 3) for f in ("list", "arrays")}
    assert all(r["cpu_us_per_seq"] > 0 for r in report["decode"])
    assert report["admit"]["hit_tokens"] == 1984  # (2,000 - 1) // 16 full blocks of the cached prompt


def test_hf_batch_bench_quick_run_matches_outputs_and_writes_its_report(tmp_path: Path) -> None:
    out = tmp_path / "hf_batch.json"
    done = subprocess.run(
        [sys.executable, str(BENCH / "hf_batch_bench.py"), "--quick", "--out", str(out)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    assert report["identical_outputs"]
    for kind in ("transformers", "kvcore"):
        assert report[kind]["prompt_tokens_computed"] > 0 and report[kind]["peak_kv_bytes"] > 0
    # kvcore computes the shared system prompt once; transformers' own, with a sliding layer, per request.
    assert report["kvcore"]["prompt_tokens_computed"] < report["transformers"]["prompt_tokens_computed"]


def test_hf_batch_bench_overhead_run_reports_per_request_figures(tmp_path: Path) -> None:
    out = tmp_path / "hf_batch_overhead.json"
    done = subprocess.run(
        [sys.executable, str(BENCH / "hf_batch_bench.py"), "--quick", "--overhead", "2,4", "--out", str(out)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    for n in ("2", "4"):
        figures = report["requests"][n]
        assert figures["forwards"] > 0
        assert figures["planning_us_per_request"] > 0 and figures["update_us_per_request"] > 0


def test_hybrid_speculative_runs_checks_exactness_and_counts_state_writes(tmp_path: Path) -> None:
    out = tmp_path / "hybrid.json"
    args = ["--models", "qwen3_next,granite", "--new", "12", "--reps", "1", "--drafts", "3"]
    args += ["--contexts", "200", "--max-step", "64", "--out", str(out)]
    done = subprocess.run(
        [sys.executable, str(BENCH / "hybrid_speculative.py"), *args],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    assert report["all_tokens_equal_greedy"]
    for name in ("qwen3_next", "granite"):
        rows = {r["candidate"]: r for r in report["models"][name]["speed"]["rows"]}
        assert len(rows) == 4 and all(r["tokens_equal_greedy"] and r["tokens_per_s"] > 0 for r in rows.values())
        # A verify step of one token writes one slot of each state of each state layer.
        plain = rows["speculative_generate, 0 drafts, KVCoreCache"]
        assert plain["state_bytes_per_verify_step"] == plain["state_slot_bytes_per_token"] > 0
        assert plain["tokens_per_forward"] == 1.0 and plain["drafted"] == 0
        # With drafts, a verify step keeps the state after each of its tokens.
        lookup = rows["prompt_lookup_generate, 3 drafts, KVCoreCache"]
        steps, slot = lookup["verify_steps"], lookup["state_slot_bytes_per_token"]
        assert lookup["state_bytes_per_verify_step"] == round((steps + lookup["drafted"]) * slot / steps)
    # The bytes section runs on all ten architectures (--bytes-models' default). At 200 tokens no window
    # or chunk (512, 8192) is reached: both hold the same K/V rows; kvcore keeps D = 9 snapshots of each state.
    ten = {"llama4", "gemma3n", "qwen3_next", "qwen3_5", "lfm2", "granite", "falcon_h1", "jamba", "bamba", "nemotron_h"}
    assert {name for name, m in report["models"].items() if "memory" in m} == ten
    for name in ten:
        (memory,) = report["models"][name]["memory"]
        kv, dyn = memory["kvcore"], memory["dynamic"]
        assert kv["length"] == dyn["length"] == 200 and memory["last_logits_max_abs_diff"] < 1e-4, name
        assert kv["kv_bytes"] == dyn["kv_bytes"] > 0, name
        assert kv["state_bytes"] == 9 * dyn["state_bytes"], name
        assert (kv["state_bytes"] > 0) == (name not in ("llama4", "gemma3n")), name
        assert kv["total_bytes"] == kv["kv_bytes"] + kv["state_bytes"] + kv["workspace_bytes"], name
    # Gemma 3n's two KV-shared layers hold nothing in either cache.
    (memory,) = report["models"]["gemma3n"]["memory"]
    assert [r["kind"] for r in memory["kvcore"]["layers"]] == ["kv", "kv", "shared", "shared"]
    assert [r["class"] for r in memory["dynamic"]["layers"][2:]] == ["DummyLayer", "DummyLayer"]
