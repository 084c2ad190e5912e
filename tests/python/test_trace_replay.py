"""bench/trace_replay.py's kvcore side on tiny generated traces (issue 39 item 7): every hit
checked (a multiple of the block size, never above what an infinite cache holds nor above the
trace's ideal, its blocks holding the request's tokens, its blocks' keys stored by the drained KV
events), and with an ample budget every hit equal to the ideal. A broken hit must fail the checks.
vLLM is not needed.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
try:
    from replay.kvcore_adapter import KvcoreAdapter
    from replay.layouts import budgets_for, capacity_of, kvcore_layout, kvcore_one_pool, page_blocks_for
    from replay.models import make_model, vllm_block_size
    from replay.scheduler import SchedulerConfig, replay
    from replay.trace import (TraceRequest, _check_request, generate_trace, load_trace, trace_ideal,
                              write_trace)
    from trace_replay import run_kvcore
finally:
    sys.path.remove(str(BENCH))

CFG = SchedulerConfig(step_ms=50.0, token_budget=2048, chunk=512, max_running=16)


def _trace(n: int = 40, seed: int = 3) -> list[Any]:
    # A high rate so requests overlap (concurrent prefills, preemption under small budgets).
    return generate_trace(n, seed, rate_per_s=40.0, max_prompt=6000)


def _run(model_name: str, block: int, budget_name: str, trace: list[Any]) -> dict[str, Any]:
    model = make_model(model_name)
    capacity = capacity_of(trace, block)
    budgets, _ = budgets_for(model, block, trace, CFG, capacity, [budget_name], None, None,
                             one_pool=kvcore_one_pool())
    ideal = trace_ideal(trace, block)
    return run_kvcore(trace, model, block, budgets[budget_name], CFG, capacity,
                      exact=budget_name == "ample", ideal_trace=ideal)


@pytest.mark.parametrize("model_name", ["llama", "gemma3", "qwen3next"])
@pytest.mark.parametrize("block", [16, 512])
def test_ample_budget_reuses_exactly_the_ideal(model_name: str, block: int) -> None:
    trace = _trace()
    out = _run(model_name, block, "ample", trace)  # exact=True: every hit == ideal_online
    assert out["feasible"] and out["refused"] == 0 and out["violation"] is None
    assert out["hits"] == out["ideal_online"]
    ideal = trace_ideal(trace, block)
    assert all(h <= i for h, i in zip(out["hits"], ideal))
    if model_name != "qwen3next":  # attention only: reuse happens on this trace
        assert out["reused_tokens"] > 0


@pytest.mark.parametrize("model_name", ["llama", "gemma3"])
def test_tight_budget_keeps_every_check(model_name: str) -> None:
    trace = _trace(60, seed=5)
    out = _run(model_name, 16, "0.7x", trace)
    assert out["violation"] is None
    assert sum(out["hits"]) <= sum(out["ideal_online"])


@pytest.mark.parametrize("budget_name", ["ample", "0.7x"])
def test_a_hybrid_with_its_states_in_the_pool_keeps_every_check(budget_name: str) -> None:
    # Qwen3-Next-like, states as blocks of the one pool at the block whose page holds a state:
    # every hit checked (the State groups' KV events too), exact at the ample budget, and the
    # tight budget still serves every request (preempting instead of refusing).
    trace = _trace(60, seed=5)
    model = make_model("qwen3next")
    block = vllm_block_size(model, 16)
    capacity = capacity_of(trace, block)
    budgets, _ = budgets_for(model, block, trace, CFG, capacity, [budget_name], None, None, one_pool=True,
                             states_in_pool=True)
    out = run_kvcore(trace, model, block, budgets[budget_name], CFG, capacity, exact=budget_name == "ample",
                     ideal_trace=trace_ideal(trace, block), one_pool=True, states_in_pool=True)
    assert out["feasible"] and out["violation"] is None and out["refused"] == 0
    assert out["layout"]["states_in_pool"] and out["layout"]["n_state_groups"] == 3
    assert out["kv_events_checked"]["stored"] > 0
    if budget_name == "ample":
        assert out["hits"] == out["ideal_online"] and out["reused_tokens"] > 0


@pytest.mark.parametrize("model_name", ["llama", "gemma3"])
def test_paged_tables_replay_as_dense_ones_in_less_memory(model_name: str) -> None:
    # BatchLimits.table_page_blocks (docs/batch.md section 5, "Tables sized by use"): the same
    # hits and preemptions as dense rows at a budget where eviction matters, every check kept,
    # and the tables' bytes below the dense rows'.
    trace = _trace(60, seed=5)
    model = make_model(model_name)
    capacity = capacity_of(trace, 16)
    budgets, info = budgets_for(model, 16, trace, CFG, capacity, ["0.7x"], None, None,
                                one_pool=kvcore_one_pool())
    runs = []
    for page_blocks in (0, 8):
        cfg = SchedulerConfig(step_ms=50.0, token_budget=2048, chunk=512, max_running=16,
                              table_page_blocks=page_blocks)
        runs.append(run_kvcore(trace, model, 16, budgets["0.7x"], cfg, capacity, exact=False,
                               ideal_trace=trace_ideal(trace, 16),
                               running_blocks=info["peak_running_blocks"]))
    dense, paged = runs
    assert paged["violation"] is None and paged["table_page_blocks"] == 8
    # The bound follows the running requests' blocks, not the pool: a ring group's rows at most
    # its window's, and no more pages for a budget that caches more.
    running, rows = info["peak_running_blocks"], paged["layout"]["max_active_seqs"]
    if model_name == "llama":  # one flat group
        assert paged["table_pages"] == -(-running // 8) + 2 * rows
    budget_2x, _ = budgets_for(model, 16, trace, CFG, capacity, ["2x"], None, None,
                               one_pool=kvcore_one_pool())
    wider = run_kvcore(trace, model, 16, budget_2x["2x"], cfg, capacity, exact=False,
                       ideal_trace=trace_ideal(trace, 16), running_blocks=running)
    assert wider["violation"] is None and wider["short_of_table_pages"] == 0
    assert wider["table_pages"] == paged["table_pages"]
    assert (paged["hits"], paged["preempted"], paged["refused"]) == (dense["hits"], dense["preempted"], dense["refused"])
    assert dense["table_bytes"] == dense["table_bytes_unpaged"]
    assert 0 < paged["peak_table_pages"] <= paged["table_pages"] and paged["short_of_table_pages"] == 0
    assert paged["table_bytes"] < dense["table_bytes"]


@pytest.mark.parametrize("budget_name", ["ample", "2x"])
def test_a_hybrid_with_a_state_block_hits_on_its_multiples(budget_name: str) -> None:
    # BatchLimits.state_block_size = 64 over blocks of 16 (docs/batch.md section 10, "The State
    # groups' block"): states named, and prefill chunks ended, only on multiples of 64; every hit
    # checked and one of them, exact at the ample budget against an infinite cache that names
    # states there too. A State block of one block replays as the default.
    trace = _trace(60, seed=5)
    model = make_model("qwen3next")
    capacity = capacity_of(trace, 16)
    budgets, _ = budgets_for(model, 16, trace, CFG, capacity, [budget_name], None, None,
                             one_pool=kvcore_one_pool())
    runs = {}
    for state_block in (0, 16, 64):
        cfg = SchedulerConfig(step_ms=50.0, token_budget=2048, chunk=512, max_running=16, state_block=state_block)
        runs[state_block] = run_kvcore(trace, model, 16, budgets[budget_name], cfg, capacity,
                                       exact=budget_name == "ample", ideal_trace=trace_ideal(trace, 16))
    out = runs[64]
    assert out["feasible"] and out["violation"] is None and out["refused"] == 0
    assert all(h % 64 == 0 for h in out["hits"]) and out["reused_tokens"] > 0
    assert any(h % 64 for h in runs[0]["hits"])  # the default hits between them
    assert (runs[16]["hits"], runs[16]["preempted"]) == (runs[0]["hits"], runs[0]["preempted"])
    if budget_name == "ample":
        assert out["hits"] == out["ideal_online"]


@pytest.mark.parametrize("model_name", ["llama", "gemma3", "qwen3next"])
def test_a_request_waits_for_the_prefix_another_computes(model_name: str) -> None:
    # Two requests with one 20-block prompt (a 512-token chunk a step, 544 on the hybrid), the
    # second arriving in step 3 while the first computes it: a hit covers committed blocks only,
    # so the scheduler keeps the second waiting while its first block past the hit completes in
    # the step (vLLM's Mamba rule; vLLM's attention hits it in the forward instead). It reuses
    # the whole prefix instead of what was committed when it arrived and computing the rest
    # again beside the first. A third request of another prompt, queued behind it, is not held
    # up: it is admitted when it arrives.
    ids = tuple(range(20))
    trace = [TraceRequest(0, 0.0, 20 * 512, 4, ids), TraceRequest(1, 150.0, 20 * 512, 4, ids),
             TraceRequest(2, 151.0, 2 * 512, 4, (100, 101))]
    model = make_model(model_name)
    hybrid = model.has_state
    block = vllm_block_size(model, 16) if hybrid else 16
    capacity = capacity_of(trace, block)
    budgets, _ = budgets_for(model, block, trace, CFG, capacity, ["ample"], None, None, one_pool=True,
                             states_in_pool=hybrid)
    ideal = trace_ideal(trace, block)
    out = run_kvcore(trace, model, block, budgets["ample"], CFG, capacity, exact=True, ideal_trace=ideal,
                     one_pool=True, states_in_pool=hybrid)
    assert out["violation"] is None
    assert out["hits"] == [0, ideal[1], 0] and ideal[1] == (20 * 512 - 1) // block * block
    # It waited every step from its arrival until the first had computed what it reuses.
    steps_to_commit = -(-ideal[1] // (block if hybrid else 512))
    assert out["waits_for_producer"] == steps_to_commit - 3
    assert out["admission_delays"] == [0, steps_to_commit - 3, 0]


def _ample_adapter(trace: list[Any]) -> tuple[Any, Any, int]:
    model = make_model("llama")
    capacity = capacity_of(trace, 16)
    one_pool = kvcore_one_pool()
    budgets, _ = budgets_for(model, 16, trace, CFG, capacity, ["ample"], None, None, one_pool=one_pool)
    layout = kvcore_layout(model, 16, budgets["ample"], CFG, capacity, one_pool=one_pool)
    return model, KvcoreAdapter(model, 16, layout, CFG, capacity, check=True), capacity


def test_a_hit_one_block_too_long_fails_the_checks() -> None:
    trace = _trace()
    model, adapter, capacity = _ample_adapter(trace)
    real = adapter.lookup
    adapter.lookup = lambda lv: real(lv) + 16
    with pytest.raises(AssertionError, match="hit|adopt_prefix gave"):
        replay(trace, adapter, CFG, model, check=True, exact=True,
               ideal_trace=trace_ideal(trace, 16), capacity=capacity)


def test_a_block_with_other_tokens_fails_the_checks() -> None:
    """The replay's record of what each block was computed from is compared on every hit."""

    class Wrong(dict[Any, int]):
        def get(self, key: Any, default: Any = None) -> Any:
            return -1

    trace = _trace()
    model, adapter, capacity = _ample_adapter(trace)
    adapter.content = Wrong()
    with pytest.raises(AssertionError, match="does not hold the request's tokens"):
        replay(trace, adapter, CFG, model, check=True, exact=True,
               ideal_trace=trace_ideal(trace, 16), capacity=capacity)


