"""A brute-force reference model of docs/design.md section 6 (many sequences over
paged block pools), written from the contract and independent of kvcore (it
never imports it; Policy and its visibility rule come from reference.py, the
model of section 2).

Each sequence is simulated alone, as section 2 does: its committed length, which
of its positions were removed, the token each position was computed from, and
the *tag* of the K/V each position holds. A tag stands for K/V. A position
computed from a plain token prefix (every earlier position still present and
itself computed that way, every token known) gets the tag of that prefix, so
sequences that computed the same prefix, and a sequence that adopted it from
the prefix cache, hold the same tag: the adopted rows must hold what a fresh
computation holds. Any other position gets a fresh tag no other write has, so
a row left over from another sequence, an abandoned step or a rewound timeline
never passes for the one a query needs.

`Pools` is the byte layer: per group one array with the tag each row holds;
`apply()` performs a plan as a backend does (its copies first, then the writes
to the slots), or only part of it, for steps that are abandoned. `check_step()`
proves that, for every query of the step, every key the rule lets it see
(section 2's visibility within its own sequence, never a removed position) is
named by the plan's block table and holds the tag the model says; that each
new token's slot is its position's row in that table; that no two tokens write
one row and no token writes a block a copy reads.

What the contract leaves to the cache, the model bounds instead of predicting:
- the rewind rule (rewind, fork, a remove that truncates): `must_allow()` is
  true where the contract guarantees success (up to max_rewind back from the
  peak length, to n <= sinks, whatever the removed positions make unneeded);
  elsewhere the caller holds can_rewind() to the call's outcome and the next
  steps' reads to the truth;
- admission: `worst_need()` is the most blocks a step can need per group (every
  block its new positions touch, new or copied); a refusal with more free
  blocks than that is wrong;
- prefix hits: `adopt()` checks a hit is a multiple of B below the prompt's
  length and names a prefix some sequence committed since the last clear; the
  next step's reads check its rows.

`PrefixPools` then predicts what docs/batch.md section 5 states exactly: every
prefix hit (the longest cached prefix, reclaim order included), every
admission, and every free, cached and held block count.

Errors are named by their kvcore.Error member name ("InvalidArgument", ...).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from reference import Policy

IntArray = npt.NDArray[np.int64]
Entry = tuple[int, int, "Sequence[int] | None"]  # (seq, T, tokens or None)

INT_MIN, INT_MAX = -(2**31), 2**31 - 1


def observable(c: Any) -> tuple[Any, ...]:
    """What a refused call of a kvcore.BatchCache `c` must leave as it was (docs/batch.md
    section 3: "each failing call changes nothing"), as its queries show it: each sequence's
    state, the blocks it holds per group, each group's free, cached and used blocks, and the
    free table rows. The tests that check a refusal compare it before and after (adding what
    they hold besides: a begun step, its tables)."""
    seqs, groups = range(c.max_seqs), range(c.n_groups)
    infos = tuple((i.active, i.length, i.visible_start, tuple(i.holes)) for i in map(c.sequence, seqs))
    held = tuple(c.blocks_held(s, g) for s in seqs for g in groups)
    counts = tuple((c.free_blocks(g), c.cached_blocks(g), c.used_blocks(g)) for g in groups)
    return infos, held, counts, c.free_table_rows


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass
class Seq:
    """One sequence, alone: what it holds at each position [0, length)."""

    active: bool = False
    tags: list[int] = field(default_factory=list)
    removed: list[bool] = field(default_factory=list)
    tokens: list[int | None] = field(default_factory=list)
    # Positions [0, plain) were computed from a plain token prefix and none was removed.
    plain: int = 0
    # The longest committed length since the sequence last went back to 0 (or
    # its source's, for a fork): the rewind guarantee counts from it.
    peak: int = 0

    @property
    def length(self) -> int:
        return len(self.tags)

    @property
    def visible_start(self) -> int:
        """The first position not removed (the length when all are)."""
        p = 0
        while p < self.length and self.removed[p]:
            p += 1
        return p

    @property
    def holes(self) -> list[tuple[int, int]]:
        """Removed ranges after visible_start, maximal (touching ranges are one)."""
        out: list[tuple[int, int]] = []
        p = self.visible_start
        while p < self.length:
            if self.removed[p]:
                q = p
                while q < self.length and self.removed[q]:
                    q += 1
                out.append((p, q))
                p = q
            else:
                p += 1
        return out

    @property
    def visible_positions(self) -> int:
        return self.removed.count(False)

    def truncate(self, n: int) -> None:
        del self.tags[n:], self.removed[n:], self.tokens[n:]
        self.plain = min(self.plain, n)
        if n == 0:
            self.peak = 0


@dataclass
class StepPlan:
    """A step's plan as plain arrays (what kvcore's BatchStepPlan shows)."""

    block_size: int
    seq_ids: list[int]
    query_starts: list[int]
    first_positions: list[int]
    context_lens: list[int]
    visible_starts: list[int]
    holes: list[list[tuple[int, int]]]
    slots: list[IntArray]  # per group, one per token
    copies: list[list[tuple[int, int]]]  # per group, (src, dst) blocks
    block_tables: list[npt.NDArray[Any]]  # per group, (max_seqs, table_stride)


class Pools:
    """The byte layer: per group, the tag each row holds (0: never written)."""

    def __init__(self, rows_per_group: Sequence[int], block_size: int) -> None:
        self.B = block_size
        self.rows = [np.zeros(n, np.int64) for n in rows_per_group]

    def apply(self, plan: StepPlan, tags: Sequence[int], copies: bool = True, writes: Any = True) -> None:
        """Copies first, then the writes of the tokens `writes` selects (True:
        all, False: none, or a boolean mask per token)."""
        B = self.B
        token_tags = np.asarray(tags, np.int64)
        for g, rows in enumerate(self.rows):
            if copies:
                for src, dst in plan.copies[g]:
                    rows[dst * B : (dst + 1) * B] = rows[src * B : (src + 1) * B]
            if writes is True:
                rows[plan.slots[g]] = token_tags
            elif writes is not False:
                mask = np.asarray(writes, bool)
                rows[plan.slots[g][mask]] = token_tags[mask]


class BatchModel:
    """docs/design.md section 6 for one cache: its groups and every sequence alone."""

    def __init__(
        self,
        capacity: int,
        max_step: int,
        layer_policies: Sequence[Policy],
        block_size: int,
        max_seqs: int,
        max_step_tokens: int,
        max_holes: int,
        page_layers: int = 0,
        max_rewind: int = -1,
    ) -> None:
        self.capacity = capacity
        self.max_step = max_step
        self.max_rewind = max_step if max_rewind == -1 else max_rewind  # batch.max_rewind's default
        self.B = block_size
        self.max_seqs = max_seqs
        self.max_step_tokens = max_step_tokens
        self.max_holes = max_holes
        # "Layers of one policy form groups of at most page_layers layers (0: the fewest any
        # policy has), each opened at its first layer" (docs/batch.md section 5, "One budget").
        kv = [p for p in layer_policies if not p.is_shared]
        counts = {p: kv.count(p) for p in kv}
        size = page_layers or min(counts.values(), default=1)
        self.groups: list[Policy] = []
        self.group_of: list[int] = []
        open_group: dict[Policy, tuple[int, int]] = {}  # policy -> (its group filling now, layers in it)
        for p in layer_policies:
            if p.is_shared:  # section 9: reads its source's group, holds none
                self.group_of.append(self.group_of[p.source])
                continue
            g, filled = open_group.get(p, (-1, size))
            if filled == size:
                g, filled = len(self.groups), 0
                self.groups.append(p)
            open_group[p] = (g, filled + 1)
            self.group_of.append(g)
        self.seqs = [Seq() for _ in range(max_seqs)]
        self._prefix_ids: dict[tuple[int, ...], int] = {}
        self._next_unique = 1 << 40
        # Prefixes (their ids) some sequence committed since the last clear.
        self.computed: set[int] = set()
        # The begun step: per entry (seq, its new tags, its tokens); None when none.
        self.pending: list[tuple[int, list[int], list[int | None]]] | None = None

    # --- tags ---------------------------------------------------------------------------

    def prefix_tag(self, tokens: Sequence[int]) -> int:
        """The tag of the K/V of position len(tokens) - 1 computed from exactly `tokens`."""
        key = tuple(tokens)
        if key not in self._prefix_ids:
            self._prefix_ids[key] = len(self._prefix_ids) + 1
        return self._prefix_ids[key]

    def unique_tag(self) -> int:
        self._next_unique += 1
        return self._next_unique

    # --- rules from the text ----------------------------------------------------------

    def seq_error(self, seq: int) -> str | None:
        return None if 0 <= seq < self.max_seqs else "InvalidArgument"

    def active_error(self, seq: int) -> str | None:
        if not 0 <= seq < self.max_seqs:
            return "InvalidArgument"
        return None if self.seqs[seq].active else "InvalidState"

    def ring_bound(self, g: int) -> int:
        """Section 6, Memory: the most blocks a ring group keeps for one sequence at rest, with the
        rewind margin R (max_rewind) for C."""
        p, B, R = self.groups[g], self.B, self.max_rewind
        return ceil_div(p.sinks, B) + ceil_div(max(p.window, p.chunk) + R - 1, B) + 1  # chunked: a ring of K

    def must_allow(self, seq: int, n: int) -> bool:
        """Must a rewind of `seq` to n (or a fork of it at n) succeed? Every ring
        group keeps its sinks and what a rewind of up to max_rewind tokens from the
        peak length needs, so it must when every key a query at n sees below n
        (not removed) is a sink or within max_rewind + window - 1 of the peak."""
        s = self.seqs[seq]
        if not s.active or not 0 <= n <= s.length:
            return False
        for p in self.groups:
            if not p.evicts:
                continue
            kept_from = p.kept_from(s.peak, self.max_rewind)
            for k in range(n):
                if p.visible(n, k) and not s.removed[k] and not (k < p.sinks or k >= kept_from):
                    return False
        return True

    def visible(self, g: int, seq: int, q: int, k: int) -> bool:
        """May the sequence's query at q see its key at k on group g's layers?"""
        s = self.seqs[seq]
        removed = k < s.length and s.removed[k]
        return self.groups[g].visible(q, k) and not removed

    # --- verbs: each `*_errors` lists the errors the call may raise (empty: it must
    # succeed, up to the rewind rule where noted); the verb itself applies success.

    def end_step(self) -> None:
        """Every successful verb ends the begun step (its plan is stale)."""
        self.pending = None

    def add_errors(self, seq: int) -> set[str]:
        e = self.seq_error(seq)
        if e is None and self.seqs[seq].active:
            e = "InvalidState"
        return {e} if e else set()

    def add(self, seq: int) -> None:
        self.end_step()
        self.seqs[seq] = Seq(active=True)

    def release_errors(self, seq: int) -> set[str]:
        e = self.active_error(seq)
        return {e} if e else set()

    def release(self, seq: int) -> None:
        self.end_step()
        self.seqs[seq] = Seq()

    def fork_errors(self, src: int, dst: int, upto: int) -> set[str]:
        """The errors of fork(src, dst, upto) other than the rewind rule."""
        out = set()
        e = self.active_error(src)
        if e:
            out.add(e)
        if self.seq_error(dst):
            out.add("InvalidArgument")
        if src == dst:
            out.add("InvalidArgument")
        if e is None and not 0 <= upto <= self.seqs[src].length:
            out.add("InvalidArgument")
        if self.seq_error(dst) is None and self.seqs[dst].active and self.seqs[dst].length != 0:
            out.add("InvalidState")
        return out

    def fork(self, src: int, dst: int, upto: int) -> None:
        self.end_step()
        s = self.seqs[src]
        self.seqs[dst] = Seq(
            active=True,
            tags=s.tags[:upto],
            removed=s.removed[:upto],
            tokens=s.tokens[:upto],
            plain=min(s.plain, upto),
            peak=s.peak,
        )

    def rewind_errors(self, seq: int, n: int) -> set[str]:
        """The errors of rewind(seq, n) other than the rule."""
        e = self.active_error(seq)
        if e:
            return {e}
        return set() if 0 <= n <= self.seqs[seq].length else {"InvalidArgument"}

    def truncate(self, seq: int, n: int) -> None:
        self.end_step()
        self.seqs[seq].truncate(n)

    def remove_kind(self, seq: int, p0: int, p1: int) -> tuple[str, set[str]]:
        """("error", errors), ("truncate", {}) (the rule applies unless p0 == 0),
        ("range", errors) (a head or middle range: maybe CapacityError) or ("noop", {})."""
        e = self.active_error(seq)
        if e:
            return "error", {e}
        if p0 < 0 or p1 < p0:
            return "error", {"InvalidArgument"}
        s = self.seqs[seq]
        if p1 >= s.length:
            return ("noop", set()) if p0 >= s.length else ("truncate", set())
        after = s.removed[:]
        for p in range(p0, p1):
            after[p] = True
        if after == s.removed:
            return "noop", set()
        trial = Seq(active=True, tags=s.tags, removed=after)
        return "range", ({"OutOfResources"} if len(trial.holes) > self.max_holes else set())

    def remove_range(self, seq: int, p0: int, p1: int) -> None:
        self.end_step()
        s = self.seqs[seq]
        for p in range(p0, p1):
            s.removed[p] = True
        s.plain = min(s.plain, p0)

    def adopt_errors(self, seq: int, n_tokens: int) -> set[str]:
        e = self.active_error(seq)
        out = {e} if e else set()
        if n_tokens > self.capacity:
            out.add("InvalidArgument")
        if e is None and self.seqs[seq].length != 0:
            out.add("InvalidState")
        return out

    def adopt(self, seq: int, tokens: Sequence[int], hit: int) -> list[str]:
        """Applies a prefix hit of `hit` positions; returns what is wrong with it."""
        problems = []
        if hit < 0 or hit % self.B:
            problems.append(f"hit {hit} is not a multiple of block_size {self.B}")
        if hit > max(0, len(tokens) - 1):
            problems.append(f"hit {hit} leaves no token of the {len(tokens)} to compute")
        if hit > 0 and self.prefix_tag(tokens[:hit]) not in self.computed:
            problems.append(f"hit {hit}: no sequence committed that prefix since the last clear")
        if problems:
            return problems
        self.end_step()
        s = Seq(active=True, peak=hit, plain=hit)
        for p in range(hit):
            s.tags.append(self.prefix_tag(tokens[: p + 1]))
            s.removed.append(False)
            s.tokens.append(tokens[p])
        self.seqs[seq] = s
        return []

    def clear(self) -> None:
        self.end_step()
        self.seqs = [Seq() for _ in range(self.max_seqs)]
        self.computed.clear()

    # --- steps ------------------------------------------------------------------------

    def step_errors(self, entries: Sequence[Entry]) -> set[str]:
        """Errors of begin_step(entries) decided by the entries alone (a pool
        running short is the cache's to say; see worst_need)."""
        out: set[str] = set()
        if not 1 <= len(entries) <= self.max_seqs:
            out.add("InvalidArgument")
        seen: set[int] = set()
        total = 0
        for seq, T, tokens in entries:
            e = self.active_error(seq)
            if e:
                out.add(e)
            if seq in seen:
                out.add("InvalidArgument")
            seen.add(seq)
            if not 1 <= T <= self.max_step:
                out.add("InvalidArgument")
            elif e is None and self.seqs[seq].length + T > self.capacity:
                out.add("OutOfResources")
            total += T
            if total > self.max_step_tokens:
                out.add("InvalidArgument")
        return out

    def worst_need(self, entries: Sequence[Entry]) -> int:
        """The most blocks the step can need in any group: every block its new
        positions touch (a new one, or a private copy of a shared one)."""
        need = 0
        for seq, T, _ in entries:
            L = self.seqs[seq].length
            need += (L + T - 1) // self.B - L // self.B + 1
        return need

    def begin(self, entries: Sequence[Entry]) -> list[int]:
        """The begun step's tags, token after token (what the backend writes)."""
        self.end_step()
        self.pending = []
        out: list[int] = []
        for seq, T, tokens in entries:
            s = self.seqs[seq]
            # Plain: every earlier position is a plain prefix computation (so its
            # token is known) and this entry names its tokens.
            plain = s.plain == s.length and tokens is not None
            history = [int(t) for t in s.tokens if t is not None] if plain else []
            tags: list[int] = []
            toks: list[int | None] = []
            for j in range(T):
                t = None if tokens is None else int(tokens[j])
                if t is not None and plain:
                    history.append(t)
                    tags.append(self.prefix_tag(history))
                else:
                    tags.append(self.unique_tag())
                toks.append(t)
            self.pending.append((seq, tags, toks))
            out += tags
        return out

    def commit(self) -> None:
        assert self.pending is not None
        for seq, tags, toks in self.pending:
            s = self.seqs[seq]
            plain_before = s.plain == s.length
            s.tags += tags
            s.removed += [False] * len(tags)
            s.tokens += toks
            if plain_before and all(t is not None for t in toks):
                s.plain = s.length
                for tag in tags:
                    self.computed.add(tag)
            s.peak = max(s.peak, s.length)
        self.pending = None

    def abandon(self) -> None:
        self.pending = None


def check_step(model: BatchModel, plan: StepPlan, pools: Pools, new_tags: Sequence[int], num_blocks: Sequence[int]) -> None:
    """The begun step's plan against the model, after `pools` applied it
    (raises AssertionError naming the first difference)."""
    assert model.pending is not None
    B = plan.block_size
    assert B == model.B
    assert [seq for seq, _, _ in model.pending] == plan.seq_ids, (plan.seq_ids, model.pending)
    starts = [0]
    for _, tags, _ in model.pending:
        starts.append(starts[-1] + len(tags))
    assert plan.query_starts == starts, (plan.query_starts, starts)
    n_tokens = starts[-1]
    for g, policy in enumerate(model.groups):
        slots = plan.slots[g]
        assert len(slots) == n_tokens
        assert len(set(slots.tolist())) == n_tokens, f"group {g}: two tokens write one row: {slots.tolist()}"
        assert all(0 <= r < num_blocks[g] * B for r in slots.tolist()), f"group {g}: a slot outside the pool"
        dsts = [d for _, d in plan.copies[g]]
        srcs = {s for s, _ in plan.copies[g]}
        assert len(set(dsts)) == len(dsts) and not srcs & set(dsts), f"group {g}: copies {plan.copies[g]}"
        assert not srcs & set((slots // B).tolist()), f"group {g}: a token writes a block a copy reads"
    for i, (seq, tags, _) in enumerate(model.pending):
        s = model.seqs[seq]
        L, T = s.length, len(tags)
        where = f"entry {i} (seq {seq}, positions {L}..{L + T - 1})"
        assert plan.first_positions[i] == L and plan.context_lens[i] == L + T, where
        assert plan.visible_starts[i] == s.visible_start, (where, plan.visible_starts[i], s.visible_start)
        assert plan.holes[i] == s.holes, (where, plan.holes[i], s.holes)
        held = np.asarray(s.tags + list(tags), np.int64)
        removed = np.asarray(s.removed + [False] * T, bool)
        keys = np.arange(L + T)
        queries = np.arange(L, L + T)[:, None]
        for g, policy in enumerate(model.groups):
            table = plan.block_tables[g][seq]
            # Each new token's slot is its position's row.
            positions = np.arange(L, L + T)
            rows = table[positions // B] * B + positions % B
            assert (table[positions // B] >= 0).all(), f"{where}, group {g}: a new position has no block"
            got = plan.slots[g][starts[i] : starts[i + 1]]
            assert (got == rows).all(), f"{where}, group {g}: slots {got.tolist()}, table rows {rows.tolist()}"
            # Every key some query of the step sees (section 2, per sequence).
            seen = keys <= queries
            if policy.is_ring:
                seen &= (queries - keys < policy.window) | (keys < policy.sinks)
            if policy.is_chunked:  # section 9: the query's own chunk
                seen &= keys // policy.chunk == queries // policy.chunk
            needed = seen.any(axis=0) & ~removed
            ks = keys[needed]
            blocks = table[ks // B]
            holes = ks[blocks < 0]
            assert holes.size == 0, f"{where}, group {g}: needed keys {holes.tolist()} are in holes of the table"
            have = pools.rows[g][blocks * B + ks % B]
            wrong = ks[have != held[ks]]
            assert wrong.size == 0, (
                f"{where}, group {g} ({policy}): keys {wrong.tolist()} hold other K/V "
                f"(rows hold {have[have != held[ks]].tolist()}, the model says {held[wrong].tolist()})"
            )


@dataclass
class Block:
    """One block of the pool, as the prefix model sees it."""

    group: int = -1  # the group holding or caching it
    refs: int = 0
    name: tuple[int, ...] | None = None  # the token ids of this block and every block before it
    released: int = 0  # when it was last freed (cached blocks: the LRU order)


@dataclass
class _Naming:
    names: bool = True  # names the full blocks its steps fill
    named_blocks: int = 0  # blocks whose names it knows (a prefix of its history)
    tokens: list[int | None] = field(default_factory=list)
    removed: list[bool] = field(default_factory=list)


class PrefixPools:
    """The one block pool every group draws from, as docs/batch.md section 5 states it, to predict every
    adopt_prefix hit exactly, every admission, and every free, cached and held
    count. Written from the docs, not from kvcore: a block's name is the token
    ids of its whole prefix (not a hash), each rule quotes the text, and block
    ids follow the documented allocation (the lowest free block without a
    name), so they are the cache's. Driven with the calls the cache accepted."""

    def __init__(self, num_blocks: int, groups: Sequence[Policy], block_size: int, max_rewind: int, max_seqs: int, stride: int) -> None:
        self.B, self.R, self.stride = block_size, max_rewind, stride
        self.policies = list(groups)
        self.blocks = [Block() for _ in range(num_blocks)]
        self.tables = [[[-1] * stride for _ in range(max_seqs)] for _ in groups]
        self.seqs = [_Naming() for _ in range(max_seqs)]
        self.copies: list[list[int]] = [[] for _ in groups]  # the begun step's copy sources
        self.writes: list[list[tuple[int, int, int]]] = [[] for _ in groups]  # (seq, first index, block before)
        self.pending: list[Entry] | None = None
        self.clock = 0

    # --- counts -------------------------------------------------------------------------

    def free_blocks(self) -> int:
        return sum(b.refs == 0 for b in self.blocks)

    def cached_blocks(self, g: int) -> int:
        return sum(b.refs == 0 and b.name is not None and b.group == g for b in self.blocks)

    def blocks_held(self, seq: int, g: int) -> int:
        return sum(b >= 0 for b in self.tables[g][seq])

    # --- rules ----------------------------------------------------------------------------

    def needed(self, g: int, length: int, i: int) -> bool:
        """Rings: a sequence at `length` holds its sink blocks and every block not
        wholly below length - R - W + 1 (what a query after a rewind of up to R = max_rewind needs)."""
        p = self.policies[g]
        if not p.evicts:
            return True
        # Chunked (section 9): every block not wholly below K * floor((length - R) / K).
        return i < ceil_div(p.sinks, self.B) or (i + 1) * self.B > p.kept_from(length, self.R)

    def hit_needs(self, g: int, h: int, i: int) -> bool:
        """A hit of h blocks needs block i where a sequence at h * B holds it, and its last block
        always ("a hit names a prefix some sequence computed", docs/batch.md section 5)."""
        return self.needed(g, h * self.B, i) or i == h - 1

    def find(self, g: int, name: tuple[int, ...]) -> int:
        """A hit shares the lowest held copy of the content in the group, else the cached one."""
        cached = -1
        for b, blk in enumerate(self.blocks):
            if blk.group == g and blk.name == name:
                if blk.refs > 0:
                    return b
                cached = b
        return cached

    def name_or_share(self, g: int, seq: int, i: int, name: tuple[int, ...]) -> None:
        """A committed block whose content its group already keeps (held or cached) goes back
        unnamed when no one else holds it, and its holder shares that copy; else it is named."""
        b = self.tables[g][seq][i]
        blk = self.blocks[b]
        if blk.name is not None:
            return
        copy = self.find(g, name) if blk.refs == 1 else -1
        if copy < 0:
            blk.name = name
            return
        self.blocks[copy].refs += 1
        self.release_block(g, b)
        self.tables[g][seq][i] = copy

    def must_copy(self, g: int, b: int) -> bool:
        """A step copies a block it writes into when another sequence holds it,
        or when it is named (a named block never changes)."""
        blk = self.blocks[b]
        return blk.refs > 1 or blk.name is not None

    def allocate(self, g: int) -> int:
        """The lowest free block without a name, else the least recently released
        cached one of any group (its name goes)."""
        free = [b for b, blk in enumerate(self.blocks) if blk.refs == 0]
        plain = [b for b in free if self.blocks[b].name is None]
        pick = plain[0] if plain else min(free, key=lambda b: self.blocks[b].released)
        self.blocks[pick] = Block(group=g, refs=1)
        return pick

    def release_block(self, g: int, b: int) -> None:
        """One holder fewer. A named block no one holds stays cached, the most
        recently released; one cached copy per content in a group: an older one loses its name."""
        blk = self.blocks[b]
        blk.refs -= 1
        if blk.refs:
            return
        self.clock += 1
        blk.released = self.clock
        if blk.name is None:
            return
        for o, other in enumerate(self.blocks):
            if o != b and other.refs == 0 and other.group == blk.group and other.name == blk.name:
                other.name = None

    def release_at(self, g: int, seq: int, i: int) -> None:
        b = self.tables[g][seq][i]
        if b >= 0:
            self.release_block(g, b)
            self.tables[g][seq][i] = -1

    def release_from(self, seq: int, start: int) -> None:
        """A sequence's blocks go tail first across the groups: index after index from the
        highest, each in every group."""
        for i in reversed(range(start, self.stride)):
            for g in range(len(self.policies)):
                self.release_at(g, seq, i)

    def evict(self, g: int, seq: int) -> None:
        """After a commit at length L a ring releases the blocks wholly below
        L - C - W + 1 but the sinks, tail first."""
        L = len(self.seqs[seq].tokens)
        for i in reversed(range(ceil_div(L, self.B))):
            if not self.needed(g, L, i):
                self.release_at(g, seq, i)

    def cut_keeps_names(self, seq: int, n: int) -> bool:
        """A rewind or fork to a block boundary, or inside the block being filled,
        keeps naming; at a boundary some group must still hold the block before it, named."""
        s = self.seqs[seq]
        if n >= s.named_blocks * self.B:
            return True
        if n % self.B:
            return False
        return any(t[seq][n // self.B - 1] >= 0 and self.blocks[t[seq][n // self.B - 1]].name is not None for t in self.tables)

    def all_removed(self, seq: int, lo: int, hi: int) -> bool:
        return all(self.seqs[seq].removed[lo:hi])

    # --- verbs ------------------------------------------------------------------------------

    def add(self, seq: int) -> None:
        self.end_step()
        self.seqs[seq] = _Naming()

    def release(self, seq: int) -> None:
        self.end_step()
        self.release_from(seq, 0)
        self.seqs[seq] = _Naming()

    def clear(self) -> None:
        self.pending = None
        self.blocks = [Block() for _ in self.blocks]
        self.tables = [[[-1] * self.stride for _ in t] for t in self.tables]
        self.seqs = [_Naming() for _ in self.seqs]
        self.copies = [[] for _ in self.policies]
        self.writes = [[] for _ in self.policies]

    def fork(self, src: int, dst: int, upto: int) -> None:
        """A fork shares every block of the source holding a position the new
        sequence sees; rings give back what a query at `upto` cannot need."""
        self.end_step()
        self.release_from(dst, 0)
        s = self.seqs[src]
        d = self.seqs[dst] = _Naming(tokens=s.tokens[:upto], removed=s.removed[:upto])
        for g, t in enumerate(self.tables):
            for i in range(ceil_div(upto, self.B)):
                b = t[src][i]
                if b >= 0 and not self.all_removed(dst, i * self.B, min((i + 1) * self.B, upto)):
                    self.blocks[b].refs += 1
                    t[dst][i] = b
            self.evict(g, dst)
        if upto:
            d.names = s.names and self.cut_keeps_names(src, upto)
            d.named_blocks = min(s.named_blocks, upto // self.B) if d.names else 0

    def remove(self, seq: int, p0: int, p1: int) -> None:
        """A head or middle removal (or none): the blocks whose every position
        below the length is removed are released, tail first."""
        self.end_step()
        s = self.seqs[seq]
        L = len(s.tokens)
        if all(s.removed[p0 : min(p1, L)]):
            return
        for p in range(p0, min(p1, L)):
            s.removed[p] = True
        s.names = False
        for i in reversed(range(ceil_div(L, self.B))):
            if self.all_removed(seq, i * self.B, min((i + 1) * self.B, L)):
                for g in range(len(self.policies)):
                    self.release_at(g, seq, i)

    def rewind(self, seq: int, n: int) -> None:
        self.end_step()
        s = self.seqs[seq]
        keeps = n == 0 or (s.names and self.cut_keeps_names(seq, n))
        self.release_from(seq, ceil_div(n, self.B))
        del s.tokens[n:], s.removed[n:]
        if n % self.B and self.all_removed(seq, n - n % self.B, n):
            for g in range(len(self.policies)):
                self.release_at(g, seq, n // self.B)
        if n == 0:
            self.seqs[seq] = _Naming()
            return
        s.names = keeps
        s.named_blocks = min(s.named_blocks, n // self.B)

    def predict_hit(self, tokens: Sequence[int]) -> int:
        """The longest run of full blocks of tokens[0, len - 1), from block 0, that
        every group can serve (rings: their sinks and what a query at the hit needs)."""
        toks = tuple(int(t) for t in tokens)
        for h in reversed(range(1, (len(toks) - 1) // self.B + 1 if toks else 1)):
            if all(
                not self.hit_needs(g, h, i) or self.find(g, toks[: (i + 1) * self.B]) >= 0
                for g in range(len(self.policies))
                for i in range(h)
            ):
                return h * self.B
        return 0

    def adopt(self, seq: int, tokens: Sequence[int]) -> int:
        self.end_step()
        hit = self.predict_hit(tokens)
        toks = tuple(int(t) for t in tokens)
        self.seqs[seq] = _Naming(tokens=list(toks[:hit]), removed=[False] * hit, named_blocks=hit // self.B)
        for g, t in enumerate(self.tables):
            for i in range(hit // self.B):
                if self.hit_needs(g, hit // self.B, i):
                    b = self.find(g, toks[: (i + 1) * self.B])
                    self.blocks[b].refs += 1
                    t[seq][i] = b
        return hit

    # --- steps --------------------------------------------------------------------------------

    def admits(self, entries: Sequence[Entry]) -> bool:
        """Would the pools admit the step, once a begun one is given back? Each
        entry needs its new blocks and a copy of every shared or named block it writes."""
        after = copy.deepcopy(self)
        after.end_step()
        need = 0  # every group draws from the one pool
        for g, t in enumerate(after.tables):
            for seq, T, _ in entries:
                L = len(after.seqs[seq].tokens)
                need += sum(t[seq][i] < 0 or after.must_copy(g, t[seq][i]) for i in range(L // self.B, ceil_div(L + T, self.B)))
        return need <= after.free_blocks()

    def begin(self, entries: Sequence[Entry]) -> None:
        self.end_step()
        for seq, T, _ in entries:  # entry after entry, each in every group: the order blocks are taken in
            for g, t in enumerate(self.tables):
                L = len(self.seqs[seq].tokens)
                self.writes[g].append((seq, L // self.B, t[seq][L // self.B]))
                for i in range(L // self.B, ceil_div(L + T, self.B)):
                    b = t[seq][i]
                    if b < 0:
                        t[seq][i] = self.allocate(g)
                    elif self.must_copy(g, b):
                        self.copies[g].append(b)  # held until commit: an abandoned step restores it
                        t[seq][i] = self.allocate(g)
        self.pending = list(entries)

    def commit(self) -> None:
        assert self.pending is not None
        for g in range(len(self.policies)):
            for b in self.copies[g]:
                self.release_block(g, b)
            self.copies[g], self.writes[g] = [], []
        entries, self.pending = self.pending, None
        for seq, T, tokens in entries:
            s = self.seqs[seq]
            L = len(s.tokens)
            s.tokens += [None] * T if tokens is None else [int(x) for x in tokens]
            s.removed += [False] * T
            if tokens is None:  # named when a committed step passed the tokens that filled it
                s.names = False
            i = L // self.B
            while s.names and (i + 1) * self.B <= len(s.tokens):
                if i >= s.named_blocks:
                    name = tuple(int(x or 0) for x in s.tokens[: (i + 1) * self.B])
                    for g in range(len(self.tables)):
                        self.name_or_share(g, seq, i, name)
                    s.named_blocks = i + 1
                i += 1
            for g in range(len(self.policies)):
                self.evict(g, seq)

    def end_step(self) -> None:
        """A begun step given back: its new blocks and copies return, the tables
        are as before. Cached blocks it reclaimed stay reclaimed."""
        if self.pending is None:
            return
        for g, t in enumerate(self.tables):
            for seq, first, before in self.writes[g]:
                if t[seq][first] != before:
                    self.release_block(g, t[seq][first])
                t[seq][first] = before
                for i in range(first + 1, self.stride):
                    self.release_at(g, seq, i)
            self.copies[g], self.writes[g] = [], []
        self.pending = None
