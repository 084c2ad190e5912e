"""Replays a Mooncake-format request trace through kvcore's BatchCache and, in a process of
its own, vLLM 0.33's KVCacheManager, under one scheduler, and compares prompt reuse, refusals,
preemptions, memory in use and the CPU time spent in each system's calls (issue 39 item 6).

Scheduler (the same code drives both systems through a thin adapter each):
- time: a step is one forward of at most `token_budget` new tokens (default 4,096) and
  `max_running` sequences (default 128) that takes `step_ms` ms (default 50): a request with
  timestamp t may be admitted from step floor(t / step_ms) on; when nothing runs or waits the
  clock jumps to the next arrival;
- a step first serves the running requests in admission order, then admits waiting ones FCFS
  (vLLM's scheduler order); a request's chunk runs from its computed length to the next
  multiple of the adapter's chunk unit (512 tokens; for vLLM on the hybrid model the smallest
  multiple of its block size at least 512, as its align mode splits prefill on block
  boundaries, and so for kvcore with `--states-in-pool`), to its prompt's last full-block boundary (models with state layers: the state
  there is what the next turn of a conversation reuses), or to its known tokens, and is
  scheduled only if it fits in what is left of the step's token budget; after the prefill one
  token per step is decoded until `output_length` tokens are sampled;
- admission: the adapter looks the prompt (plus any tokens sampled before a preemption) up in
  the prefix cache and allocates the first chunk; if it cannot, the request waits (and the
  admission loop stops) unless nothing else runs, in which case it can never fit and is
  *refused*; a running request that cannot get blocks for its chunk preempts the most recently
  admitted running request (freed and put at the head of the queue with nothing computed, as
  vLLM's scheduler does), itself last; one that cannot grow while it runs alone is refused;
- in flight (models with state): a request whose first prompt block past its hit is one another
  entry of this step completes waits (and the admission loop stops), as vLLM's MambaManager
  keeps a request whose hit ends on a block scheduled this step: after the commit its hit
  reaches past that block, so it reuses the prefix its producer computes instead of computing
  it again alongside (kvcore's KvcoreAdapter: the keys of the step's completed blocks);
- named states first (kvcore, states in the pool): a running request short of blocks first has
  the running requests give back the latest state each named (BatchCache.release_named_state:
  held for a later hit), most recently admitted first, and preempts only when that is not
  enough.

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

Ideal: `ideal_trace`, per request the longest prefix of full blocks (at the system's block
size) of its prompt that an earlier request's prompt holds, at most input_length - 1 tokens;
`ideal_online`, what an infinite cache holds at the moment of the admission in this run (blocks
committed by earlier steps; for models with state layers only up to a position where a step
ended on a block boundary, where kvcore names a state snapshot). kvcore's checks (an
AssertionError, or exit status 1 after the JSON is written): every hit is a multiple of the
block size, at most ideal_online, and a first admission's at most ideal_trace; every block of a
hit holds the tokens it was computed from (the replay records, per group and block id, a chained
fingerprint of the tokens each step filled it with, and compares the adopting request's); with
the ample budget every hit equals ideal_online. Lookup and KV events (when the module has them:
`BatchCache.lookup_prefix`, bound with the one pool): the scheduler asks lookup_prefix (no side
effect) before admitting, admission's adopt_prefix must give the same hit, and the KV events
drained after every step are checked against the replay (a stored key is a block a step of the
replay filled, at its token range, not stored twice; an evicted key was stored; every hit
block's key is stored; none dropped). With an older module the lookup is `adopt_prefix` on the
sequence being admitted (released again if the first chunk does not fit, which touches the LRU
order) and no events are checked; the JSON says which (`lookup`, `kv_events_checked`).
`--vllm-results` takes vLLM's rows from earlier runs of the same trace instead of running it
again (vLLM does not change with kvcore's build).

CPU: time.thread_time_ns around each system's calls only (kvcore: add_sequence, adopt_prefix,
blocks_needed / free_blocks, begin_step + commit, release_sequence; vLLM: get_computed_blocks,
allocate_slots, get_block_ids, free, new_step_starts and the per-step drains; vLLM's Request
construction and append_output_token_ids, which hash its blocks, are reported apart). A step's
shared cost is split evenly over its entries. Both publish KV events inside those calls (kvcore's
drain_kv_events every step, vLLM's manager built with enable_kv_cache_events, take_events every
step), as a server feeding a router does; `--no-kv-events` turns both off. (Rows before this
switch, which vLLM's `--vllm-results` may reuse, timed kvcore's events against a vLLM without
them: their JSON's scheduler has no `kv_events`.)

    eval "$(scripts/dev.sh replay)"
    python3 bench/trace_replay.py --quick                      # ~1 minute
    python3 bench/trace_replay.py --out bench/results/trace_replay.json   # full
    python3 bench/trace_replay.py --generate 2000 --seed 7 --out ...      # a generated trace
    python3 bench/trace_replay.py --write-trace t.jsonl --generate 500    # only write it
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, cast

import numpy as np

# Until their users import them from bench/replay/, every name moved there is imported here too.
from replay.models import BF16, Layer, Model, make_model, vllm_block_size  # noqa: F401
from replay.trace import (DECODE_BASE, DEFAULT_TRACE, HASH_BLOCK, PROMPT_ID_LIMIT, TraceRequest,
                          _check_request, block_fingerprints, decode_token, generate_trace, load_trace,
                          prompt_tokens, trace_ideal, write_trace)  # noqa: F401

DEFAULT_VLLM_PYTHON = "/tmp/vllm-venv/bin/python"
MAX_ACTIVE_CAP = 1 << 16  # kvcore max_active_seqs bound (table rows) the layout may ask for


# --- scheduler ----------------------------------------------------------------------------

@dataclass(frozen=True)
class SchedulerConfig:
    """The serving loop's throughput model (module docstring)."""

    step_ms: float = 50.0
    token_budget: int = 4096
    chunk: int = 512
    max_running: int = 128
    # kvcore's BatchLimits.max_rewind: the serving loop never rewinds (neither does vLLM's
    # sliding window keep a margin), so ring groups hold W - 1 positions between steps.
    max_rewind: int = 0
    # Both systems publish KV events (what a router or a lower tier needs), inside their timed
    # calls: kvcore's queue drained every step, vLLM's enable_kv_cache_events with take_events.
    # False: neither does (kvcore's events, and their checks, off).
    kv_events: bool = True
    # kvcore's BatchLimits.table_page_blocks: 0 keeps a dense block table row of
    # ceil(capacity / B) entries per active sequence and group; P pages the rows (tables sized
    # by use), bounded by table_pages_for(); -1 picks P by page_blocks_for().
    table_page_blocks: int = 0
    # kvcore's BatchLimits.state_block_size on models with State layers: 0 names a state at
    # every block boundary a step ends on; S (a multiple of the block size) only at multiples of
    # S, and kvcore's prefill chunks then end on them (vLLM's align mode at block size S).
    state_block: int = 0

    def __post_init__(self) -> None:
        if not self.step_ms > 0:
            raise ValueError(f"step_ms {self.step_ms} must be > 0")
        if self.chunk < 1 or self.token_budget < self.chunk:
            raise ValueError(f"chunk {self.chunk} must be >= 1 and <= token_budget {self.token_budget}")
        if self.max_running < 1:
            raise ValueError(f"max_running {self.max_running} must be >= 1")
        P = self.table_page_blocks
        if P < -1 or (P > 0 and (P & (P - 1)) != 0):
            raise ValueError(f"table_page_blocks {P} must be 0, -1 (by the row length) or a power of two")
        if self.state_block < 0:
            raise ValueError(f"state_block {self.state_block} must be >= 0 (0: the block size)")


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


@dataclass
class Live:
    """A request's state in the replay."""

    req: TraceRequest
    prompt: np.ndarray
    tokens: np.ndarray  # prompt, then sampled tokens (grown on demand)
    known: int  # tokens known (prompt + sampled)
    computed: int = 0
    generated: int = 0
    admissions: int = 0
    preemptions: int = 0
    refused: bool = False
    finished: bool = False
    hit_first: int = -1
    hits: list[int] = field(default_factory=list)
    fps: list[int] = field(default_factory=list)
    cpu_ns: int = 0
    aux_ns: int = 0
    handle: Any = None

    def fp(self, i: int, block: int) -> int:
        """Fingerprint of this sequence's full block i (block tokens)."""
        if i >= len(self.fps):
            block_fingerprints(self.tokens, block, i + 1, self.fps)
        return self.fps[i]

    def append_sampled(self) -> int:
        """Appends the next sampled token; returns it."""
        tok = decode_token(self.req.index, self.generated)
        if self.known == len(self.tokens):
            grown = np.empty(max(16, 2 * len(self.tokens)), dtype=np.int32)
            grown[: self.known] = self.tokens[: self.known]
            self.tokens = grown
        self.tokens[self.known] = tok
        self.known += 1
        return tok


