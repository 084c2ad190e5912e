"""kvcore's layouts and the byte budgets: how kvcore_layout spends a budget on kvcore's pools
(one pool or one per group, states apart or in the pool), the block tables' page size, pages and
bytes, and a run's budgets by name (budgets_for, from an infinite-cache replay).

Budgets are bytes of K/V and state. vLLM: num_blocks = budget // (page bytes x layers a block
id spans); one pool serves every group. kvcore (`kvcore_layout`, the one function that knows):
with its one pool (BatchLimits.page_layers, commit b9e2046) the budget less the State groups'
slots buys num_blocks pages of B rows of page_layers layers (vLLM's grouping rule, its
default); before it, one pool per group: by default every block group got the same number of
blocks (bytes in proportion to their bytes per block), `--ring-share F` gave the ring group the
fraction F, and a ring group's pool, sized by max_active_seqs alone, set max_active_seqs through
its share; the scheduler runs at most min(max_running, max_active_seqs).
A State group owns max_active_seqs x D + min(max_step_tokens, max_active_seqs x D) +
state_snapshots physical slots (what PagedKVPool allocates; D = 1 here); the first two are taken
off the top (with the one pool, max_active_seqs is at most what half the budget holds of them:
the scheduler then runs at most that many), and the snapshots get by default
one slot per chunk unit of tokens the flat pool holds (`--state-share F`: the fraction F of
what is left; `--state-step-slots outside` leaves the step's spare slots out of the budget,
reported apart). With `--states-in-pool` (BatchLimits.states_in_pool) a hybrid's states are
pages of the one pool instead, one per State group of page_layers State layers (Qwen3-Next-like:
three), at the block size vLLM runs the model at (a page must hold a state), so the budget buys
num_blocks pages and nothing else; both systems then run at that block. The budgets: `ample`
(nothing is ever evicted: the flat pool holds every block
the run computes, the ring pool every ring block, a snapshot for every state named; at least 2x
the peak), `2x` and `0.7x` the peak working set (the most bytes the running requests' K/V and
states take at once when the cache is infinite: full-attention blocks they share counted once,
ring blocks (at most kvcore's per-sequence ring share) and states per sequence).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from replay.models import BF16, Model
from replay.scheduler import SchedulerConfig, replay, ring_blocks_per_seq
from replay.trace import HASH_BLOCK, TraceRequest

MAX_ACTIVE_CAP = 1 << 16  # kvcore max_active_seqs bound (table rows) the layout may ask for


def page_blocks_for(stride: int) -> int:
    """The page size that makes paged tables smallest for rows of `stride` entries: a row costs
    its directory (stride / P ids) and up to two partly filled pages (2 P entries), least at
    P = sqrt(stride / 2); the power of two nearest it."""
    return 1 << max(0, round(math.log2(max(1.0, math.sqrt(stride / 2)))))


def table_pages_for(group_entries: Sequence[int], max_active: int, stride: int, page_blocks: int) -> int:
    """The table pages the replay gives a paged cache: each group's entries at the traffic's peak
    (`group_entries`, KvcoreAdapter: a flat group's the running requests' blocks, counted per
    request; a ring group's at most its window's a row) in full pages, plus two partly filled
    pages per row and group, capped at every row full. The tables name only the running rows'
    blocks, never the cached ones, so they follow the traffic, not the pool: a budget twice the
    peak working set needs no more table pages than one at the peak. A step short of pages is
    refused and the scheduler preempts, as for blocks (the replay counts it)."""
    n_groups = len(group_entries)
    full = n_groups * max_active * -(-stride // page_blocks)
    return min(full, sum(-(-e // page_blocks) for e in group_entries) + 2 * n_groups * max_active)


def table_bytes(cache: Any, paged: bool) -> int:
    """Bytes of a BatchCache's block tables: dense rows (4 bytes an entry), or the table pages
    (4 bytes an entry, 8 of counts and free list a page) and each row's page directory."""
    rows, groups, stride = cache.max_active_seqs, cache.n_groups, cache.table_stride
    if not paged:
        return groups * rows * stride * 4
    P = cache.table_page_blocks
    return cache.table_pages * (P * 4 + 8) + groups * rows * -(-stride // P) * 4


def _state_split(out: dict[str, Any], cfg: SchedulerConfig, budget: int, max_active: int, step_slots_in_budget: bool,
                 block_bytes: int, slot: int, block: int, state_share: float | None, pool: str) -> tuple[int, int, int]:
    """Splits `budget` bytes for a model with State layers: first the State group's fixed slots
    (max_active sequences' own, plus a step's spare ones unless step_slots_in_budget is False),
    then blocks of `block_bytes` and state snapshots of `slot` bytes, by default one snapshot
    per chunk of tokens `pool` holds, or the fraction `state_share` to the snapshots. Returns
    (blocks, snapshots, fixed state bytes) and records the split in `out`."""
    spare = state_step_slots(cfg, max_active)
    out["state_step_slots_outside_budget_bytes"] = 0 if step_slots_in_budget else spare * slot
    state_fixed = (max_active + (spare if step_slots_in_budget else 0)) * slot
    rest = max(budget - state_fixed, 0)
    if state_share is None:
        out["split"] = f"state: one snapshot per {cfg.chunk} tokens {pool} holds"
        if block <= cfg.chunk:
            blocks = rest // (block_bytes + slot * block // cfg.chunk)
            return blocks, blocks * block // cfg.chunk, state_fixed
        blocks = rest // (block_bytes + slot)
        return blocks, blocks, state_fixed
    if not 0 < state_share < 1:
        raise ValueError(f"state_share {state_share} must lie in (0, 1)")
    out["split"] = f"state {state_share}"
    snapshots = int(rest * state_share) // slot
    return (rest - snapshots * slot) // block_bytes, snapshots, state_fixed


def kvcore_layout(model: Model, block: int, budget: int, cfg: SchedulerConfig, capacity: int,
                  ring_share: float | None = None, state_share: float | None = None,
                  step_slots_in_budget: bool = True, one_pool: bool = False,
                  states_in_pool: bool = False) -> dict[str, Any]:
    """How kvcore's per-group pools spend `budget` bytes (module docstring): flat num_blocks,
    max_active_seqs (the ring pool and the tables), state_snapshots, the bytes each part takes,
    and the block tables' bytes (outside the budget). 'feasible' is False when the budget cannot
    hold one active sequence (or the State group's fixed slots). step_slots_in_budget=False
    leaves the State group's max_step_tokens slots out of the budget (reported apart).
    one_pool: kvcore's one pool for every block group (BatchLimits.page_layers, b9e2046): the
    budget less the State group's slots buys num_blocks blocks of one page each (B rows of the
    largest group's layers); ring_share does not apply. states_in_pool (with one_pool, a model
    with State layers): BatchLimits.states_in_pool, every state a block of the pool, `block`
    large enough that a page holds a state (vllm_block_size); state_share does not apply."""
    if one_pool and states_in_pool and model.has_state:
        return _states_in_pool_layout(model, block, budget, cfg, capacity)
    if one_pool:
        return _one_pool_layout(model, block, budget, cfg, capacity, state_share, step_slots_in_budget)
    flat_bpb = model.bytes_per_token("full") * block
    ring_bpb = model.bytes_per_token("sliding") * block
    slot = model.state_bytes
    per_seq = ring_blocks_per_seq(model, block, cfg.chunk, capacity, cfg.max_rewind)
    out: dict[str, Any] = {"flat_bytes_per_block": flat_bpb, "ring_bytes_per_block": ring_bpb,
                           "state_bytes_per_slot": slot, "ring_blocks_per_seq": per_seq,
                           "split": "equal blocks per group" if ring_share is None else f"ring {ring_share}"}
    snapshots = 0
    state_fixed = 0
    if ring_bpb:
        if ring_share is None:
            n = budget // (flat_bpb + ring_bpb)
            max_active = n // per_seq
        else:
            if not 0 < ring_share < 1:
                raise ValueError(f"ring_share {ring_share} must lie in (0, 1)")
            max_active = int(budget * ring_share) // (per_seq * ring_bpb)
        max_active = min(max_active, MAX_ACTIVE_CAP)
        flat = (budget - max_active * per_seq * ring_bpb) // flat_bpb
    elif slot:
        max_active = cfg.max_running
        flat, snapshots, state_fixed = _state_split(out, cfg, budget, max_active, step_slots_in_budget, flat_bpb, slot,
                                                    block, state_share, "the flat pool")
    else:
        max_active = cfg.max_running
        flat = budget // flat_bpb
    flat = max(int(flat), 0)
    feasible = max_active >= 1 and flat >= 1 and budget >= state_fixed
    n_groups = 1 + (1 if ring_bpb else 0)
    out.update({
        "feasible": bool(feasible), "num_blocks_flat": flat, "max_active_seqs": int(max_active),
        "ring_blocks": int(max_active * per_seq), "state_snapshots": int(snapshots),
        "state_fixed_slots": (max_active + state_step_slots(cfg, max_active)) if slot else 0,
        "bytes_flat": flat * flat_bpb, "bytes_ring": max_active * per_seq * ring_bpb,
        "bytes_state": ((max_active + (state_step_slots(cfg, max_active) if step_slots_in_budget else 0) + snapshots) * slot)
        if slot else 0,
        "table_bytes": n_groups * max_active * -(-capacity // block) * 4,
    })
    out["bytes_total"] = out["bytes_flat"] + out["bytes_ring"] + out["bytes_state"]
    return out


def block_chunk(block: int, chunk: int) -> int:
    """The prefill chunk unit when prefill splits on block boundaries (vLLM's align mode on a
    hybrid, kvcore with --states-in-pool): the smallest multiple of `block` at least `chunk`."""
    return block * max(1, -(-chunk // block))


def state_groups_of(model: Model, page_layers: int) -> int:
    """State groups of at most `page_layers` State layers (BatchLimits.states_in_pool)."""
    return -(-sum(lay.kind == "state" for lay in model.layers) // page_layers)


def page_groups(model: Model, states_in_pool: bool = False) -> tuple[int, int, int]:
    """kvcore's default grouping under one pool (vLLM's rule): (page_layers, number of block
    groups, bytes of one token in one page: page_layers layers' K and V). states_in_pool: the
    State layers count as a policy too (they form State groups of page_layers layers)."""
    counts: dict[tuple[str, int, int, int], int] = {}
    for lay in model.layers:
        if lay.kind != "state":
            key = (lay.kind, lay.window, lay.kv_heads, lay.head_dim)
            counts[key] = counts.get(key, 0) + 1
    n_state = sum(lay.kind == "state" for lay in model.layers)
    p = min(list(counts.values()) + ([n_state] if states_in_pool and n_state else []))
    n_groups = sum(-(-c // p) for c in counts.values())
    per_token = max(k[2] * k[3] * 2 * BF16 for k in counts)
    return p, n_groups, p * per_token


def _states_in_pool_layout(model: Model, block: int, budget: int, cfg: SchedulerConfig,
                           capacity: int) -> dict[str, Any]:
    """One pool for every group, the states' included (BatchLimits.states_in_pool): the budget
    buys num_blocks pages of `block` rows of page_layers layers; a state of a State group
    (page_layers State layers) takes one page, which must hold it (ValueError otherwise: pass
    vllm_block_size's block)."""
    p, n_groups, page_token = page_groups(model, states_in_pool=True)
    bpb = page_token * block
    per_layer_state = max(lay.state_bytes for lay in model.layers if lay.kind == "state")
    if per_layer_state * p > bpb:
        raise ValueError(f"block {block}: a page of {bpb} bytes cannot hold a State group's state "
                         f"({p} x {per_layer_state} bytes)")
    num = max(budget // bpb, 0)
    return {"pool": "one pool, states in it (page_layers, states_in_pool)", "page_layers": p,
            "n_groups": n_groups, "n_state_groups": state_groups_of(model, p), "bytes_per_block": bpb,
            "state_bytes_per_slot": model.state_bytes, "split": "one pool, states in it",
            "states_in_pool": True, "feasible": bool(num >= 1), "num_blocks_flat": int(num),
            "num_blocks": int(num), "max_active_seqs": cfg.max_running, "ring_blocks": 0,
            "state_snapshots": 1, "state_fixed_slots": 0, "bytes_flat": int(num) * bpb, "bytes_ring": 0,
            "bytes_state": 0, "bytes_total": int(num) * bpb,
            "table_bytes": n_groups * cfg.max_running * -(-capacity // block) * 4}


def state_step_slots(cfg: SchedulerConfig, max_active: int) -> int:
    """A State(1) group's spare physical slots: what one step stops naming until it ends,
    min(max_step_tokens, max_active_seqs x D) (docs/batch.md section 10)."""
    return min(cfg.token_budget, max_active)


def _one_pool_layout(model: Model, block: int, budget: int, cfg: SchedulerConfig, capacity: int,
                     state_share: float | None, step_slots_in_budget: bool) -> dict[str, Any]:
    p, n_groups, page_token = page_groups(model)
    bpb = page_token * block
    slot = model.state_bytes
    max_active = cfg.max_running
    if slot:
        # Each active sequence fixes D + (at most) D state slots (its own and a step's spare, D = 1
        # here): sequences the budget can give at most half of itself to, so the pages and the
        # snapshots keep the other half (the scheduler runs at most this many).
        max_active = max(1, min(max_active, budget // (2 * 2 * slot)))
    out: dict[str, Any] = {"pool": "one pool (page_layers)", "page_layers": p, "n_groups": n_groups,
                           "bytes_per_block": bpb, "state_bytes_per_slot": slot}
    snapshots = 0
    state_fixed = 0
    if slot:
        num, snapshots, state_fixed = _state_split(out, cfg, budget, max_active, step_slots_in_budget, bpb, slot, block,
                                                   state_share, "the pool")
    else:
        out["split"] = "one pool"
        num = budget // bpb
    num = max(int(num), 0)
    out.update({
        "feasible": bool(num >= 1 and budget >= state_fixed), "num_blocks_flat": num, "num_blocks": num,
        "max_active_seqs": max_active, "ring_blocks": 0, "state_snapshots": int(snapshots),
        "state_fixed_slots": (max_active + state_step_slots(cfg, max_active)) if slot else 0,
        "bytes_flat": num * bpb, "bytes_ring": 0,
        "bytes_state": ((max_active + (state_step_slots(cfg, max_active) if step_slots_in_budget else 0) + snapshots) * slot)
        if slot else 0,
        "table_bytes": n_groups * max_active * -(-capacity // block) * 4,
    })
    out["bytes_total"] = out["bytes_flat"] + out["bytes_state"]
    return out


def kvcore_one_pool() -> bool:
    """True when the kvcore module draws every block group from one pool (BatchLimits.page_layers)."""
    import kvcore

    return hasattr(kvcore.BatchLimits(), "page_layers")


def capacity_of(trace: Sequence[TraceRequest], block: int) -> int:
    """The longest request (prompt + output), rounded up to a multiple of 512 and of block."""
    longest = max(r.input_length + r.output_length for r in trace)
    unit = math.lcm(block, HASH_BLOCK)
    return -(-longest // unit) * unit


def budgets_for(model: Model, block: int, trace: Sequence[TraceRequest], cfg: SchedulerConfig,
                capacity: int, names: Sequence[str], ring_share: float | None,
                state_share: float | None, step_slots_in_budget: bool = True,
                one_pool: bool = False, states_in_pool: bool = False) -> tuple[dict[str, int], dict[str, Any]]:
    """The byte budgets by name ('ample', '2x', '0.7x'), from an infinite-cache run: the peak
    working set, and for 'ample' the smallest budget whose kvcore layout holds every block and
    snapshot the run names (found by bisection)."""
    pooled_states = one_pool and states_in_pool and model.has_state
    # States in the pool: prefill splits on block boundaries (KvcoreAdapter.chunk_unit), here too.
    unit = block_chunk(block, cfg.chunk) if pooled_states else cfg.chunk
    infb = replay(trace, None, cfg, model, capacity=capacity, block=block, chunk_unit=unit)
    peak = infb.peak_working_set
    need_blocks = infb.distinct_blocks + infb.peak_running_blocks + 16
    per_seq = ring_blocks_per_seq(model, block, cfg.chunk, capacity, cfg.max_rewind)
    need_active = (-(-need_blocks // per_seq) + cfg.max_running) if per_seq else 0
    need_snap = infb.named_states + cfg.max_running + 16
    if one_pool:  # every group keeps its own copy of each block in the one pool
        p, n_groups, _ = page_groups(model, pooled_states)
        need_blocks *= n_groups
        need_active = 0
        if pooled_states:  # and each State group a page per named or running state
            need_blocks += need_snap * state_groups_of(model, p)

    def enough(b: int) -> bool:
        lay = kvcore_layout(model, block, b, cfg, capacity, ring_share, state_share, step_slots_in_budget,
                            one_pool, states_in_pool)
        return (lay["feasible"] and lay["num_blocks_flat"] >= need_blocks
                and lay["max_active_seqs"] >= min(need_active, MAX_ACTIVE_CAP)
                and (not model.has_state or pooled_states or lay["state_snapshots"] >= need_snap))

    hi = max(peak, 1 << 30)
    while not enough(hi):
        hi *= 2
    lo = hi // 2
    while hi - lo > max(hi // 1000, 1):
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if enough(mid) else (mid, hi)
    out = {}
    multiples = [float(n[:-1]) for n in names if n.endswith("x")] + [2.0]
    for n in names:
        if n == "ample":  # everything fits, and at least the largest multiple of the peak asked
            out[n] = max(hi, int(max(multiples) * peak))
        elif n.endswith("x"):
            try:
                out[n] = int(float(n[:-1]) * peak)
            except ValueError:
                raise ValueError(f"budget {n!r}: expected 'ample' or a multiple of the peak like '2x'") from None
        else:
            raise ValueError(f"budget {n!r}: expected 'ample' or a multiple of the peak like '2x'")
    info = {"peak_working_set_bytes": peak, "ample_needs": {"blocks": need_blocks, "active": need_active,
                                                           "snapshots": need_snap},
            "infinite_cache_reused_pct": 100.0 * sum(infb.hits_first) / sum(r.input_length for r in trace),
            "infinite_cache_steps": infb.steps, "peak_running_blocks": infb.peak_running_blocks}
    return out, info
