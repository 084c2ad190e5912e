"""The serving loop both systems run under: its throughput model (SchedulerConfig), a request's
state (Live), what it asks of a system (the Adapter protocol), the infinite cache behind the
ideal and the hit checks, and replay() (its outcomes: replay/outcomes.py).

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
- in flight (kvcore, every model; Adapter.waits): a hit covers committed blocks only, so a
  request whose first prompt block past its hit is one another entry of this step completes is
  put off a step, keeping its place in the queue while the requests behind it may be admitted:
  after the commit its hit reaches past that block, so it reuses the prefix its producer
  computes instead of computing it again alongside (KvcoreAdapter: the step's entries' block
  ranges, keyed on demand). Its own first token need not come later: computing alongside, it
  would pass the shared prefix a chunk a step, as its producer does. vLLM's full-attention
  manager instead hits the block in the same forward; its MambaManager keeps such a request
  (allocate_slots fails, so vLLM's admission loop stops). The JSON gives each system's
  admission delay and time to first token (steps from arrival);
- named states first (kvcore, states in the pool): a running request short of blocks first has
  the running requests give back the latest state each named (BatchCache.release_named_state:
  held for a later hit), most recently admitted first, and preempts only when that is not
  enough.

Ideal: `ideal_trace`, per request the longest prefix of full blocks (at the system's block
size) of its prompt that an earlier request's prompt holds, at most input_length - 1 tokens;
`ideal_online`, what an infinite cache holds at the moment of the admission in this run (blocks
committed by earlier steps; for models with state layers only up to a position where a step
ended on a block boundary, where kvcore names a state snapshot). kvcore's checks (an
AssertionError, or exit status 1 after the JSON is written): every hit is a multiple of the
block size, at most ideal_online, and a first admission's at most ideal_trace; every block of a
hit holds the tokens it was computed from (the replay records, per group and block id, a chained
fingerprint of the tokens each step filled it with, and compares the adopting request's); with
the ample budget every hit equals ideal_online.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from replay.models import Model
from replay.outcomes import RunResult
from replay.trace import TraceRequest, block_fingerprints, decode_token, prompt_tokens


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
    delay: int = -1  # steps from arrival to the first admission
    first_token: int = -1  # steps from arrival to the end of the step that sampled the first token
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
    def waits(self, lv: Live, hit: int) -> bool: ...
    def admit(self, lv: Live, hit: int, n: int) -> bool: ...
    def cancel(self, lv: Live) -> None: ...
    def grow(self, lv: Live, n: int) -> bool: ...
    def grow_many(self, batch: list[tuple[Live, int]]) -> int: ...
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


def grow_each(adapter: Adapter, batch: list[tuple[Live, int]]) -> int:
    """Adapter.grow_many entry by entry: grows each in order up to the first that cannot grow;
    returns how many grew."""
    for k, (lv, n) in enumerate(batch):
        if not adapter.grow(lv, n):
            return k
    return len(batch)


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
            # The running requests from i on that the token budget takes, grown in order in one
            # call (a preemption pops from the end, so it never changes who before it is taken).
            batch: list[tuple[Live, int]] = []
            left = budget
            for lv in running[i:]:
                n = chunk_end(lv, lv.computed, unit, stop_block) - lv.computed
                if n <= left:
                    batch.append((lv, n))
                    left -= n
            k = adapter.grow_many(batch) if adapter is not None else len(batch)
            for lv, n in batch[:k]:
                entries.append((lv, n))
                budget -= n
            if k == len(batch):
                break
            assert adapter is not None  # the infinite cache grows every entry
            lv, n = batch[k]  # it cannot grow: preempt from the end until it can
            i = running.index(lv)
            while True:
                victim = running.pop()
                if victim is lv:
                    if i == 0:  # alone and cannot grow: it never fits
                        refuse(lv)
                    else:
                        preempt(lv)
                    break
                preempt(victim)
                if adapter.grow(lv, n):
                    entries.append((lv, n))
                    budget -= n
                    i += 1
                    break
        j = 0  # the first waiting request not put off this step
        while j < len(waiting) and budget > 0 and len(running) < max_running:
            lv = waiting[j]
            if arrival_step(lv) > step:
                break
            online = inf.hit(lv) if track else 0
            hit = adapter.lookup(lv) if adapter is not None else online
            n = chunk_end(lv, hit, unit, stop_block) - hit
            if n > budget:
                if adapter is not None:
                    adapter.cancel(lv)
                break
            if adapter is not None and adapter.waits(lv, hit):  # keeps its place; the next may go
                adapter.cancel(lv)
                j += 1
                continue
            if adapter is not None and not adapter.admit(lv, hit, n):
                adapter.cancel(lv)
                if running:
                    break
                del waiting[j]
                refuse(lv)
                continue
            del waiting[j]
            first = lv.admissions == 0
            lv.admissions += 1
            lv.hits.append(hit)
            if first:
                lv.hit_first = hit
                lv.delay = step - arrival_step(lv)
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
                if lv.first_token < 0:
                    lv.first_token = step + 1 - arrival_step(lv)
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
        delays=[lv.delay for lv in lives], first_tokens=[lv.first_token for lv in lives],
        peak_blocks=peak_blocks, peak_bytes=peak_bytes, peak_working_set=peak_ws, steps=n_steps,
        distinct_blocks=len(inf.blocks), named_states=len(inf.states),
        peak_running_blocks=peak_running_blocks, violations=violations)