class Adapter(Protocol):
    """What the scheduler asks of a system (kvcore or vLLM)."""

    block_size: int
    chunk_unit: int
    max_running: int
    has_state: bool
    # Where a model with State layers names states (and a prompt's prefill stops before its
    # tail): the block size, or kvcore's State block (BatchLimits.state_block_size).
    state_block: int

    def start_step(self) -> None: ...
    def lookup(self, lv: Live) -> int: ...
    def admit(self, lv: Live, hit: int, n: int) -> bool: ...
    def cancel(self, lv: Live) -> None: ...
    def grow(self, lv: Live, n: int) -> bool: ...
    def end_step(self, entries: list[tuple[Live, int]]) -> None: ...
    def sampled(self, lv: Live, token: int) -> None: ...
    def free(self, lv: Live, preempted: bool) -> None: ...
    def in_use(self) -> tuple[int, int]: ...


class InfiniteCache:
    """What an infinite cache holds: every full block a step committed (chained fingerprints at
    block_size) and, for state models, every block-boundary position a step ended at (only
    multiples of state_block, when given: BatchLimits.state_block_size)."""

    def __init__(self, block_size: int, has_state: bool, state_block: int = 0):
        self.block = block_size
        self.state_block = state_block or block_size
        self.has_state = has_state
        self.blocks: set[int] = set()
        self.states: set[int] = set()

    def committed(self, lv: Live, before: int, after: int) -> None:
        """lv computed positions [before, after) in one step."""
        b = self.block
        for i in range(before // b, after // b):
            self.blocks.add(lv.fp(i, b))
        if self.has_state and after % self.state_block == 0:
            self.states.add(lv.fp(after // b - 1, b))

    def hit(self, lv: Live) -> int:
        """Tokens an infinite cache reuses for lv now (at most known - 1)."""
        b = self.block
        cap = (lv.known - 1) // b
        k = 0
        while k < cap and lv.fp(k, b) in self.blocks:
            k += 1
        if self.has_state:
            while k > 0 and lv.fp(k - 1, b) not in self.states:
                k -= 1
        return k * b


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
    peak_blocks: int
    peak_bytes: int
    peak_working_set: int
    steps: int
    distinct_blocks: int
    named_states: int
    peak_running_blocks: int
    violations: list[str]


def chunk_end(lv: Live, start: int, unit: int, stop_block: int) -> int:
    """Where a chunk starting at `start` ends: the next multiple of `unit`, the prompt's last
    full-block boundary (stop_block > 0: models with state), or the known tokens."""
    end = min(lv.known, (start // unit + 1) * unit)
    if stop_block > 0:
        tail = lv.known - 1 if lv.generated == 0 else lv.req.input_length
        tail = tail // stop_block * stop_block
        if start < tail < end:
            end = tail
    return end


def working_set_bytes(model: Model, block: int, lengths: Iterable[int], per_seq_ring: int) -> int:
    """Bytes the running sequences of these lengths hold as kvcore keeps them: full layers every
    block, sliding layers at most per_seq_ring blocks, one state each."""
    full = model.bytes_per_token("full") * block
    ring = model.bytes_per_token("sliding") * block
    total = 0
    for n in lengths:
        nb = -(-n // block)
        total += nb * full + min(nb, per_seq_ring) * ring + model.state_bytes
    return total


def ring_blocks_per_seq(model: Model, block: int, chunk: int, capacity: int, max_rewind: int) -> int:
    """kvcore's ring pool share of one active sequence: ceil((W + C + R - 1) / B) + 1 blocks (R the
    rewind margin), at most a full table (docs/batch.md section 2); 0 without sliding layers."""
    if not model.window:
        return 0
    margin = chunk if max_rewind < 0 else max_rewind
    return min(-(-(model.window + chunk + margin - 1) // block) + 1, -(-capacity // block))


def replay(trace: Sequence[TraceRequest], adapter: Adapter | None, cfg: SchedulerConfig,
           model: Model, *, check: bool = False, exact: bool = False,
           ideal_trace: Sequence[int] | None = None, capacity: int = 0, block: int = 0,
           chunk_unit: int = 0) -> RunResult:
    """Runs the scheduler over `trace` with `adapter` (None: an infinite cache that hits
    ideal_online at `block` tokens a block, for the ideal and the peak working set, its prefill
    split on multiples of `chunk_unit`, default cfg.chunk). `check`: kvcore's hit checks (module
    docstring) raise AssertionError at the first violation; `exact`: also hit == ideal_online."""
    block = adapter.block_size if adapter is not None else (block or cfg.chunk)
    has_state = model.has_state
    unit = adapter.chunk_unit if adapter is not None else (chunk_unit or cfg.chunk)
    max_running = adapter.max_running if adapter is not None else cfg.max_running
    # Models with state stop a prompt's prefill at its last (State) block boundary: a state is
    # named there for the next turn.
    stop_block = (adapter.state_block if adapter is not None else block) if has_state else 0
    inf = InfiniteCache(block, has_state, stop_block)
    # The peak working set counts a ring's share with a margin of one chunk whatever kvcore's
    # max_rewind, so the budgets (multiples of it) stay those of earlier runs and both systems'.
    per_seq_ring = ring_blocks_per_seq(model, block, cfg.chunk, capacity or 1 << 30, -1)
    lives = [Live(r, prompt_tokens(r), np.empty(0, np.int32), r.input_length) for r in trace]
    for lv in lives:
        lv.tokens = lv.prompt
    pending = deque(lives)
    waiting: deque[Live] = deque()
    running: list[Live] = []
    ideal_online = [0] * len(trace)
    step = 0
    peak_blocks = peak_bytes = peak_ws = peak_running_blocks = 0
    violations: list[str] = []

    def fail(msg: str) -> None:
        violations.append(msg)
        raise AssertionError(msg)

    def arrival_step(lv: Live) -> int:
        return int(lv.req.arrival_ms // cfg.step_ms)

    def preempt(lv: Live) -> None:
        if adapter is not None:
            adapter.free(lv, True)
        lv.computed = 0
        lv.preemptions += 1
        waiting.appendleft(lv)

    def refuse(lv: Live) -> None:
        if adapter is not None:
            adapter.free(lv, False)
        lv.refused = True
        lv.tokens = np.empty(0, np.int32)
        lv.fps = []

    held: dict[int, int] = {}  # infinite run: full blocks running sequences hold, by fingerprint
    held_upto: dict[int, int] = {}

    def hold(lv: Live, upto: int) -> None:
        for i in range(held_upto.get(lv.req.index, 0), upto):
            f = lv.fp(i, block)
            held[f] = held.get(f, 0) + 1
        held_upto[lv.req.index] = upto

    def unhold(lv: Live) -> None:
        for i in range(held_upto.pop(lv.req.index, 0)):
            f = lv.fp(i, block)
            if held[f] == 1:
                del held[f]
            else:
                held[f] -= 1

    track = adapter is None or check  # the infinite cache is needed for the ideal and the checks
    n_steps = 0
    while pending or waiting or running:
        if not running and not waiting:
            step = max(step, arrival_step(pending[0]))
        while pending and arrival_step(pending[0]) <= step:
            waiting.append(pending.popleft())
        if adapter is not None:
            adapter.start_step()
        budget = cfg.token_budget
        entries: list[tuple[Live, int]] = []
        i = 0
        while i < len(running):
            lv = running[i]
            n = chunk_end(lv, lv.computed, unit, stop_block) - lv.computed
            if n > budget:
                i += 1
                continue
            ok = True
            while adapter is not None and not adapter.grow(lv, n):
                victim = running.pop()
                if victim is lv:
                    if i == 0:  # alone and cannot grow: it never fits
                        refuse(lv)
                    else:
                        preempt(lv)
                    ok = False
                    break
                preempt(victim)
            if ok:
                entries.append((lv, n))
                budget -= n
                i += 1
        while waiting and budget > 0 and len(running) < max_running:
            lv = waiting[0]
            if arrival_step(lv) > step:
                break
            online = inf.hit(lv) if track else 0
            hit = adapter.lookup(lv) if adapter is not None else online
            n = chunk_end(lv, hit, unit, stop_block) - hit
            if n > budget:
                if adapter is not None:
                    adapter.cancel(lv)
                break
            if adapter is not None and not adapter.admit(lv, hit, n):
                adapter.cancel(lv)
                if running:
                    break
                waiting.popleft()
                refuse(lv)
                continue
            waiting.popleft()
            first = lv.admissions == 0
            lv.admissions += 1
            lv.hits.append(hit)
            if first:
                lv.hit_first = hit
                ideal_online[lv.req.index] = online
            if check:
                r = lv.req.index
                if hit % block:
                    fail(f"request {r}: hit {hit} is not a multiple of the block size {block}")
                if hit > online:
                    fail(f"request {r}: hit {hit} above what an infinite cache holds ({online})")
                if first and ideal_trace is not None and hit > ideal_trace[r]:
                    fail(f"request {r}: hit {hit} above the trace ideal {ideal_trace[r]}")
                if exact and hit != online:
                    fail(f"request {r}: ample budget, hit {hit} != ideal {online}")
            lv.computed = hit
            if adapter is None:
                hold(lv, hit // block)
            running.append(lv)
            entries.append((lv, n))
            budget -= n
        if adapter is not None and entries:
            adapter.end_step(entries)
        n_steps += 1
        done: list[Live] = []
        for lv, n in entries:
            if track:
                inf.committed(lv, lv.computed, lv.computed + n)
            lv.computed += n
            if adapter is None:
                hold(lv, lv.computed // block)
            if lv.computed == lv.known:
                tok = lv.append_sampled()
                lv.generated += 1
                if lv.generated == lv.req.output_length:
                    done.append(lv)
                elif adapter is not None:
                    adapter.sampled(lv, tok)
        if adapter is None:
            partial = sum(1 for lv in running if lv.computed % block)
            ws = ((len(held) + partial) * model.bytes_per_token("full") * block
                  + working_set_bytes(model.without("full"), block, (lv.computed for lv in running), per_seq_ring))
            peak_ws = max(peak_ws, ws)
        peak_running_blocks = max(peak_running_blocks, sum(-(-lv.computed // block) for lv in running))
        if adapter is not None:
            b, by = adapter.in_use()
            peak_blocks, peak_bytes = max(peak_blocks, b), max(peak_bytes, by)
        for lv in done:
            running.remove(lv)
            if adapter is None:
                unhold(lv)
            if adapter is not None:
                adapter.free(lv, False)
            lv.finished = True
            lv.tokens = np.empty(0, np.int32)
            lv.fps = []
        step += 1
    return RunResult(
        hits_first=[max(lv.hit_first, 0) for lv in lives], hits_all=[lv.hits for lv in lives],
        ideal_online=ideal_online, refused=[lv.req.index for lv in lives if lv.refused],
        preempted=[lv.req.index for lv in lives if lv.preemptions],
        cpu_us=[lv.cpu_ns / 1e3 for lv in lives], aux_us=[lv.aux_ns / 1e3 for lv in lives],
        peak_blocks=peak_blocks, peak_bytes=peak_bytes, peak_working_set=peak_ws, steps=n_steps,
        distinct_blocks=len(inf.blocks), named_states=len(inf.states),
        peak_running_blocks=peak_running_blocks, violations=violations)


# --- kvcore -------------------------------------------------------------------------------

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
        step_slots = state_step_slots(cfg, max_active) if step_slots_in_budget else 0
        out["state_step_slots_outside_budget_bytes"] = 0 if step_slots_in_budget else state_step_slots(cfg, max_active) * slot
        state_fixed = (max_active + step_slots) * slot
        rest = max(budget - state_fixed, 0)
        if state_share is None:
            out["split"] = f"state: one snapshot per {cfg.chunk} tokens the flat pool holds"
            flat = rest // (flat_bpb + slot * block // cfg.chunk) if block <= cfg.chunk else rest // (flat_bpb + slot)
            snapshots = flat * block // cfg.chunk if block <= cfg.chunk else flat
        else:
            if not 0 < state_share < 1:
                raise ValueError(f"state_share {state_share} must lie in (0, 1)")
            out["split"] = f"state {state_share}"
            snapshots = int(rest * state_share) // slot
            flat = (rest - snapshots * slot) // flat_bpb
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
        step_slots = state_step_slots(cfg, max_active) if step_slots_in_budget else 0
        out["state_step_slots_outside_budget_bytes"] = 0 if step_slots_in_budget else state_step_slots(cfg, max_active) * slot
        state_fixed = (max_active + step_slots) * slot
        rest = max(budget - state_fixed, 0)
        if state_share is None:
            out["split"] = f"state: one snapshot per {cfg.chunk} tokens the pool holds"
            num = rest // (bpb + slot * block // cfg.chunk) if block <= cfg.chunk else rest // (bpb + slot)
            snapshots = num * block // cfg.chunk if block <= cfg.chunk else num
        else:
            if not 0 < state_share < 1:
                raise ValueError(f"state_share {state_share} must lie in (0, 1)")
            out["split"] = f"state {state_share}"
            snapshots = int(rest * state_share) // slot
            num = (rest - snapshots * slot) // bpb
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


class KvcoreAdapter:
    """kvcore's BatchCache behind the scheduler's adapter calls (module docstring)."""

    def __init__(self, model: Model, block: int, layout: dict[str, Any], cfg: SchedulerConfig,
                 capacity: int, check: bool):
        import kvcore

        self.kv = kvcore
        self.model = model
        self.block_size = block
        # States in the pool, or a State block: prefill splits on (State) block boundaries, as
        # vLLM's align mode (a snapshot is named where a step ends on one).
        self.has_state = model.has_state
        self.state_block = cfg.state_block if self.has_state and cfg.state_block else block
        if self.state_block % block:
            raise ValueError(f"state_block {cfg.state_block} must be a multiple of the block size {block}")
        aligned = layout.get("states_in_pool") or self.state_block != block
        self.chunk_unit = block_chunk(self.state_block, cfg.chunk) if aligned else cfg.chunk
        if self.chunk_unit > cfg.token_budget:  # no prefill chunk would ever fit a step
            raise ValueError(f"prefill chunks of {self.chunk_unit} tokens (state_block {cfg.state_block}, block "
                             f"{block}) exceed token_budget {cfg.token_budget}")
        self.max_active = layout["max_active_seqs"]
        self.max_running = min(cfg.max_running, self.max_active)
        cache, self.bpb = self._make_cache(model, block, layout, cfg, capacity)
        self.cache: kvcore.BatchCache = cache
        self.n_groups = self.cache.n_groups
        self.one_pool = "page_layers" in layout
        self.states_in_pool = bool(layout.get("states_in_pool"))
        self.page_bytes = layout.get("bytes_per_block", 0)
        self.free_ids = list(range(self.max_active - 1, -1, -1))
        self.reserved = [0] * self.n_groups
        self.reserved_states = 0  # with states in the pool: the step's state blocks so far
        self.reserved_pages = 0  # with paged block tables: the step's table pages so far
        self.paged = cfg.table_page_blocks != 0
        self.peak_table_pages = 0
        self.short_of_pages = 0  # entries refused for table pages alone
        # Models with state: the keys of the full blocks this step's entries complete (in flight:
        # keyed, and their states named, only when the step commits). A waiting request whose
        # first block past its hit is one of them waits a step instead of computing it again,
        # as vLLM's scheduler keeps a Mamba request whose hit ends on a block scheduled this step
        # (MambaManager.get_num_blocks_to_allocate): it reuses the whole prefix once its
        # producer is past it.
        self.in_flight: dict[tuple[int, int], int] = {}  # key -> entries completing it
        self.in_flight_of: dict[int, list[tuple[int, int]]] = {}  # request -> its keys this step
        # States in the pool: the running sequences in admission order, and those whose latest
        # named state (BatchCache.release_named_state) this step already gave back.
        self.admitted: dict[int, Live] = {}
        self.named_released: set[int] = set()
        # Groups whose KV events the replay mirrors: the block groups, then the State groups in the pool.
        self.n_event_groups = self.n_groups + (self.cache.n_state_groups if self.states_in_pool else 0)
        self.check = check
        # What each block was computed from: by (group, block id), or by block id in one pool.
        self.content: dict[Any, int] = {}
        # KV events: the keys each group stores, mirrored from the drained events.
        self.stored: list[set[tuple[int, int]]] = [set() for _ in range(self.n_event_groups)]
        self.keys: dict[int, np.ndarray] = {}
        self.events = {"stored": 0, "evicted": 0, "cleared": 0}
        # lookup_prefix and KV events reach Python with batch_prefix.cpp; until then the lookup is
        # adopt_prefix on the sequence being admitted and no events are checked.
        self.ext = cast(Any, self.cache)  # the lookup / event verbs, typed once the binding's stubs have them
        self.has_lookup = hasattr(self.cache, "lookup_prefix")
        self.has_events = cfg.kv_events and hasattr(self.cache, "enable_kv_events")
        if self.has_events:
            self.ext.enable_kv_events(1 << 20)

    def _make_cache(self, model: Model, block: int, layout: dict[str, Any], cfg: SchedulerConfig,
                    capacity: int) -> tuple[Any, list[int]]:
        """The BatchCache of `model`'s layers laid out as `layout` says, and each block group's
        bytes per block (a subclass may build another shape: bench/tier_replay.py)."""
        kvcore = self.kv
        layers = []
        for lay in model.layers:
            if lay.kind == "full":
                layers.append(kvcore.LayerConfig(kvcore.Flat(), lay.kv_heads, lay.head_dim))
            elif lay.kind == "sliding":
                layers.append(kvcore.LayerConfig(kvcore.Ring(window=lay.window), lay.kv_heads, lay.head_dim))
            else:
                layers.append(kvcore.LayerConfig(kvcore.State(1)))
        extra: dict[str, Any] = {"page_layers": layout["page_layers"]} if "page_layers" in layout else {}
        if layout.get("states_in_pool"):
            extra["states_in_pool"] = True
        if cfg.table_page_blocks:
            stride = -(-capacity // block)
            # The groups the layout forms, from a one-block cache of the same layers.
            probe = kvcore.BatchCache(kvcore.CacheConfig(block, layers, max_step=1, batch=kvcore.BatchLimits(
                **extra, block_size=block, max_seqs=1, num_blocks=1)))
            running = layout.get("running_blocks", 0)
            if running < 1:
                raise ValueError(f"paged tables need layout['running_blocks'] >= 1 (the traffic's peak running "
                                 f"blocks, budgets_for's info), got {running}")
            # A ring group's row holds at most its window's blocks; a flat group's, every block.
            ring_row = ring_blocks_per_seq(model, block, self.chunk_unit, capacity, cfg.max_rewind)
            entries = [running] * probe.n_groups
            for i, lay in enumerate(model.layers):
                if lay.kind == "sliding":
                    entries[probe.group_of(i)] = min(running, self.max_active * ring_row)
            P = cfg.table_page_blocks if cfg.table_page_blocks > 0 else page_blocks_for(stride)
            extra["table_page_blocks"] = P
            extra["table_pages"] = table_pages_for(entries, self.max_active, stride, P)
        limits = kvcore.BatchLimits(**extra, block_size=block, max_seqs=self.max_active,
                                    max_active_seqs=self.max_active,
                                    max_step_tokens=cfg.token_budget,
                                    num_blocks=layout["num_blocks_flat"],
                                    state_snapshots=layout["state_snapshots"],
                                    state_block_size=self.state_block if self.has_state else 0,
                                    max_rewind=cfg.max_rewind)
        cache = kvcore.BatchCache(kvcore.CacheConfig(capacity, layers, max_step=self.chunk_unit, batch=limits))
        bpb = []
        for g in range(cache.n_groups):
            members = [i for i, lay in enumerate(model.layers) if lay.kind != "state" and cache.group_of(i) == g]
            bpb.append(block * sum(model.layers[i].kv_bytes_per_token for i in members))
        return cache, bpb

    def _key(self, lv: Live, i: int) -> tuple[int, int]:
        arr = self.keys.get(lv.req.index)
        if arr is None or len(arr) <= i:
            arr = getattr(self.kv, "block_keys")(lv.tokens[: lv.known], self.block_size)
            self.keys[lv.req.index] = arr
        return int(arr[i, 0]), int(arr[i, 1])

    def _timed(self, lv: Live | None, t0: int) -> None:
        if lv is not None:
            lv.cpu_ns += time.thread_time_ns() - t0

    def start_step(self) -> None:
        """A new step: nothing reserved yet."""
        self.reserved = [0] * self.n_groups
        self.reserved_states = 0
        self.reserved_pages = 0
        self.in_flight.clear()
        self.in_flight_of.clear()
        self.named_released.clear()

    def lookup(self, lv: Live) -> int:
        """lookup_prefix (no side effect) when kvcore has it; otherwise add_sequence + adopt_prefix
        on a free sequence id (what admission does anyway). Returns the hit (tokens)."""
        toks = lv.tokens[: lv.known]
        if self.has_lookup:
            t0 = time.thread_time_ns()
            hit = self.ext.lookup_prefix(toks)
            self._timed(lv, t0)
            return int(hit)
        return self._adopt(lv)

    def _adopt(self, lv: Live) -> int:
        seq = self.free_ids.pop()
        lv.handle = seq
        toks = lv.tokens[: lv.known]
        t0 = time.thread_time_ns()
        self.cache.add_sequence(seq)
        got = int(self.cache.adopt_prefix(seq, toks))
        self._timed(lv, t0)
        if self.check and got:
            self._check_hit(lv, seq, got)
        return got

    def admit(self, lv: Live, hit: int, n: int) -> bool:
        """Adopts the prefix (add_sequence + adopt_prefix, equal to lookup_prefix's hit) unless the
        lookup already did, then reserves the first chunk's blocks (blocks_needed against
        free_blocks); on a refusal the sequence is released again (its adopted blocks return to
        the cache)."""
        t0 = time.thread_time_ns()  # the in-flight rule's keys and lookups count as kvcore's
        waits = self._waits_for_producer(lv, hit)
        self._timed(lv, t0)
        if waits:
            self._release(lv)  # without lookup_prefix, the lookup added it
            return False
        if self.has_lookup:
            try:
                got = self._adopt(lv)
            except self.kv.CapacityError:  # paged tables: the hit's table pages are not free
                self._release(lv)
                return False
            if got != hit:
                raise AssertionError(f"request {lv.req.index}: adopt_prefix gave {got}, lookup_prefix {hit}")
        ok = self._fits(lv, n)
        if not ok:
            self._release(lv)
        else:
            self._note_in_flight(lv, hit, n)
            self.admitted[lv.req.index] = lv
        return ok

    def _waits_for_producer(self, lv: Live, hit: int) -> bool:
        """Does the prompt's first full block past the hit complete in this step (another entry
        computes it)? Then the request waits: after the commit its hit reaches past it."""
        if not self.has_state or not self.in_flight:
            return False
        i = hit // self.block_size
        return i < (lv.known - 1) // self.block_size and self._key(lv, i) in self.in_flight

    def _note_in_flight(self, lv: Live, start: int, n: int) -> None:
        """The keys of the full blocks positions [start, start + n) of lv complete (with a State
        block of several blocks: only when the step ends on one, naming a state there)."""
        if not self.has_state or (self.state_block != self.block_size and (start + n) % self.state_block):
            return
        t0 = time.thread_time_ns()
        b = self.block_size
        keys = self.in_flight_of.setdefault(lv.req.index, [])
        for i in range(start // b, (start + n) // b):
            k = self._key(lv, i)
            keys.append(k)
            self.in_flight[k] = self.in_flight.get(k, 0) + 1
        self._timed(lv, t0)

    def _drop_in_flight(self, lv: Live) -> None:
        """lv leaves the step (preempted): the blocks it was to complete are no longer in flight."""
        for k in self.in_flight_of.pop(lv.req.index, ()):
            if self.in_flight[k] == 1:
                del self.in_flight[k]
            else:
                self.in_flight[k] -= 1

    def cancel(self, lv: Live) -> None:
        """Releases a sequence the lookup added (nothing after lookup_prefix)."""
        self._release(lv)

    def _check_hit(self, lv: Live, seq: int, hit: int) -> None:
        b = self.block_size
        for g in range(self.n_groups):
            table = self.cache.block_table(seq, g)
            for i in range(hit // b):
                bid = int(table[i])
                if bid >= 0 and self.content.get(bid if self.one_pool else (g, bid)) != lv.fp(i, b):
                    raise AssertionError(f"request {lv.req.index}: group {g} block {bid} (block index {i}) "
                                         f"does not hold the request's tokens")
                if self.has_events and bid >= 0 and self._key(lv, i) not in self.stored[g]:
                    raise AssertionError(f"request {lv.req.index}: group {g} hit block index {i} has no "
                                         f"stored KV event (or its eviction was reported)")

    def _fits(self, lv: Live, n: int) -> bool:
        t0 = time.thread_time_ns()
        need = self.cache.blocks_needed(lv.handle, n)
        states = self.cache.state_blocks_needed(lv.handle, n) if self.states_in_pool else 0
        pages = self.cache.table_pages_needed(lv.handle, n) if self.paged else 0
        if self.one_pool:  # the entries' needs over every group against the one pool's free blocks
            ok = sum(self.reserved) + sum(need) + self.reserved_states + states <= self.cache.free_blocks(0)
        else:
            ok = all(self.reserved[g] + need[g] <= self.cache.free_blocks(g) for g in range(self.n_groups))
        if ok and self.reserved_pages + pages > self.cache.free_table_pages:
            ok = False
            self.short_of_pages += 1  # the blocks fit, the table pages did not
        self._timed(lv, t0)
        if ok:
            for g in range(self.n_groups):
                self.reserved[g] += need[g]
            self.reserved_states += states
            self.reserved_pages += pages
        return ok

    def grow(self, lv: Live, n: int) -> bool:
        """Reserves the blocks of n more tokens of a running sequence. With states in the pool,
        short of blocks, the running sequences give back the latest state each named (held for a
        later hit), most recently admitted first, before the scheduler preempts one: a later hit
        traded for a running request. (The states they adopted stay held: many requests share
        them; giving those back too cost most of the reuse on the generated trace at 0.7x.) When
        even that is not enough the scheduler preempts anyway, the states given back stay cached,
        and the calls' CPU is charged to the growing request."""
        ok = self._fits(lv, n)
        if not ok and self.states_in_pool:
            for index in reversed(self.admitted):
                if index in self.named_released:
                    continue
                self.named_released.add(index)
                t0 = time.thread_time_ns()
                freed = self.cache.release_named_state(self.admitted[index].handle)
                self._timed(lv, t0)
                if freed and self._fits(lv, n):
                    ok = True
                    break
        if ok:
            self._note_in_flight(lv, lv.computed, n)
        return ok

    def end_step(self, entries: list[tuple[Live, int]]) -> None:
        """One begin_step (array form, tokens given) and commit over the step's entries."""
        seqs = np.fromiter((lv.handle for lv, _ in entries), dtype=np.int32, count=len(entries))
        ts = np.fromiter((n for _, n in entries), dtype=np.int32, count=len(entries))
        toks = np.concatenate([lv.tokens[lv.computed: lv.computed + n] for lv, n in entries])
        t0 = time.thread_time_ns()
        step = self.cache.begin_step(seqs, ts, toks)
        self.cache.commit(step)
        events = self.ext.drain_kv_events() if self.has_events else None
        share = (time.thread_time_ns() - t0) // len(entries)
        b = self.block_size
        if self.check and events is not None:
            self._check_events(entries, events)
        for lv, n in entries:
            lv.cpu_ns += share
            if self.check:
                first, last = lv.computed // b, (lv.computed + n) // b
                if last > first:
                    for g in range(self.n_groups):
                        table = self.cache.block_table(lv.handle, g)
                        for i in range(first, last):
                            bid = int(table[i])
                            if bid >= 0:
                                self.content[bid if self.one_pool else (g, bid)] = lv.fp(i, b)

    def _check_events(self, entries: list[tuple[Live, int]], events: np.ndarray) -> None:
        """Mirrors the drained events: a stored key is one a block of this step's entries filled
        (at its token range) and not stored already; an evicted key was stored; none dropped."""
        if self.ext.kv_events_dropped:
            raise AssertionError(f"{self.ext.kv_events_dropped} KV events dropped")
        b = self.block_size
        filled: dict[tuple[int, int], int] = {}
        for lv, n in entries:
            for i in range(lv.computed // b, (lv.computed + n) // b):
                filled[self._key(lv, i)] = i * b
        kv: Any = self.kv
        for e in events:
            kind, g, key = int(e["kind"]), int(e["group"]), (int(e["key_lo"]), int(e["key_hi"]))
            if kind == kv.KV_EVENT_CLEARED:
                self.events["cleared"] += 1
                for st in self.stored:
                    st.clear()
                continue
            if not 0 <= g < self.n_event_groups:
                raise AssertionError(f"KV event of group {g}: not a block group (nor a State group in the pool)")
            if kind == kv.KV_EVENT_STORED:
                self.events["stored"] += 1
                if key not in filled:
                    raise AssertionError(f"KV event: group {g} stored key {key}, which no block of the step filled")
                if (int(e["start"]), int(e["end"])) != (filled[key], filled[key] + b):
                    raise AssertionError(f"KV event: group {g} stored tokens [{e['start']}, {e['end']}), "
                                         f"the replay filled [{filled[key]}, {filled[key] + b})")
                if key in self.stored[g]:
                    raise AssertionError(f"KV event: group {g} stored key {key} twice without an eviction")
                self.stored[g].add(key)
            elif kind == kv.KV_EVENT_EVICTED:
                self.events["evicted"] += 1
                if key not in self.stored[g]:
                    raise AssertionError(f"KV event: group {g} evicted key {key}, never stored")
                self.stored[g].discard(key)
            else:
                raise AssertionError(f"KV event of unknown kind {kind}")

    def sampled(self, lv: Live, token: int) -> None:
        """Nothing: the token reaches kvcore with the next step."""

    def _release(self, lv: Live) -> None:
        if lv.handle is None:
            return
        t0 = time.thread_time_ns()
        self.cache.release_sequence(lv.handle)
        self._timed(lv, t0)
        self.free_ids.append(lv.handle)
        lv.handle = None

    def free(self, lv: Live, preempted: bool) -> None:
        """release_sequence (finished, preempted or refused)."""
        self._drop_in_flight(lv)
        self.admitted.pop(lv.req.index, None)
        self._release(lv)
        if not preempted:
            self.keys.pop(lv.req.index, None)

    def in_use(self) -> tuple[int, int]:
        """Blocks held by sequences (all groups) and their bytes, with one state per sequence. The
        replay samples it once a step, so it also keeps the peak of the table pages in use."""
        if self.paged:
            self.peak_table_pages = max(self.peak_table_pages, self.cache.table_pages - self.cache.free_table_pages)
        blocks = by = 0
        if self.one_pool:
            blocks = self.cache.num_blocks(0) - self.cache.free_blocks(0)
            by = blocks * self.page_bytes
        else:
            for g in range(self.n_groups):
                u = self.cache.num_blocks(g) - self.cache.free_blocks(g)
                blocks += u
                by += u * self.bpb[g]
        if self.states_in_pool:  # the states are pages of the pool, counted above
            return blocks, by
        active = self.max_active - len(self.free_ids)
        return blocks, by + active * self.model.state_bytes


# --- vLLM (run in the vLLM venv) ----------------------------------------------------------

class VllmAdapter:
    """vLLM 0.33's KVCacheManager behind the scheduler's adapter calls, driven as its scheduler
    drives it (bench/vllm_manager.py)."""

    def __init__(self, model: Model, block: int, budget: int, cfg: SchedulerConfig, capacity: int):
        import torch
        import vllm.v1.core.kv_cache_utils as U
        from vllm.sampling_params import SamplingParams
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum
        from vllm.v1.core.kv_cache_manager import KVCacheManager
        from vllm.v1.core.kv_cache_planning import _get_kv_cache_groups_uniform_page_size
        from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig, MambaSpec,
                                                SlidingWindowSpec)
        from vllm.v1.request import Request, RequestStatus

        self.Request, self.Status, self.SamplingParams = Request, RequestStatus, SamplingParams
        bv = vllm_block_size(model, block)
        self.block_size = bv
        self.state_block = bv  # align mode: a state per block
        self.chunk_unit = block_chunk(bv, cfg.chunk) if model.has_state else cfg.chunk
        self.max_running = cfg.max_running
        self.has_state = model.has_state
        specs: dict[str, Any] = {}
        attn_1 = max((lay.kv_bytes_per_token for lay in model.layers if lay.kind == "full"), default=0)
        for i, lay in enumerate(model.layers):
            name = f"model.layers.{i}.attn"
            if lay.kind == "full":
                specs[name] = FullAttentionSpec(block_size=bv, num_kv_heads=lay.kv_heads,
                                                head_size=lay.head_dim, dtype=torch.bfloat16)
            elif lay.kind == "sliding":
                specs[name] = SlidingWindowSpec(block_size=bv, num_kv_heads=lay.kv_heads,
                                                head_size=lay.head_dim, dtype=torch.bfloat16,
                                                sliding_window=lay.window)
            else:
                specs[name] = MambaSpec(block_size=bv, shapes=lay.state_shapes,
                                        dtypes=(torch.bfloat16,) * len(lay.state_shapes),
                                        page_size_padded=bv * attn_1,
                                        mamba_type=MambaAttentionBackendEnum.GDN_ATTN,
                                        mamba_cache_mode="align")
        self.groups = _get_kv_cache_groups_uniform_page_size(specs)
        page = self.groups[0].kv_cache_spec.page_size_bytes
        layers_per_id = max(len(g.layer_names) for g in self.groups)
        self.bytes_per_block = page * layers_per_id
        self.num_blocks = budget // self.bytes_per_block
        self.feasible = self.num_blocks >= 2
        self.manager = KVCacheManager(
            KVCacheConfig(num_blocks=max(self.num_blocks, 2), kv_cache_tensors=[], kv_cache_groups=self.groups),
            max_model_len=capacity, scheduler_block_size=bv, hash_block_size=bv, enable_caching=True,
            enable_kv_cache_events=cfg.kv_events)
        hash_fn = get_hash_fn_by_name("sha256")
        U.init_none_hash(hash_fn)
        self.hasher = U.get_request_block_hasher(bv, hash_fn)
        self.capacity = capacity
        self.pending_hit: dict[int, tuple[Any, int]] = {}
        self.n_running = 0
        self.step_lives: list[Live] = []

    def describe(self) -> dict[str, Any]:
        """The groups and pool vLLM built."""
        return {"block_size": self.block_size, "num_blocks": self.num_blocks,
                "bytes_per_block": self.bytes_per_block, "chunk_unit": self.chunk_unit,
                "groups": [{"spec": type(g.kv_cache_spec).__name__, "layers": len(g.layer_names)}
                           for g in self.groups]}

    def start_step(self) -> None:
        """new_step_starts(), as the scheduler calls it each step."""
        self._step_t0 = time.thread_time_ns()
        self.manager.new_step_starts()
        self._step_ns = time.thread_time_ns() - self._step_t0

    def lookup(self, lv: Live) -> int:
        """get_computed_blocks (the Request is built on the first admission, timed apart)."""
        if lv.handle is None:
            t0 = time.thread_time_ns()
            lv.handle = self.Request(str(lv.req.index), lv.prompt.tolist(),
                                     self.SamplingParams(max_tokens=lv.req.output_length), None,
                                     block_hasher=self.hasher)
            lv.aux_ns += time.thread_time_ns() - t0
        r = lv.handle
        t0 = time.thread_time_ns()
        blocks, n_hit, boundary = self.manager.get_computed_blocks(r)
        lv.cpu_ns += time.thread_time_ns() - t0
        r.shared_prefix_boundary = boundary
        self.pending_hit[lv.req.index] = (blocks, n_hit)
        return int(n_hit)

    def admit(self, lv: Live, hit: int, n: int) -> bool:
        """allocate_slots with the hit's blocks; get_block_ids."""
        r = lv.handle
        blocks, n_hit = self.pending_hit.pop(lv.req.index)
        t0 = time.thread_time_ns()
        got = self.manager.allocate_slots(r, n, num_new_computed_tokens=n_hit, new_computed_blocks=blocks,
                                          has_scheduled_reqs=self.n_running > 0)
        if got is not None:
            got.get_block_ids()
        lv.cpu_ns += time.thread_time_ns() - t0
        if got is None:
            return False
        r.status = self.Status.RUNNING
        r.num_computed_tokens = n_hit
        self.n_running += 1
        return True

    def cancel(self, lv: Live) -> None:
        """Nothing to undo: get_computed_blocks has no side effect."""
        self.pending_hit.pop(lv.req.index, None)

    def grow(self, lv: Live, n: int) -> bool:
        """allocate_slots(request, n); get_block_ids."""
        t0 = time.thread_time_ns()
        got = self.manager.allocate_slots(lv.handle, n)
        if got is not None:
            got.get_block_ids(allow_none=True)
        lv.cpu_ns += time.thread_time_ns() - t0
        return got is not None

    def end_step(self, entries: list[tuple[Live, int]]) -> None:
        """num_computed_tokens advanced; the per-step drains."""
        t0 = time.thread_time_ns()
        for lv, n in entries:
            lv.handle.num_computed_tokens += n
        m = self.manager
        m.take_boundary_state_offloads()
        m.take_kv_cache_block_copies()
        m.take_new_block_ids()
        m.take_events()
        share = (time.thread_time_ns() - t0 + self._step_ns) // len(entries)
        for lv, _ in entries:
            lv.cpu_ns += share

    def sampled(self, lv: Live, token: int) -> None:
        """append_output_token_ids (hashes a block it fills; timed apart)."""
        t0 = time.thread_time_ns()
        lv.handle.append_output_token_ids(token)
        lv.aux_ns += time.thread_time_ns() - t0

    def free(self, lv: Live, preempted: bool) -> None:
        """manager.free; a preempted request restarts from nothing computed, as vLLM's does."""
        r = lv.handle
        if r is None:
            return
        t0 = time.thread_time_ns()
        self.manager.free(r)
        lv.cpu_ns += time.thread_time_ns() - t0
        if r.status == self.Status.RUNNING:
            self.n_running -= 1
        if preempted:
            r.status = self.Status.PREEMPTED
            r.num_computed_tokens = 0
        else:
            lv.handle = None

    def in_use(self) -> tuple[int, int]:
        """Blocks requests hold (the null block excluded) and their bytes."""
        used = self.num_blocks - 1 - self.manager.block_pool.get_num_free_blocks()
        return used, used * self.bytes_per_block


# --- runs ---------------------------------------------------------------------------------

def summarize(name: str, res: RunResult, trace: Sequence[TraceRequest], wall_s: float) -> dict[str, Any]:
    """The JSON figures of one system's run."""
    prompt = sum(r.input_length for r in trace)
    reused = sum(res.hits_first)
    served = [i for i in range(len(trace)) if i not in set(res.refused)]
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
        "ideal_online": res.ideal_online,
        "short_prompts_lt_1024": {"count": len(short), "reused": sum(res.hits_first[i] for i in short),
                                  "prompt_tokens": sum(trace[i].input_length for i in short)},
    }


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


def run_kvcore(trace: Sequence[TraceRequest], model: Model, block: int, budget: int,
               cfg: SchedulerConfig, capacity: int, *, exact: bool, ideal_trace: Sequence[int],
               ring_share: float | None = None, state_share: float | None = None,
               check: bool = True, step_slots_in_budget: bool = True,
               one_pool: bool | None = None, states_in_pool: bool = False,
               running_blocks: int = 0) -> dict[str, Any]:
    """Replays `trace` through a BatchCache laid out for `budget` bytes, with the hit checks;
    returns the summary (plus 'layout', and 'violation' naming a failed check). one_pool: None
    asks the kvcore module (kvcore_one_pool). states_in_pool: kvcore_layout's. running_blocks:
    the traffic's peak running blocks (budgets_for's info), which bound paged tables
    (table_pages_for); needed only with cfg.table_page_blocks."""
    if one_pool is None:
        one_pool = kvcore_one_pool()
    layout = kvcore_layout(model, block, budget, cfg, capacity, ring_share, state_share, step_slots_in_budget,
                           one_pool, states_in_pool)
    layout["running_blocks"] = running_blocks
    if not layout["feasible"]:
        return {"system": "kvcore", "feasible": False, "layout": layout, "refused": len(trace),
                "reused_tokens": 0, "reused_pct": 0.0, "preempted": 0, "hits": [0] * len(trace)}
    adapter = KvcoreAdapter(model, block, layout, cfg, capacity, check)
    t = time.perf_counter()
    violation = None
    try:
        res = replay(trace, adapter, cfg, model, check=check, exact=exact, ideal_trace=ideal_trace,
                     capacity=capacity)
    except AssertionError as e:
        violation = str(e)
        raise
    out = summarize("kvcore", res, trace, time.perf_counter() - t)
    cache = adapter.cache
    unpaged = cache.n_groups * cache.max_active_seqs * cache.table_stride * 4
    out.update({"feasible": True, "layout": layout, "violation": violation,
                "table_bytes": table_bytes(cache, adapter.paged), "table_bytes_unpaged": unpaged,
                "table_page_blocks": cache.table_page_blocks if cfg.table_page_blocks else 0,
                "table_pages": cache.table_pages,
                "peak_table_pages": adapter.peak_table_pages, "short_of_table_pages": adapter.short_of_pages,
                "lookup": "lookup_prefix" if adapter.has_lookup else "adopt_prefix",
                "kv_events_checked": dict(adapter.events) if adapter.has_events and check else None})
    return out


def run_vllm(trace: Sequence[TraceRequest], model: Model, block: int, budget: int,
             cfg: SchedulerConfig, capacity: int) -> dict[str, Any]:
    """Replays `trace` through vLLM's KVCacheManager given `budget` bytes (in the vLLM venv)."""
    adapter = VllmAdapter(model, block, budget, cfg, capacity)
    if not adapter.feasible:
        return {"system": "vllm", "feasible": False, "pool": adapter.describe(), "refused": len(trace),
                "reused_tokens": 0, "reused_pct": 0.0, "preempted": 0, "hits": [0] * len(trace)}
    t = time.perf_counter()
    res = replay(trace, adapter, cfg, model, capacity=capacity)
    out = summarize("vllm", res, trace, time.perf_counter() - t)
    out.update({"feasible": True, "pool": adapter.describe()})
    return out


def peer_main(jobs: dict[str, Any]) -> None:
    """The vLLM side (`--peer vllm`, in the vLLM venv): runs every job of the JSON on stdin and
    prints one JSON list of results on stdout."""
    import vllm

    trace = load_trace(jobs["trace"], jobs.get("limit"))
    cfg = SchedulerConfig(**jobs["scheduler"])
    out = []
    for job in jobs["jobs"]:
        model = make_model(job["model"])
        r = run_vllm(trace, model, job["block"], job["budget_bytes"], cfg, job["capacity"])
        r.update({"model": job["model"], "block": job["block"], "budget": job["budget"], "vllm": vllm.__version__})
        out.append(r)
        print(f"vllm {job['model']} B={job['block']} {job['budget']}: reused {r['reused_pct']:.2f}%",
              file=sys.stderr, flush=True)
    json.dump(out, sys.stdout)


def compare(kv: dict[str, Any], vl: dict[str, Any] | None) -> dict[str, Any]:
    """Requests where kvcore's first-admission hit is below vLLM's (ids and tokens)."""
    if vl is None or not kv.get("hits") or not vl.get("hits"):
        return {"kvcore_fewer_count": None, "kvcore_fewer": []}
    fewer = [(i, a, b) for i, (a, b) in enumerate(zip(kv["hits"], vl["hits"])) if a < b]
    more = sum(1 for a, b in zip(kv["hits"], vl["hits"]) if a > b)
    online = kv.get("ideal_online") or []
    # vLLM caches a block when it schedules it, so a request admitted while another computes
    # the block in the same forward hits it; kvcore names a block when its step commits.
    uncommitted = [i for i, _, b in fewer if online and b > online[i]]
    return {"kvcore_fewer_count": len(fewer), "kvcore_more_count": more,
            "kvcore_fewer_tokens": sum(b - a for _, a, b in fewer),
            "vllm_hit_beyond_committed_blocks": len(uncommitted),
            "kvcore_fewer": [{"request": i, "kvcore": a, "vllm": b,
                              "committed_before": online[i] if online else None} for i, a, b in fewer[:50]]}


def fmt_bytes(n: float) -> str:
    """Bytes as GiB/MiB text."""
    return f"{n / 2**30:.1f}G" if n >= 2**30 else f"{n / 2**20:.0f}M"


def print_table(rows: list[dict[str, Any]]) -> None:
    """The side-by-side table on stdout."""
    head = (f"{'model':9} {'B':>4} {'budget':>6} {'bytes':>7} {'ideal%':>6} {'inf%':>6} | {'kv%':>6} {'vllm%':>6} "
            f"{'kv ref':>6} {'vl ref':>6} {'kv pre':>6} {'vl pre':>6} | {'kv peak':>7} {'vl peak':>7} | "
            f"{'kv us':>7} {'vl us':>7} {'vl+req':>7} | {'kv<vl':>5}")
    print(head)
    print("-" * len(head))
    for row in rows:
        kv, vl = row["kvcore"], row.get("vllm") or {}

        def g(d: dict[str, Any], k: str, f: str = "{}") -> str:
            v = d.get(k)
            return f.format(v) if v is not None else "-"
        vl_req = (vl.get("cpu_us_median", 0) + vl.get("request_hashing_us_median", 0)) if vl.get("feasible") else None
        print(f"{row['model']:9} {row['block']:>4} {row['budget']:>6} {fmt_bytes(row['budget_bytes']):>7} "
              f"{row['ideal_trace_pct']:>6.2f} {g(kv, 'ideal_online_pct', '{:.2f}'):>6} | {g(kv, 'reused_pct', '{:.2f}'):>6} {g(vl, 'reused_pct', '{:.2f}'):>6} "
              f"{g(kv, 'refused'):>6} {g(vl, 'refused'):>6} {g(kv, 'preempted'):>6} {g(vl, 'preempted'):>6} | "
              f"{fmt_bytes(kv.get('peak_bytes', 0)):>7} {fmt_bytes(vl.get('peak_bytes', 0)):>7} | "
              f"{g(kv, 'cpu_us_median', '{:.0f}'):>7} {g(vl, 'cpu_us_median', '{:.0f}'):>7} "
              f"{('-' if vl_req is None else f'{vl_req:.0f}'):>7} | {g(row['compare'], 'kvcore_fewer_count'):>5}")
    paged = [row for row in rows if row.get("kvcore", {}).get("table_page_blocks")]
    if paged:
        print("kvcore block tables, paged (table_page_blocks): bytes allocated against dense rows, peak pages in use")
        for row in paged:
            kv = row["kvcore"]
            print(f"{row['model']:9} {row['block']:>4} {row['budget']:>6}: {kv['table_bytes'] / 2**20:8.2f} MiB against "
                  f"{kv['table_bytes_unpaged'] / 2**20:8.2f} MiB ({kv['table_bytes_unpaged'] / kv['table_bytes']:.1f}x "
                  f"smaller), {kv['peak_table_pages']} of {kv['table_pages']} pages of {kv['table_page_blocks']} in use "
                  f"at most, {kv['short_of_table_pages']} entries short of pages")


def main(argv: Sequence[str] | None = None) -> int:
    """Command line (module docstring). Returns 1 when a kvcore check failed, else 0."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trace", default=str(DEFAULT_TRACE), help="Mooncake-format JSONL trace")
    ap.add_argument("--limit", type=int, help="replay only the first LIMIT requests")
    ap.add_argument("--generate", type=int, metavar="N", help="replay a generated trace of N requests instead")
    ap.add_argument("--seed", type=int, default=0, help="seed of --generate")
    ap.add_argument("--rate", type=float, default=4.0, help="--generate arrivals per second")
    ap.add_argument("--write-trace", help="write the (generated) trace here and stop")
    ap.add_argument("--models", default="llama,gemma3,qwen3next")
    ap.add_argument("--blocks", default="16,512")
    ap.add_argument("--budgets", default="ample,2x,0.7x", help="ample and/or multiples of the peak working set")
    ap.add_argument("--ring-share", type=float, help="kvcore: fraction of the budget for the ring group")
    ap.add_argument("--state-share", type=float, help="kvcore: fraction for state snapshots")
    ap.add_argument("--states-in-pool", action="store_true",
                    help="kvcore: a hybrid's states are blocks of the one pool (BatchLimits.states_in_pool), at "
                         "the block size vLLM runs it at (a page holds a state); its rows are keyed by that block")
    ap.add_argument("--state-step-slots", choices=["budget", "outside"], default="budget",
                    help="kvcore: count the State group's max_step_tokens slots in the budget (default) or not")
    ap.add_argument("--step-ms", type=float, default=SchedulerConfig.step_ms)
    ap.add_argument("--token-budget", type=int, default=SchedulerConfig.token_budget)
    ap.add_argument("--chunk", type=int, default=SchedulerConfig.chunk)
    ap.add_argument("--max-running", type=int, default=SchedulerConfig.max_running)
    ap.add_argument("--max-rewind", type=int, default=SchedulerConfig.max_rewind,
                    help="kvcore's rewind margin (BatchLimits.max_rewind; -1: the chunk)")
    ap.add_argument("--no-kv-events", action="store_true",
                    help="neither system publishes KV events (default: both do, timed on both sides)")
    ap.add_argument("--table-page-blocks", type=int, default=SchedulerConfig.table_page_blocks, metavar="P",
                    help="kvcore: page its block tables, P entries a page (0: dense rows, -1: P by the row length)")
    ap.add_argument("--state-block-size", type=int, default=SchedulerConfig.state_block, metavar="S",
                    help="kvcore on models with State layers: name states only on multiples of S tokens, a "
                         "multiple of the block size, and end prefill chunks there (BatchLimits.state_block_size; "
                         "0: every block)")
    ap.add_argument("--no-vllm", action="store_true", help="kvcore only")
    ap.add_argument("--vllm-python", default=DEFAULT_VLLM_PYTHON)
    ap.add_argument("--vllm-results", help="comma list of earlier --out files: take vLLM's rows from them "
                    "(same trace, model, block and budget name; vLLM does not change with kvcore) instead of running it")
    ap.add_argument("--quick", action="store_true", help="first 200 requests, budget 2x only")
    ap.add_argument("--out", help="write the JSON here")
    ap.add_argument("--peer", choices=["vllm"], help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.peer:
        peer_main(json.load(sys.stdin))
        return 0
    if args.quick:
        args.limit = args.limit or 200
        args.budgets = "2x"
    cfg = SchedulerConfig(args.step_ms, args.token_budget, args.chunk, args.max_running, args.max_rewind,
                          kv_events=not args.no_kv_events, table_page_blocks=args.table_page_blocks,
                          state_block=args.state_block_size)
    if args.generate:
        trace = generate_trace(args.generate, args.seed, rate_per_s=args.rate)
        if args.limit:
            trace = trace[: args.limit]
        trace_name = f"generated(n={args.generate}, seed={args.seed}, rate={args.rate})"
    else:
        trace = load_trace(args.trace, args.limit)
        trace_name = args.trace
    if args.write_trace:
        write_trace(args.write_trace, trace)
        print(f"wrote {len(trace)} requests to {args.write_trace}")
        return 0
    trace_file = args.trace
    if args.generate:
        trace_file = f"/tmp/trace_replay_{os.getpid()}.jsonl"
        write_trace(trace_file, trace)
    models = [make_model(m) for m in args.models.split(",")]
    blocks = [int(b) for b in args.blocks.split(",")]
    for b in blocks:
        if b < 1 or HASH_BLOCK % b and b % HASH_BLOCK:
            raise SystemExit(f"block size {b} must divide 512 or be a multiple of it")
    names = args.budgets.split(",")
    one_pool = kvcore_one_pool()
    rows: list[dict[str, Any]] = []
    jobs = []
    failed = []
    prompt_total = sum(r.input_length for r in trace)
    for model in models:
        for b in blocks:
            pooled = args.states_in_pool and model.has_state
            if pooled:  # both systems at the block whose page holds a state
                b = vllm_block_size(model, b)
            capacity = capacity_of(trace, max(b, vllm_block_size(model, b)))
            in_budget = args.state_step_slots == "budget"
            budgets, info = budgets_for(model, b, trace, cfg, capacity, names, args.ring_share, args.state_share,
                                        in_budget, one_pool, pooled)
            ideal = trace_ideal(trace, b)
            for name in names:
                t0 = time.perf_counter()
                try:
                    kv = run_kvcore(trace, model, b, budgets[name], cfg, capacity, exact=name == "ample",
                                    ideal_trace=ideal, ring_share=args.ring_share, state_share=args.state_share,
                                    step_slots_in_budget=in_budget, one_pool=one_pool, states_in_pool=pooled,
                                    running_blocks=info["peak_running_blocks"])
                except AssertionError as e:
                    kv = {"system": "kvcore", "violation": str(e), "hits": []}
                    failed.append(f"{model.name} B={b} {name}: {e}")
                row = {"model": model.name, "block": b, "budget": name, "budget_bytes": budgets[name],
                       "capacity": capacity, "ideal_trace_tokens": sum(ideal),
                       "ideal_trace_pct": 100.0 * sum(ideal) / prompt_total, **info, "kvcore": kv}
                print(f"kvcore {model.name} B={b} {name} ({fmt_bytes(budgets[name])}): "
                      f"reused {kv.get('reused_pct', 0):.2f}% in {time.perf_counter() - t0:.1f}s",
                      file=sys.stderr, flush=True)
                rows.append(row)
                jobs.append({"model": model.name, "block": b, "budget": name, "budget_bytes": budgets[name],
                             "capacity": capacity})
    if args.vllm_results:
        earlier: dict[tuple[str, int, str], tuple[str, dict[str, Any]]] = {}
        for path in args.vllm_results.split(","):
            rep = json.load(open(path))
            if rep.get("requests") != len(trace) or rep.get("prompt_tokens") != prompt_total:
                raise SystemExit(f"--vllm-results {path}: another trace ({rep.get('requests')} requests)")
            for r in rep["rows"]:
                if r.get("vllm"):
                    earlier[(r["model"], r["block"], r["budget"])] = (path, r)
        for row in rows:
            got = earlier.get((row["model"], row["block"], row["budget"]))
            if got is not None:
                row["vllm"] = dict(got[1]["vllm"], from_file=got[0], budget_bytes=got[1]["budget_bytes"])
    elif not args.no_vllm:
        if not Path(args.vllm_python).exists():
            raise SystemExit(f"--vllm-python {args.vllm_python} does not exist "
                             "(bash ../shared/peers/install_vllm_cpu.sh /tmp/vllm-venv, or --no-vllm)")
        spec = {"trace": trace_file, "limit": args.limit, "scheduler": dataclasses.asdict(cfg), "jobs": jobs}
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        done = subprocess.run([args.vllm_python, str(Path(__file__).resolve()), "--peer", "vllm"],
                              input=json.dumps(spec), capture_output=True, text=True, env=env)
        if done.returncode != 0:
            raise SystemExit(f"vLLM peer failed:\n{done.stderr[-4000:]}")
        for row, vl in zip(rows, json.loads(done.stdout)):
            row["vllm"] = vl
    for row in rows:
        row["compare"] = compare(row["kvcore"], row.get("vllm"))
        # Prompts shorter than one vLLM block (on the hybrid its aligned block): vLLM cannot reuse them.
        bv = vllm_block_size(make_model(row["model"]), row["block"])
        short = [i for i, r in enumerate(trace) if r.input_length < bv]
        side = {k: (row.get(k) or {}).get("hits") or [] for k in ("kvcore", "vllm")}
        row["short_prompts"] = {"below_tokens": bv, "count": len(short),
                                "prompt_tokens": sum(trace[i].input_length for i in short),
                                **{f"{k}_reused": (sum(h[i] for i in short) if h else None) for k, h in side.items()}}
    print(f"trace {trace_name}: {len(trace)} requests, {prompt_total:,} prompt tokens; "
          f"scheduler {dataclasses.asdict(cfg)}")
    print("kvcore pools: " + ("one pool for every block group" if one_pool else
                              "per group, equal blocks per group" if args.ring_share is None else
                              f"per group, ring share {args.ring_share}") +
          "; state: " + ("one snapshot per chunk of flat tokens" if args.state_share is None else
                         f"share {args.state_share}"))
    print_table(rows)
    if failed:
        print("KVCORE CHECKS FAILED:\n  " + "\n  ".join(failed))
    if args.out:
        for row in rows:  # per-request arrays only in compact form
            vl = row.get("vllm")
            if vl:
                vl.pop("ideal_online", None)
        report = {"trace": trace_name, "requests": len(trace), "prompt_tokens": prompt_total,
                  "scheduler": dataclasses.asdict(cfg), "ring_share": args.ring_share,
                  "state_step_slots": args.state_step_slots, "kvcore_one_pool": one_pool,
                  "state_share": args.state_share, "python": platform.python_version(),
                  "checks_failed": failed, "rows": rows}
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps(report, indent=1)
        # Lists of numbers (the per-request hits) on one line each.
        text = re.sub(r"\[\s*(-?[\d.e+]+(?:,\s*-?[\d.e+]+)*)\s*\]",
                      lambda m: "[" + "".join(m.group(1).split()) + "]", text)
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
