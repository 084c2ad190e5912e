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
  true where the contract guarantees success (up to max_step back from the
  peak length, to n <= sinks, whatever the removed positions make unneeded);
  elsewhere the caller holds can_rewind() to the call's outcome and the next
  steps' reads to the truth;
- admission: `worst_need()` is the most blocks a step can need per group (every
  block its new positions touch, new or copied); a refusal with more free
  blocks than that is wrong;
- prefix hits: `adopt()` checks a hit is a multiple of B below the prompt's
  length and names a prefix some sequence committed since the last clear; the
  next step's reads check its rows.

Errors are named by their kvcore.Error member name ("InvalidArgument", ...).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from reference import Policy

IntArray = npt.NDArray[np.int64]
Entry = tuple[int, int, "Sequence[int] | None"]  # (seq, T, tokens or None)

INT_MIN, INT_MAX = -(2**31), 2**31 - 1


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
    ) -> None:
        self.capacity = capacity
        self.max_step = max_step
        self.B = block_size
        self.max_seqs = max_seqs
        self.max_step_tokens = max_step_tokens
        self.max_holes = max_holes
        # Layers with identical policies form a group, in order of first appearance.
        self.groups: list[Policy] = []
        self.group_of: list[int] = []
        for p in layer_policies:
            if p not in self.groups:
                self.groups.append(p)
            self.group_of.append(self.groups.index(p))
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
        """Section 6, Memory: the most blocks a ring group keeps for one sequence."""
        p, B, C = self.groups[g], self.B, self.max_step
        return ceil_div(p.sinks, B) + ceil_div(p.window + C - 1, B) + 1

    def must_allow(self, seq: int, n: int) -> bool:
        """Must a rewind of `seq` to n (or a fork of it at n) succeed? Every ring
        group keeps its sinks and what a rewind of up to max_step tokens from the
        peak length needs, so it must when every key a query at n sees below n
        (not removed) is a sink or within max_step + window - 1 of the peak."""
        s = self.seqs[seq]
        if not s.active or not 0 <= n <= s.length:
            return False
        for p in self.groups:
            if not p.is_ring:
                continue
            kept_from = s.peak - self.max_step - p.window + 1
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
