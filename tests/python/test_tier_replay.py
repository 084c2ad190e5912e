"""bench/tier_replay.py on short generated traces (issue 42 items 1 and 3): the trace replay's
checks hold with kvcore's HostTier beneath the device (every hit's rows, read from the byte pool,
hold the request's tokens, restored prefixes included; hits never above the ideal; the import's
KV events consistent), a host tier never lowers reuse, and with a host tier that holds everything
the replica reuses exactly what an infinite cache would. vLLM is not needed.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
try:
    import tier_replay as tp
    from replay.layouts import budgets_for, capacity_of, kvcore_one_pool
    from replay.models import make_model
    from replay.scheduler import SchedulerConfig
    from replay.trace import generate_trace, trace_ideal
finally:
    sys.path.remove(str(BENCH))

CFG = SchedulerConfig(step_ms=50.0, token_budget=2048, chunk=512, max_running=16)
MODEL = make_model("llama")


def _setup(seed: int, block: int, budget: str) -> tuple[list[Any], int, int, list[int]]:
    trace = generate_trace(60, seed, rate_per_s=40.0, max_prompt=6000)
    capacity = capacity_of(trace, block)
    budgets, _ = budgets_for(MODEL, block, trace, CFG, capacity, [budget], None, None,
                             one_pool=kvcore_one_pool())
    return trace, capacity, budgets[budget], trace_ideal(trace, block)


def _run(setup: tuple[list[Any], int, int, list[int]], block: int, host_x: float, **kw: Any) -> dict[str, Any]:
    trace, capacity, budget, ideal = setup
    return tp.run_tier(trace, MODEL, block, budget, CFG, capacity, host_x, ideal, **kw)


def test_an_ample_host_tier_reaches_the_ideal_the_device_alone_misses() -> None:
    """Seed 5 at 2x the peak: the device alone evicts prefixes later prompts want; a tier that
    holds everything restores them and every hit equals the infinite cache's (exact=True)."""
    setup = _setup(5, 16, "2x")
    alone = _run(setup, 16, 0)
    full = _run(setup, 16, 1000, exact=True)
    assert alone["reused_tokens"] < alone["ideal_online_tokens"]
    assert full["hits"] == full["ideal_online"]
    assert full["reused_tokens"] == full["ideal_online_tokens"] > alone["reused_tokens"]
    assert full["host_tokens"] > 0 and full["restores"] >= 1 and full["restored_hits_checked"] >= 1
    assert full["device_tokens"] + full["host_tokens"] == full["reused_tokens"]
    assert full["restore_events_stored"] > 0 and full["spills"] > 0
    assert all(h <= i for h, i in zip(full["hits"], setup[3]))


@pytest.mark.parametrize("block", [16, 512])
def test_under_pressure_the_checks_hold_and_the_tier_adds_hits(block: int) -> None:
    # Runs with and without a tier schedule differently (a longer hit shortens a prefill, which
    # moves every later admission), so their reuse sums are not compared; the large tier must
    # restore prefixes the device had evicted, and never fill up.
    setup = _setup(3, block, "0.7x")
    alone = _run(setup, block, 0)
    small = _run(setup, block, 1)
    large = _run(setup, block, 1000)
    for r in (alone, small, large):  # run_tier raises AssertionError on a failed check
        assert r["reused_tokens"] <= r["ideal_online_tokens"]
        assert r["refused"] == 0
    assert alone["host_tokens"] == 0
    assert large["host_tokens"] > 0 and large["restores"] > 0 and large["host_evictions"] == 0
    assert small["host_evictions"] > 0  # a tier of the device's size is full here


def test_a_restored_block_with_other_rows_fails_the_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The byte check reads the pool: rows written with a wrong position for one request's
    tokens are caught when another request hits them (here through a restore)."""
    setup = _setup(5, 16, "2x")
    real = tp.encode_rows

    def wrong(tokens: np.ndarray, positions: np.ndarray) -> np.ndarray:
        rows = real(tokens, positions)
        rows[:, 0, 2] += 1
        return rows

    monkeypatch.setattr(tp, "encode_rows", wrong)
    with pytest.raises(AssertionError, match="does not hold the request's tokens"):
        _run(setup, 16, 1000)


def test_the_host_model_scales_capacity_by_bytes_per_token() -> None:
    hm = tp.measure_host_model(MODEL)
    assert hm.real_per_token == 32 * 2 * 8 * 128 * 2 + 4
    assert hm.per_token == 2 * tp.TINY_DIM * 4 + 4 and 0 < hm.header < 4 * hm.per_token
    assert hm.tokens(hm.header + 10 * hm.per_token) == 10
    assert hm.tiny_capacity(hm.real_per_token * 1000) == 1000 * hm.per_token


def test_a_model_with_rings_is_refused_by_name() -> None:
    setup = _setup(5, 16, "2x")
    trace, capacity, budget, ideal = setup
    with pytest.raises(ValueError, match="non-full-attention"):
        tp.run_tier(trace, make_model("gemma3"), 16, budget, CFG, capacity, 1, ideal)


def test_the_unit_model_reaches_the_ideal_with_room_for_everything() -> None:
    trace = generate_trace(60, 5, rate_per_s=40.0, max_prompt=6000)
    ideal = sum(trace_ideal(trace, 16))
    small, large = tp.unit_model(trace, 16, [8, 1 << 30])
    assert large["blocks_reused_tokens"] == large["records_reused_tokens"] == ideal
    assert small["blocks_reused_tokens"] <= ideal and small["records_reused_tokens"] <= ideal
