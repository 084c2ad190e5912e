"""bench/cluster_replay.py (issue 42 item 3, the cluster part) on short generated traces, in one
process (no Ray), host tiers of one device's bytes (a record from the store passes through one):
with a store that holds everything, N replicas reuse exactly the ideal's prompt
tokens whatever the router; without a store only each replica's own tiers serve; every prompt
token is counted once, by the tier that served it or as computed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
try:
    import cluster_replay as cr
    import tier_replay as tp
    from replay.models import make_model
    from replay.trace import TraceRequest, generate_trace, trace_ideal
finally:
    sys.path.remove(str(BENCH))

HM = tp.measure_host_model(make_model("llama"))


def _run(trace: list[TraceRequest], replicas: int, policy: str, store_x: float) -> dict[str, object]:
    longest = -(-max(r.input_length for r in trace) // 16)
    return cr.run_cluster(trace, 16, replicas, policy, num_blocks=longest + 1, host_x=1.0, store_x=store_x, alpha=256.0,
                          prefill_rate=81920.0, decode_rate=2000.0, hm=HM, ideal=trace_ideal(trace, 16))


@pytest.mark.parametrize("policy", ["kv", "round_robin"])
def test_a_store_that_holds_everything_reaches_the_ideal(policy: str) -> None:
    trace = generate_trace(40, 3, rate_per_s=40.0, max_prompt=3000)
    r = _run(trace, 2, policy, 1000.0)
    assert r["reused_tokens"] == r["ideal_tokens"] > 0
    assert r["device_tokens"] + r["host_tokens"] + r["store_tokens"] + r["computed_tokens"] == r["prompt_tokens"]
    assert sum(r["decisions"]) == 40 and r["refused_records"] == 0  # type: ignore[arg-type]


def test_without_a_store_only_the_replicas_own_tiers_serve() -> None:
    trace = generate_trace(40, 3, rate_per_s=40.0, max_prompt=3000)
    with_store, without = _run(trace, 2, "round_robin", 1000.0), _run(trace, 2, "round_robin", 0.0)
    assert without["store_tokens"] == 0 and without["reused_tokens"] < with_store["reused_tokens"]  # type: ignore[operator]
