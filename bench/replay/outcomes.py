"""One replay's outcomes: RunResult (per request and run-wide, as replay() returns them) and
summarize(), the JSON figures of one system's run."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from replay.trace import TraceRequest


@dataclass
class RunResult:
    """Per-request outcomes and run-wide peaks of one replay."""

    hits_first: list[int]
    hits_all: list[list[int]]
    ideal_online: list[int]
    refused: list[int]
    preempted: list[int]
    cpu_us: list[float]
    aux_us: list[float]
    delays: list[int]  # steps from arrival to the first admission (-1: refused)
    first_tokens: list[int]  # steps from arrival to the first token sampled (-1: refused)
    peak_blocks: int
    peak_bytes: int
    peak_working_set: int
    steps: int
    distinct_blocks: int
    named_states: int
    peak_running_blocks: int
    violations: list[str]


def _spread(values: list[int]) -> dict[str, float]:
    """Mean, median, 90th percentile (nearest rank) and max of per-request step counts."""
    v = sorted(values) or [0]
    return {"mean": statistics.fmean(v), "median": statistics.median(v), "p90": v[-(-9 * len(v) // 10) - 1],
            "max": v[-1]}


def summarize(name: str, res: RunResult, trace: Sequence[TraceRequest], wall_s: float) -> dict[str, Any]:
    """The JSON figures of one system's run."""
    prompt = sum(r.input_length for r in trace)
    reused = sum(res.hits_first)
    refused = set(res.refused)
    served = [i for i in range(len(trace)) if i not in refused]
    cpu = [res.cpu_us[i] for i in served] or [0.0]
    aux = [res.aux_us[i] for i in served] or [0.0]
    short = [i for i, r in enumerate(trace) if r.input_length < 1024]
    return {
        "system": name, "reused_tokens": reused, "reused_pct": 100.0 * reused / prompt,
        "ideal_online_pct": 100.0 * sum(res.ideal_online) / prompt,
        "reused_all_admissions": sum(sum(h) for h in res.hits_all),
        "refused": len(res.refused), "refused_ids": res.refused[:200],
        "preempted": len(res.preempted), "peak_blocks": res.peak_blocks, "peak_bytes": res.peak_bytes,
        "cpu_us_median": statistics.median(cpu), "cpu_us_total": sum(cpu),
        "request_hashing_us_median": statistics.median(aux), "request_hashing_us_total": sum(aux),
        "steps": res.steps, "wall_s": wall_s, "hits": res.hits_first,
        "admission_delays": res.delays,
        "admission_delay_steps": _spread([res.delays[i] for i in served]),
        "first_token_steps": _spread([res.first_tokens[i] for i in served]),
        "ideal_online": res.ideal_online,
        "short_prompts_lt_1024": {"count": len(short), "reused": sum(res.hits_first[i] for i in short),
                                  "prompt_tokens": sum(trace[i].input_length for i in short)},
    }