def test_generated_trace_is_valid_and_seeded(tmp_path: Path) -> None:
    a, b = generate_trace(50, 9), generate_trace(50, 9)
    assert a == b and a != generate_trace(50, 10)
    path = tmp_path / "t.jsonl"
    write_trace(path, a)
    back = load_trace(path)
    assert [(r.input_length, r.output_length, r.hash_ids) for r in back] == \
        [(r.input_length, r.output_length, r.hash_ids) for r in a]
    # Conversations extend earlier prompts: some prompt has an earlier one as a prefix.
    assert sum(trace_ideal(a, 16)) > 0


def test_bad_arguments_name_the_value() -> None:
    with pytest.raises(ValueError, match="n_requests 0"):
        generate_trace(0)
    with pytest.raises(ValueError, match="model 'gpt'"):
        make_model("gpt")
    with pytest.raises(ValueError, match="chunk 600"):
        SchedulerConfig(token_budget=512, chunk=600)
    with pytest.raises(ValueError, match="table_page_blocks 3"):
        SchedulerConfig(table_page_blocks=3)
    with pytest.raises(ValueError, match="state_block -16"):
        SchedulerConfig(state_block=-16)
    model = make_model("qwen3next")
    layout = kvcore_layout(model, 16, 1 << 34, CFG, 4096, one_pool=kvcore_one_pool())
    with pytest.raises(ValueError, match="prefill chunks of 4096 tokens .* exceed token_budget 2048"):
        KvcoreAdapter(model, 16, layout, SchedulerConfig(token_budget=2048, state_block=4096), 4096, False)
    with pytest.raises(ValueError, match="state_block 24 must be a multiple of the block size 16"):
        KvcoreAdapter(model, 16, layout, SchedulerConfig(state_block=24), 4096, False)
    with pytest.raises(ValueError, match=r"paged tables need layout\['running_blocks'\] >= 1 .*got 0"):
        KvcoreAdapter(model, 16, {**layout, "running_blocks": 0}, SchedulerConfig(table_page_blocks=8),
                      4096, False)
    assert [page_blocks_for(n) for n in (1, 374, 11968)] == [1, 16, 64]
    bad = TraceRequest(0, 0.0, 2000, 1, (1, 2))
    with pytest.raises(ValueError, match="input_length 2000"):
        _check_request(bad)
