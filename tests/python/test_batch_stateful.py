"""A hypothesis state machine drives kvcore.BatchCache (docs/design.md section 6)
against the brute-force model of batch_reference.py, with a simulated byte
layer that applies every plan: random configs (flat and ring groups with
sinks, block sizes 1..8, small pools so that steps run out of blocks, few
holes allowed), sequences added and released, steps over random subsets with
and without token ids (committed three ways, or abandoned with none, some or
all of their plan applied), forks at random points, removals of heads, middles
and tails, rewinds inside and outside the allowed range, prefix adoption with
prompts built from other sequences' tokens, clears, stale handles and bad
integers.

What every rule proves:
- after every step, every query's every visible key is named by the plan's
  block table and holds the K/V the model says (check_step); an adopted prefix
  holds what a fresh computation of those tokens holds;
- a refused call raises the class the model names and changes nothing (each
  sequence's info, blocks held, free, cached and used blocks, the block
  tables, the begun step);
- can_rewind(seq, n) is exactly whether rewind(seq, n) succeeds, and is true
  wherever the contract guarantees it (up to max_step back from the peak
  length, to the sinks, past removed history); a truncating remove or a fork
  obeys the same rule; a step refused for want of blocks really lacked them;
- every prefix hit is the longest cached prefix, every admission and every
  free, cached and held block count as PrefixPools (the pools as
  docs/batch.md section 5 states them, reclaim order included) predicts;
- at rest, the block tables (seen through a plan's zero-copy view, which is
  the cache's own buffer) say what the counters say: blocks held, free and
  used blocks, oldest_held; a sequence holds no block without a position it
  still sees; flat groups hold every visible position, ring groups what the
  rewind guarantee needs and no more than ceil(S/B) + ceil((W+C-1)/B) + 1
  blocks per sequence.

Profiles (HYPOTHESIS_PROFILE, as test_stateful.py):
  dev   (default) 150 examples of up to 20 rules, derandomized: a quick check;
  ci    derandomized (a fixed seed), sized to about a minute of CPU on the
        project's 2-core machine: what scripts/test.sh runs;
  long  20,000 examples of up to 60 rules, random seeds, failures saved in
        .hypothesis/ and replayed first next time.
A failure shrinks to a short list of operations; fix it at the root and keep
the reproducer as a plain test (tests/python/regressions/test_batch_regressions.py).
"""

from __future__ import annotations

import gc
import pydoc
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, event
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

import kvcore
from batch_reference import BatchModel, Entry, Pools, PrefixPools, StepPlan, ceil_div, check_step, observable
from hypothesis_profiles import profile_settings
from reference import Policy, policy_of

PROFILES: dict[str, dict[str, Any]] = {
    "dev": {"max_examples": 150, "stateful_step_count": 20, "derandomize": True, "database": None},
    "ci": {"max_examples": 1_500, "stateful_step_count": 25, "derandomize": True, "database": None},
    "long": {"max_examples": 20_000, "stateful_step_count": 60},
}
SETTINGS = profile_settings(PROFILES, HealthCheck.filter_too_much, HealthCheck.data_too_large)

ERROR_CLASS: dict[str, type[kvcore.KVCacheError]] = {
    "InvalidArgument": kvcore.InvalidArgumentError,
    "OutOfResources": kvcore.CapacityError,
    "InvalidState": kvcore.InvalidStateError,
}

# Integers a caller may pass anywhere: beyond a C int, both ways.
EDGES = [-(2**63), -(2**31) - 1, 2**31, 2**63, 2**70]
VOCABULARY = st.integers(0, 2)  # a tiny vocabulary: prefixes repeat, so blocks are reused


@st.composite
def batch_configs(draw: st.DrawFn) -> tuple[kvcore.CacheConfig, list[Policy]]:
    capacity = draw(st.integers(4, 40))
    max_step = draw(st.integers(1, min(6, capacity)))
    ring = st.builds(Policy, window=st.one_of(st.integers(1, 4), st.integers(1, 9)), sinks=st.sampled_from([0, 0, 1, 2, 3]))
    chunked = st.builds(Policy, chunk=st.integers(1, 9))  # section 9
    kinds = [draw(st.one_of(ring, ring, st.just(Policy()), chunked)) for _ in range(draw(st.integers(1, 3)))]
    policies: list[Policy] = []
    for layer in range(draw(st.integers(1, 4))):
        # Section 9: a layer past the first may share an earlier one's K/V (its group).
        holders = [i for i, p in enumerate(policies) if not p.is_shared]
        if layer > 0 and draw(st.integers(0, 3)) == 0:
            policies.append(Policy(source=draw(st.sampled_from(holders))))
        else:
            policies.append(draw(st.sampled_from(kinds)))
    B = draw(st.one_of(st.sampled_from([1, 2, 2, 3, 4]), st.integers(1, 8)))
    stride = ceil_div(capacity, B)
    limits = kvcore.BatchLimits(
        block_size=B,
        max_seqs=draw(st.integers(1, 6)),
        max_step_tokens=draw(st.one_of(st.just(0), st.integers(1, 12))),
        # The pool: often too small for every sequence, so steps run out of blocks.
        # One pool for every group (at most 4: a layer each): at least 4 blocks, so that the
        # throwaway step create() reads the tables through (one token, a block per group) fits.
        num_blocks=draw(st.one_of(st.just(0), st.just(0), st.integers(4, max(4, 3 * stride)),
                                  st.integers(max(4, stride // 2), max(4, 2 * stride)))),
        max_holes=draw(st.integers(0, 3)),
        # Groups of at most page_layers layers of one policy (0: the fewest any policy has).
        page_layers=draw(st.one_of(st.just(0), st.just(0), st.integers(1, 3))),
        # A rewind margin of its own (0: none, as vLLM's sliding window; past max_step too), else
        # the default (-1: max_step).
        max_rewind=draw(st.one_of(st.just(-1), st.just(-1), st.integers(0, min(capacity, max_step + 2)))),
    )
    def layer_policy(p: Policy) -> kvcore.LayerPolicy:
        if p.is_shared:
            return kvcore.Shared(p.source)
        if p.is_chunked:
            return kvcore.Chunked(p.chunk)
        return kvcore.Ring(p.window, p.sinks) if p.is_ring else kvcore.Flat()

    layers = [kvcore.LayerConfig(layer_policy(p), 1, 2) for p in policies]
    return kvcore.CacheConfig(capacity, layers, max_step=max_step, batch=limits), policies


def step_plan(plan: kvcore.BatchStepPlan) -> StepPlan:
    """The plan's arrays as the model reads them (block tables stay views)."""
    groups = plan.groups
    return StepPlan(
        block_size=plan.block_size,
        seq_ids=plan.seq_ids.tolist(),
        query_starts=plan.query_starts.tolist(),
        first_positions=plan.first_positions.tolist(),
        context_lens=plan.context_lens.tolist(),
        visible_starts=plan.visible_starts.tolist(),
        holes=[plan.holes(i) for i in range(plan.n_entries)],
        slots=[g.slots.astype(np.int64) for g in groups],
        copies=[[(int(s), int(d)) for s, d in g.copies.tolist()] for g in groups],
        block_tables=[g.block_tables for g in groups],
    )


class BatchMachine(RuleBasedStateMachine):
    """The cache, the model it must agree with, and the byte layer."""

    def __init__(self) -> None:
        super().__init__()
        self.cache: kvcore.BatchCache
        self.model: BatchModel
        self.pools: Pools
        self.prefix: PrefixPools  # the pools as the docs state them: every hit, admission and count
        self.tables: list[Any] = []  # per group, a view of the cache's block tables
        self.open: kvcore.BatchStep | None = None  # the begun, uncommitted step
        self.open_plan: StepPlan | None = None
        self.open_tags: list[int] = []
        self.open_blocks = 0  # the blocks of the one pool the begun step allocated
        self.handles: list[kvcore.BatchStep] = []
        self.plans: list[kvcore.BatchStepPlan] = []
        self.histories: list[list[int]] = []  # token ids of released sequences: prompts for prefix hits

    @initialize(config=batch_configs(), n_active=st.integers(0, 4), prefill=st.lists(st.integers(0, 24), max_size=4), data=st.data())
    def create(self, config: tuple[kvcore.CacheConfig, list[Policy]], n_active: int, prefill: list[int], data: st.DataObject) -> None:
        cfg, policies = config
        c = self.cache = kvcore.BatchCache(cfg)
        b = cfg.batch
        default_tokens = min(b.max_seqs * cfg.max_step, 2**20)
        assert c.max_step_tokens == (b.max_step_tokens or default_tokens)
        assert (c.max_seqs, c.capacity, c.max_step, c.block_size) == (b.max_seqs, cfg.capacity, cfg.max_step, b.block_size)
        assert c.max_rewind == (cfg.max_step if b.max_rewind == -1 else b.max_rewind)
        self.model = BatchModel(cfg.capacity, cfg.max_step, policies, b.block_size, b.max_seqs, c.max_step_tokens, b.max_holes, b.page_layers,
                                max_rewind=c.max_rewind)
        m = self.model
        assert c.n_groups == len(m.groups) and c.n_layers == len(policies)
        assert c.table_stride == ceil_div(cfg.capacity, b.block_size)
        for layer, g in enumerate(m.group_of):
            assert c.group_of(layer) == g
            assert c.layer_config(layer) == cfg.layers[layer]
        # "The one pool holds num_blocks blocks, by default what each group would need alone,
        # summed" (docs/batch.md section 2): a full table row per sequence for a flat group, the
        # window's blocks (sinks, W + C + R - 1 positions, one more: R the rewind margin) for a
        # ring or chunked one.
        full = b.max_seqs * c.table_stride
        default = 0
        for p in m.groups:
            window, sinks = (p.window, p.sinks) if p.is_ring else (p.chunk, 0)
            per_seq = ceil_div(sinks, b.block_size) + ceil_div(window + cfg.max_step + c.max_rewind - 1, b.block_size) + 1
            default += min(per_seq * b.max_seqs if per_seq < c.table_stride else full, full) if p.evicts else full
        for g, p in enumerate(m.groups):
            got = c.group_policy(g)
            assert (got.is_ring, got.window, got.sinks) == (p.is_ring, p.window or p.chunk, p.sinks)
            assert (got.kind == kvcore.LayerPolicy.Kind.Chunked) == p.is_chunked
            assert c.num_blocks(g) == (b.num_blocks or default), (g, c.num_blocks(g), default)
            assert c.free_blocks(g) == c.num_blocks(g) and c.used_blocks(g) == 0 and c.cached_blocks(g) == 0
        self.pools = Pools([c.num_blocks(g) * b.block_size for g in range(c.n_groups)], b.block_size)
        self.prefix = PrefixPools(c.num_blocks(0), m.groups, b.block_size, c.max_rewind, b.max_seqs, c.table_stride)
        # A step's block_tables are views of the cache's own tables: keep one to
        # read the tables at rest (a throwaway step, then clear()).
        c.add_sequence(0)
        throwaway = c.begin_step([(0, 1)])
        self.tables = [g.block_tables for g in throwaway.plan().groups]
        c.clear()
        # Most examples start with sequences, and most of those with a history
        # (prompts of up to 24 tokens, given in max_step chunks).
        for seq in range(min(n_active, b.max_seqs)):
            c.add_sequence(seq)
            self.model.add(seq)
            self.prefix.add(seq)
        for seq, length in zip(self.active(), prefill):
            tokens = data.draw(st.lists(VOCABULARY, min_size=length, max_size=length))
            while self.model.seqs[seq].length < min(length, cfg.capacity):
                L = self.model.seqs[seq].length
                T = min(cfg.max_step, length - L, cfg.capacity - L, c.max_step_tokens)
                if not self.do_step([(seq, T, tokens[L : L + T])], "step"):
                    break  # a pool ran short

    # --- helpers --------------------------------------------------------------------------

    def snapshot(self) -> tuple[Any, ...]:
        c = self.cache
        visible = tuple(c.sequence(s).visible_positions for s in range(c.max_seqs))
        tables = tuple(t.tobytes() for t in self.tables)
        return observable(c), visible, tables, self.open is not None and self.open.is_current

    def refused(self, errors: set[str], call: Callable[[], object]) -> None:
        """`call` raises the class of one of `errors`, with a message, and changes nothing."""
        assert errors
        before = self.snapshot()
        with pytest.raises(kvcore.KVCacheError) as info:
            call()
        allowed = {ERROR_CLASS[e] for e in errors}
        assert type(info.value) in allowed, f"{type(info.value).__name__}: {info.value} (expected one of {errors})"
        assert str(info.value), "an error without a message"
        assert self.snapshot() == before, f"a refused call changed the cache: {info.value}"

    def ended(self) -> None:
        """A verb succeeded: the begun step is over."""
        self.model.end_step()
        if self.open is not None:
            assert not self.open.is_current
        self.open = None
        self.open_plan = None

    def any_seq(self, data: st.DataObject) -> int:
        """Mostly a valid id, sometimes just outside the range."""
        n = self.model.max_seqs
        return data.draw(st.one_of(st.integers(0, n - 1), st.integers(0, n - 1), st.integers(0, n - 1), st.sampled_from([-1, n])))

    def some_active(self, data: st.DataObject) -> int:
        """Mostly an active sequence, else any id (maybe inactive or out of range)."""
        active = self.active()
        if active and data.draw(st.integers(0, 4)) != 0:
            return data.draw(st.sampled_from(active))
        return self.any_seq(data)

    def active(self) -> list[int]:
        return [s for s in range(self.model.max_seqs) if self.model.seqs[s].active]

    def do_step(self, entries: Sequence[Entry], how: str, form: str = "tuple") -> bool:
        """begin_step(entries), checked; then committed by `how`, or abandoned.
        False when the step was refused."""
        m, c = self.model, self.cache
        args: list[Any] = []
        for seq, T, tokens in entries:
            if tokens is None:
                args.append((seq, T) if form != "none" else (seq, T, None))
            elif form == "array":
                args.append((seq, T, np.asarray(tokens, np.int32)))
            else:
                args.append([seq, T, list(tokens)] if form == "list" else (seq, T, tuple(tokens)))
        errors = m.step_errors(entries)
        if errors:
            self.refused(errors, lambda: c.begin_step(args))
            return False
        free = c.free_blocks(0) if c.n_groups else 0  # the one pool's (every group draws from it)
        # A begun step that this one replaces gives back the blocks it took.
        back = self.open_blocks if self.open is not None else 0
        need = m.worst_need(entries)
        fits = self.prefix.admits(entries)
        before = self.snapshot()
        try:
            step = c.begin_step(args) if how != "with" else c.step(args)
        except kvcore.CapacityError as e:
            assert free + back < need * c.n_groups, (
                f"refused with {free} free blocks and {back} a replaced step gives back, at most {need} needed "
                f"in each of {c.n_groups} groups: {e}"
            )
            assert not fits, f"refused a step the pools hold: {e}"

            event("step refused: a pool is short")
            assert self.snapshot() == before, "a refused step changed the cache"
            return False
        assert fits, "admitted a step the pools cannot hold"
        if self.open is not None:
            assert not self.open.is_current  # replaced: the retry path
        self.prefix.begin(entries)
        self.handles.append(step)
        self.open_blocks = free + back - (c.free_blocks(0) if c.n_groups else 0)
        tags = m.begin(entries)
        assert step.is_current and (step.n_entries, step.n_tokens) == (len(entries), len(tags))
        kplan = step.plan()
        self.plans.append(kplan)
        plan = step_plan(kplan)
        assert (kplan.n_entries, kplan.n_tokens, kplan.block_size) == (len(entries), len(tags), m.B)
        # Each group's window bounds travel with the plan (docs/design.md section 6).
        assert [policy_of(g.policy) for g in kplan.groups] == m.groups
        assert kplan.positions.tolist() == [c.sequence(s).length + j for s, T, _ in entries for j in range(T)]
        if any(plan.copies):
            event("step with copy-on-write")
        if how in ("step", "cache", "with", "raise"):
            self.pools.apply(plan, tags)
            check_step(m, plan, self.pools, tags, [c.num_blocks(g) for g in range(c.n_groups)])
            event("step checked")
            if how == "step":
                step.commit()
            elif how == "cache":
                c.commit(step)
            elif how == "with":
                with step:
                    pass
            else:
                with pytest.raises(ZeroDivisionError), step:
                    raise ZeroDivisionError  # the body failed: not committed
            if how != "raise":
                assert not step.is_current
                m.commit()
                self.prefix.commit()
                self.open = None
                self.open_plan = None
                return True
        else:  # abandoned, with none, the copies, some or all of the plan applied
            event("step abandoned")
            writes = {"none": False, "copies": False, "some": [j % 2 == 0 for j in range(len(tags))], "all": True}[how]
            self.pools.apply(plan, tags, copies=how != "none", writes=writes)
        self.open = step
        self.open_plan = plan
        self.open_tags = tags
        return True

    def commit_open(self) -> None:
        """The begun (abandoned) step after all: its plan applied whole, then committed."""
        assert self.open is not None and self.open_plan is not None and self.open.is_current
        self.pools.apply(self.open_plan, self.open_tags)
        check_step(self.model, self.open_plan, self.pools, self.open_tags, [self.cache.num_blocks(g) for g in range(self.cache.n_groups)])
        self.cache.commit(self.open)
        self.model.commit()
        self.prefix.commit()
        self.open = None
        self.open_plan = None

    # --- rules ---------------------------------------------------------------------------

    @rule(data=st.data())
    def add(self, data: st.DataObject) -> None:
        free = [s for s in range(self.model.max_seqs) if not self.model.seqs[s].active]
        seq = self.any_seq(data)
        if free and data.draw(st.integers(0, 4)) != 0:
            seq = data.draw(st.sampled_from(free))
        errors = self.model.add_errors(seq)
        if errors:
            self.refused(errors, lambda: self.cache.add_sequence(seq))
            return
        self.cache.add_sequence(seq)
        self.model.add(seq)
        self.prefix.add(seq)
        self.ended()

    @rule(data=st.data(), now=st.integers(0, 2))
    def release(self, data: st.DataObject, now: int) -> None:
        """release_sequence(seq), in one call of this rule in three."""
        if now != 2:
            return
        seq = self.some_active(data)
        errors = self.model.release_errors(seq)
        if errors:
            self.refused(errors, lambda: self.cache.release_sequence(seq))
            return
        tokens = self.model.seqs[seq].tokens
        if tokens:
            self.histories = [[t or 0 for t in tokens]] + self.histories[:3]
        self.cache.release_sequence(seq)
        self.model.release(seq)
        self.prefix.release(seq)
        self.ended()

    def step(self, data: st.DataObject, how: str, form: str) -> None:
        """One step over a random subset of the active sequences; one in ten is
        broken (an inactive or unknown sequence, a repeat, T out of range). When
        a step is begun and uncommitted, one time in three it is committed
        instead, its plan applied whole (after none, some or all of it was)."""
        m = self.model
        if self.open is not None and data.draw(st.integers(0, 2)) == 0:
            self.commit_open()
            return
        seqs = self.active()
        if seqs:
            seqs = data.draw(st.permutations(seqs))[: data.draw(st.integers(1, len(seqs)))]
        broken = data.draw(st.sampled_from(["", "", "", "", "", "", "", "", "", "seq", "T"])) if seqs else "seq"
        if broken == "seq":
            seqs = seqs + [data.draw(st.sampled_from(seqs + [-1, m.max_seqs] + list(range(m.max_seqs))))]
        entries: list[Entry] = []
        for seq in seqs:
            T = data.draw(st.integers(1, m.max_step))
            if broken == "T" and seq == seqs[-1]:
                T = data.draw(st.sampled_from([0, -1, m.max_step + 1]))
            given = data.draw(st.integers(0, 9)) < 8 and T >= 0
            tokens = data.draw(st.lists(VOCABULARY, min_size=T, max_size=T)) if given else None
            entries.append((seq, T, tokens))
        self.do_step(entries, how, form)

    # Hypothesis has no rule weights: steps are most of a workload, so three rules step.
    STEP_ARGS: dict[str, Any] = {
        "data": st.data(),
        "how": st.sampled_from(["step", "step", "cache", "with", "raise", "none", "copies", "some", "all"]),
        "form": st.sampled_from(["tuple", "list", "array", "none"]),
    }

    @rule(**STEP_ARGS)
    def step_a(self, data: st.DataObject, how: str, form: str) -> None:
        self.step(data, how, form)

    @rule(**STEP_ARGS)
    def step_b(self, data: st.DataObject, how: str, form: str) -> None:
        self.step(data, how, form)

    @rule(**STEP_ARGS)
    def step_c(self, data: st.DataObject, how: str, form: str) -> None:
        self.step(data, how, form)

    @rule(data=st.data(), rounds=st.integers(1, 6))
    def decode(self, data: st.DataObject, rounds: int) -> None:
        """Committed steps over every active sequence: long histories, wrapped
        windows, full sequences and pools within a few rules."""
        for _ in range(rounds):
            entries: list[Entry] = []
            budget = self.model.max_step_tokens
            for seq in self.active():
                room = self.model.capacity - self.model.seqs[seq].length
                T = min(data.draw(st.integers(1, self.model.max_step)), room, budget)
                if T >= 1:
                    entries.append((seq, T, data.draw(st.lists(VOCABULARY, min_size=T, max_size=T))))
                    budget -= T
            if not entries:
                return
            self.do_step(entries, "step")

    @rule(data=st.data())
    def fork(self, data: st.DataObject) -> None:
        m = self.model
        src = self.some_active(data)
        free = [s for s in range(m.max_seqs) if s != src and m.seqs[s].length == 0]
        dst = self.any_seq(data)
        if free and data.draw(st.integers(0, 4)) != 0:
            dst = data.draw(st.sampled_from(free))
        L = m.seqs[src].length if 0 <= src < m.max_seqs else 0
        upto: int | None = data.draw(
            st.one_of(st.none(), st.integers(0, L), st.integers(max(0, L - m.max_step - 2), L), st.sampled_from([-1, L + 1]))
        )
        at = L if upto is None else upto
        errors = m.fork_errors(src, dst, at)
        if errors:
            event("fork refused: " + "/".join(sorted(errors)))
            self.refused(errors, lambda: self.cache.fork(src, dst, upto))
            return
        can = self.cache.can_rewind(src, at)
        assert can or not m.must_allow(src, at), f"fork({src}, {dst}, {at}) must be allowed"
        if not can:
            event("fork refused by the rewind rule")
            self.refused({"InvalidState"}, lambda: self.cache.fork(src, dst, upto))
            return
        self.cache.fork(src, dst, upto)
        m.fork(src, dst, at)
        self.prefix.fork(src, dst, at)
        self.ended()
        event("fork")
        # Usually one side writes next, into the block they may share (copy-on-write).
        sides = data.draw(st.sampled_from([[dst], [src], [src, dst], [dst, src], []]))
        entries: list[Entry] = []
        for seq in sides:
            T = min(data.draw(st.integers(1, m.max_step)), m.capacity - m.seqs[seq].length)
            if T >= 1 and sum(e[1] for e in entries) + T <= m.max_step_tokens:
                entries.append((seq, T, data.draw(st.one_of(st.none(), st.lists(VOCABULARY, min_size=T, max_size=T)))))
        if entries:
            self.do_step(entries, data.draw(st.sampled_from(["step", "none", "all", "copies"])))

    @rule(data=st.data(), kind=st.sampled_from(["head", "middle", "tail", "to end", "any"]))
    def remove(self, data: st.DataObject, kind: str) -> None:
        m = self.model
        seq = self.some_active(data)
        L = m.seqs[seq].length if 0 <= seq < m.max_seqs else 0
        p1: int | None
        if kind == "head":
            p0, p1 = 0, data.draw(st.integers(1, L - 1) if L >= 2 else st.integers(0, 1))
        elif kind == "middle" and L >= 3:
            p0 = data.draw(st.integers(1, L - 2))
            p1 = data.draw(st.integers(p0 + 1, L - 1))
        elif kind == "middle":
            p0, p1 = data.draw(st.integers(0, L)), data.draw(st.integers(0, L))
        elif kind == "tail":
            p0, p1 = data.draw(st.integers(max(0, L - m.max_step - 1), L + 1)), None
        elif kind == "to end":
            p0, p1 = data.draw(st.integers(0, L + 1)), data.draw(st.integers(L, L + 3))
        else:
            p0, p1 = data.draw(st.integers(-1, L + 1)), data.draw(st.integers(-1, L + 3))
        end = 2**31 - 1 if p1 is None else p1
        what, errors = m.remove_kind(seq, p0, end)

        def call() -> None:
            self.cache.remove(seq, p0, p1)

        if what == "error" or errors:
            if "OutOfResources" in errors:
                event("remove refused: max_holes")
            self.refused(errors, call)
            return
        if what == "truncate":
            can = self.cache.can_rewind(seq, p0)
            assert can or not m.must_allow(seq, p0), f"remove({seq}, {p0}, {p1}) truncates within the guarantee"
            if not can and p0 != 0:
                event("truncation refused by the rewind rule")
                self.refused({"InvalidState"}, call)
                return
            call()
            m.truncate(seq, p0)
            self.prefix.rewind(seq, p0)
        else:
            call()
            if what == "range":
                m.remove_range(seq, p0, end)
            self.prefix.remove(seq, p0, end)
        self.ended()

    @rule(data=st.data(), count=st.integers(2, 12), how=st.sampled_from(["by 1", "by C/2", "by C", "by C+1", "by C+2", "any"]))
    def speculate(self, data: st.DataObject, count: int, how: str) -> None:
        """Speculative decoding on one sequence: a run of steps long enough for
        its ring groups to release blocks, then a rewind of the rejected drafts
        (allowed up to max_step back from the peak, not always further)."""
        m = self.model
        active = self.active()
        if not active:
            return
        seq = data.draw(st.sampled_from(active))
        for _ in range(count):
            T = min(data.draw(st.integers(1, m.max_step)), m.capacity - m.seqs[seq].length, m.max_step_tokens)
            if T < 1:
                break
            tokens = data.draw(st.one_of(st.none(), st.lists(VOCABULARY, min_size=T, max_size=T)))
            self.do_step([(seq, T, tokens)], "step")
        self.rewind(data, how, seq)

    @rule(data=st.data(), how=st.sampled_from(["by 1", "by C/2", "by C", "by C+1", "by C+2", "to 0", "to sinks", "any"]))
    def rewind_rule(self, data: st.DataObject, how: str) -> None:
        self.rewind(data, how)

    def rewind(self, data: st.DataObject, how: str, seq: int | None = None) -> None:
        """rewind(seq, n) around the edge the contract sets (max_step back from the
        peak, the sinks), or anywhere, including outside [0, length]."""
        m = self.model
        seq = self.some_active(data) if seq is None else seq
        L = m.seqs[seq].length if 0 <= seq < m.max_seqs else 0
        C = m.max_step
        sinks = min([p.sinks for p in m.groups if p.is_ring] or [0])
        n = {
            "by 1": L - 1,
            "by C/2": L - max(1, C // 2),
            "by C": L - C,
            "by C+1": L - C - 1,
            "by C+2": L - C - 2,
            "to 0": 0,
            "to sinks": min(sinks, L),
        }.get(how)
        if n is None:
            n = data.draw(st.integers(-2, L + 2))
        n = max(n, -1) if how != "any" else n
        can = self.cache.can_rewind(seq, n)
        errors = m.rewind_errors(seq, n)
        if errors:
            assert not can
            self.refused(errors, lambda: self.cache.rewind(seq, n))
            return
        assert can or not m.must_allow(seq, n), f"rewind({seq}, {n}) at length {L} must be allowed"
        if not can:
            event("rewind refused by the rule")
            self.refused({"InvalidState"}, lambda: self.cache.rewind(seq, n))
            return
        self.cache.rewind(seq, n)
        m.truncate(seq, n)
        self.prefix.rewind(seq, n)
        self.ended()

    @rule(
        data=st.data(),
        fresh=st.integers(0, 9),
        container=st.sampled_from(["list", "tuple", "array"]),
        then=st.sampled_from(["step", "step", "nothing"]),
    )
    def adopt(self, data: st.DataObject, fresh: int, container: str, then: str) -> None:
        """A sequence (usually a fresh one) adopts the longest cached prefix of a
        prompt built from another sequence's tokens, then computes its rest."""
        m, c = self.model, self.cache
        seq = self.any_seq(data)
        if fresh < 7 and 0 <= seq < m.max_seqs and (not m.seqs[seq].active or m.seqs[seq].length):
            if m.seqs[seq].active:
                c.release_sequence(seq)
                m.release(seq)
            c.add_sequence(seq)
            m.add(seq)
            self.prefix.release(seq)
            self.ended()
        sources = [[t or 0 for t in m.seqs[s].tokens] for s in self.active()] + self.histories
        prompt = data.draw(st.sampled_from(sources)) if sources else []
        cut = data.draw(st.one_of(st.just(len(prompt)), st.integers(0, len(prompt))))
        prompt = prompt[:cut] + data.draw(st.lists(VOCABULARY, max_size=4))
        if data.draw(st.integers(0, 19)) == 0:
            prompt += [0] * (m.capacity + 1 - len(prompt))  # longer than any sequence
        tokens: Any = prompt if container == "list" else tuple(prompt) if container == "tuple" else np.asarray(prompt, np.int64)
        errors = m.adopt_errors(seq, len(prompt))
        if errors:
            self.refused(errors, lambda: c.adopt_prefix(seq, tokens))
            return
        hit = c.adopt_prefix(seq, tokens)
        assert type(hit) is int
        problems = m.adopt(seq, prompt, hit)
        assert not problems, problems
        assert hit == self.prefix.adopt(seq, prompt), f"hit {hit}: not the longest cached prefix"

        event("prefix hit" if hit else "prefix miss")
        self.ended()
        assert c.sequence(seq).length == hit
        if then == "step" and hit < len(prompt):
            T = min(m.max_step, len(prompt) - hit, m.max_step_tokens)
            self.do_step([(seq, T, prompt[hit : hit + T])], "step")

    @rule(now=st.integers(0, 9))
    def clear(self, now: int) -> None:
        """clear(), in one call of this rule in ten: an example keeps its history."""
        if now != 9:
            return
        self.cache.clear()
        self.model.clear()
        self.prefix.clear()
        self.ended()
        for g in range(self.cache.n_groups):
            assert self.cache.free_blocks(g) == self.cache.num_blocks(g) and self.cache.cached_blocks(g) == 0

    @rule(pick=st.integers(0, 2**16))
    def stale(self, pick: int) -> None:
        """Handles and plans of ended steps refuse everything and change nothing."""
        if not self.handles:
            return
        handle = self.handles[pick % len(self.handles)]
        plan = self.plans[pick % len(self.plans)]
        if handle.is_current:
            return
        self.refused({"InvalidState"}, handle.commit)
        self.refused({"InvalidState"}, lambda: self.cache.commit(handle))
        self.refused({"InvalidState"}, handle.plan)
        if self.open is None or plan is not self.plans[-1]:
            self.refused({"InvalidState"}, lambda: plan.seq_ids)
            self.refused({"InvalidState"}, lambda: plan.groups)
            self.refused({"InvalidState"}, lambda: plan.holes(0))
        with pytest.raises(kvcore.InvalidStateError):
            with handle:
                pass

    @rule(data=st.data(), value=st.sampled_from(EDGES))
    def bad_int(self, data: st.DataObject, value: int) -> None:
        """An integer beyond a C int anywhere: InvalidArgumentError naming the
        parameter, nothing changed; the predicate answers False."""
        c, x = self.cache, value
        calls: dict[str, tuple[str, Callable[[], object]]] = {
            "add_sequence": ("seq", lambda: c.add_sequence(x)),
            "release_sequence": ("seq", lambda: c.release_sequence(x)),
            "fork.src": ("src", lambda: c.fork(x, 0)),
            "fork.dst": ("dst", lambda: c.fork(0, x, 0)),
            "fork.upto": ("upto", lambda: c.fork(0, 1, x)),
            "remove.seq": ("seq", lambda: c.remove(x, 0)),
            "remove.p0": ("p0", lambda: c.remove(0, x)),
            "remove.p1": ("p1", lambda: c.remove(0, 0, x)),
            "rewind.seq": ("seq", lambda: c.rewind(x, 0)),
            "rewind.n": ("n", lambda: c.rewind(0, x)),
            "adopt_prefix.seq": ("seq", lambda: c.adopt_prefix(x, [])),
            "adopt_prefix.token": (r"adopt_prefix: tokens\[1\]", lambda: c.adopt_prefix(0, [1, x])),
            "begin_step.seq": ("seq", lambda: c.begin_step([(x, 1)])),
            "begin_step.T": ("T", lambda: c.begin_step([(0, x)])),
            "begin_step.token": ("token", lambda: c.begin_step([(0, 2, [0, x])])),
            "sequence": ("seq", lambda: c.sequence(x)),
            "blocks_held.seq": ("seq", lambda: c.blocks_held(x, 0)),
            "oldest_held.group": ("group", lambda: c.oldest_held(0, x)),
            "free_blocks": ("group", lambda: c.free_blocks(x)),
            "group_of": ("layer", lambda: c.group_of(x)),
            "visible.k": ("k", lambda: c.visible(0, 0, 0, x)),
        }
        name = data.draw(st.sampled_from(sorted(calls)))
        param, call = calls[name]
        before = self.snapshot()
        with pytest.raises(kvcore.InvalidArgumentError, match=f"^{param} = {x}: must fit in a 32-bit signed int"):
            call()
        assert self.snapshot() == before
        assert c.can_rewind(x, 0) is False and c.can_rewind(0, x) is False

    @rule(data=st.data())
    def probe(self, data: st.DataObject) -> None:
        """Queries by the rules: visible(group, seq, q, k), blocks and groups of bad indices."""
        m, c = self.model, self.cache
        g = data.draw(st.integers(-1, c.n_groups))
        seq = self.any_seq(data)
        q, k = data.draw(st.integers(-1, m.capacity + 1)), data.draw(st.integers(-1, m.capacity + 1))
        if not 0 <= g < c.n_groups or m.seq_error(seq) or q < 0 or k < 0:
            self.refused({"InvalidArgument"}, lambda: c.visible(g, seq, q, k))
        else:
            assert c.visible(g, seq, q, k) == m.visible(g, seq, q, k), (g, seq, q, k)
        if not 0 <= g < c.n_groups:
            by_group: list[Callable[[int], object]] = [c.free_blocks, c.cached_blocks, c.num_blocks, c.used_blocks, c.group_policy]
            by_group.append(lambda x: c.blocks_held(0, x))
            for call in by_group:
                self.refused({"InvalidArgument"}, lambda: call(g))
        if m.seq_error(seq):
            by_seq: list[Callable[[int], object]] = [c.sequence, c.length, lambda x: c.blocks_held(x, 0), lambda x: c.oldest_held(x, 0)]
            for query in by_seq:
                self.refused({"InvalidArgument"}, lambda: query(seq))
        layer = data.draw(st.sampled_from([-1, c.n_layers]))
        for lcall in (c.group_of, c.layer_config):
            self.refused({"InvalidArgument"}, lambda: lcall(layer))

    # --- after every rule ----------------------------------------------------------------------

    @invariant()
    def agrees_with_the_model(self) -> None:
        if not hasattr(self, "model"):
            return
        m, c = self.model, self.cache
        assert (self.open is not None) == (m.pending is not None)
        if self.open is not None:
            assert self.open.is_current
        for seq, s in enumerate(m.seqs):
            info = c.sequence(seq)
            assert (info.active, info.length) == (s.active, s.length), (seq, info)
            assert (info.visible_start, info.holes, info.visible_positions) == (s.visible_start, s.holes, s.visible_positions), (seq, info)
            assert c.length(seq) == s.length
            assert not c.can_rewind(seq, -1) and not c.can_rewind(seq, s.length + 1)
            if s.active:
                assert c.can_rewind(seq, 0) and c.can_rewind(seq, s.length)
                for n in range(max(0, s.peak - m.max_step), s.length):
                    assert c.can_rewind(seq, n) or not m.must_allow(seq, n), f"can_rewind({seq}, {n}) at {s.length}, peak {s.peak}"
        if self.open is None:
            self.at_rest()

    def at_rest(self) -> None:
        """The block tables against the counters and section 6's memory rules."""
        m, c = self.model, self.cache
        B = m.B
        blocks: set[int] = set()  # held by any group: they draw from one pool
        for g, policy in enumerate(m.groups):
            table = self.tables[g]
            for seq, s in enumerate(m.seqs):
                row = table[seq]
                held = np.flatnonzero(row >= 0)
                assert c.blocks_held(seq, g) == held.size, (seq, g, row.tolist())
                if not s.active:
                    assert held.size == 0, (seq, g, row.tolist())
                    continue
                blocks.update(row[held].tolist())
                # No block without a position the sequence still sees (below its length).
                for i in held.tolist():
                    assert any(not s.removed[p] for p in range(i * B, min((i + 1) * B, s.length))), (
                        f"seq {seq} group {g} holds block index {i} for no visible position: {row.tolist()}"
                    )
                # Flat: every visible position; ring: what the rewind guarantee needs.
                kept_from = policy.kept_from(s.peak, m.max_rewind)
                for p in range(s.length):
                    if s.removed[p] or (policy.evicts and not (p < policy.sinks or p >= kept_from)):
                        continue
                    assert row[p // B] >= 0, f"seq {seq} group {g}: position {p} (visible) has no block: {row.tolist()}"
                if policy.evicts:
                    assert held.size <= m.ring_bound(g), (seq, g, held.size, m.ring_bound(g))
                start = s.visible_start
                oldest = next((p for p in range(start, s.length) if row[p // B] >= 0), s.length)
                assert c.oldest_held(seq, g) == oldest, (seq, g, c.oldest_held(seq, g), oldest)
            assert 0 <= c.cached_blocks(g) <= c.free_blocks(g)
            assert c.cached_blocks(g) == self.prefix.cached_blocks(g), g
            for seq in range(m.max_seqs):
                assert c.blocks_held(seq, g) == self.prefix.blocks_held(seq, g), (seq, g)
        for g in range(c.n_groups):
            assert c.free_blocks(g) == c.num_blocks(g) - len(blocks) == self.prefix.free_blocks(), (g, c.free_blocks(g), len(blocks))
            assert c.used_blocks(g) == (max(blocks) + 1 if blocks else 0)
        assert sum(c.held_blocks(g) for g in range(c.n_groups)) == len(blocks)


BatchMachine.TestCase.settings = SETTINGS
TestBatchMachine = BatchMachine.TestCase


# --- plain tests -----------------------------------------------------------------------------


def small_cache(max_seqs: int = 3) -> kvcore.BatchCache:
    """Ring(window=3, sinks=1) and Flat layers, B = 2, capacity 16, max_step 4."""
    layers = [kvcore.LayerConfig(kvcore.Ring(3, 1), 1, 2), kvcore.LayerConfig(kvcore.Flat(), 1, 2)]
    limits = kvcore.BatchLimits(block_size=2, max_seqs=max_seqs, num_blocks=12)
    return kvcore.BatchCache(kvcore.CacheConfig(16, layers, max_step=4, batch=limits))


def begun() -> tuple[kvcore.BatchCache, kvcore.BatchStep]:
    cache = small_cache()
    cache.add_sequence(0)
    cache.add_sequence(2)
    cache.step([(0, 3, [5, 6, 7])]).commit()
    cache.fork(0, 1)
    return cache, cache.begin_step([(1, 2, [8, 9]), (2, 1)])


def plan_arrays(plan: kvcore.BatchStepPlan) -> dict[str, Any]:
    out: dict[str, Any] = {name: getattr(plan, name) for name in ("seq_ids", "query_starts", "first_positions", "context_lens", "visible_starts")}
    for g, group in enumerate(plan.groups):
        out.update({f"slots{g}": group.slots, f"copies{g}": group.copies, f"block_tables{g}": group.block_tables})
    return out


def test_plan_arrays_are_read_only_int32_views_of_the_cache_that_keep_it_alive() -> None:
    cache, step = begun()
    plan = step.plan()
    arrays = plan_arrays(plan)
    assert plan.seq_ids.tolist() == [1, 2] and plan.query_starts.tolist() == [0, 2, 3]
    assert plan.first_positions.tolist() == [3, 0] and plan.context_lens.tolist() == [5, 1]
    for name, a in arrays.items():
        assert a.dtype == np.int32, name
        assert not a.flags.writeable and not a.flags.owndata, name
        with pytest.raises(ValueError, match="read-only"):
            a[...] = 0
        with pytest.raises(ValueError):
            a.flags.writeable = True  # the cache's memory cannot be unlocked
    # The same memory each time: a second view shares it with the first.
    for name, again in plan_arrays(step.plan()).items():
        assert np.shares_memory(again, arrays[name]) and (again == arrays[name]).all(), name
    # A block table row is the cache's own: a later step shows there.
    tables = arrays["block_tables1"]
    assert tables.shape == (cache.max_seqs, cache.table_stride)
    row0 = tables[0].copy()
    step.commit()
    cache.step([(0, 2)]).commit()  # seq 0 now holds a block for positions 4, 5
    assert (tables[0, :3] >= 0).all() and not (tables[0] == row0).all()
    # Views keep the cache alive.
    alive = weakref.ref(cache)
    del cache, step, plan
    gc.collect()
    assert alive() is not None
    expected = {name: a.copy() for name, a in arrays.items()}
    churn = [np.full(1 << 12, 3, np.int32) for _ in range(64)]  # would reuse freed memory
    for name, a in arrays.items():
        np.testing.assert_array_equal(a, expected[name])
    del arrays, tables, churn, expected, a, again  # every view (loop variables too)
    gc.collect()
    assert alive() is None  # the last view gone, the cache goes


def test_a_plan_after_its_step_ended_raises_invalid_state() -> None:
    for end in ("commit", "replace", "rewind", "clear", "release", "remove"):
        cache, step = begun()
        plan = step.plan()
        group = plan.groups[0]
        ends: dict[str, Callable[[], object]] = {
            "commit": step.commit,
            "replace": lambda: cache.begin_step([(0, 1)]),
            "rewind": lambda: cache.rewind(0, 3),
            "clear": cache.clear,
            "release": lambda: cache.release_sequence(2),
            "remove": lambda: cache.remove(0, 3),  # nothing to remove, but a verb all the same
        }
        ends[end]()
        assert not step.is_current
        for read in (
            lambda: plan.seq_ids,
            lambda: plan.query_starts,
            lambda: plan.first_positions,
            lambda: plan.context_lens,
            lambda: plan.visible_starts,
            lambda: plan.positions,
            lambda: plan.groups,
            lambda: plan.n_entries,
            lambda: plan.n_tokens,
            lambda: plan.holes(0),
            lambda: group.slots,
            lambda: group.copies,
            lambda: group.block_tables,
            step.plan,
            step.commit,
        ):
            with pytest.raises(kvcore.InvalidStateError):
                read()
        assert "stale: its step ended" in repr(plan) and "stale: its step ended" in repr(group)


def test_batch_step_as_a_context_manager_commits_on_normal_exit_only() -> None:
    cache = small_cache()
    cache.add_sequence(0)
    with cache.step([(0, 2)]) as step:
        assert step.is_current and cache.length(0) == 0
    assert not step.is_current and cache.length(0) == 2
    with pytest.raises(KeyError, match="boom"):
        with cache.step([(0, 3)]) as step:
            raise KeyError("boom")
    assert step.is_current and cache.length(0) == 2  # left begun: the caller may retry or commit
    step.commit()
    assert cache.length(0) == 5
    # __exit__ of an ended step raises, rather than committing something else.
    stale = cache.begin_step([(0, 1)])
    cache.rewind(0, 5)
    with pytest.raises(kvcore.InvalidStateError):
        with stale:
            pass
    assert cache.length(0) == 5


def test_positions_are_each_new_tokens_position_in_a_read_only_view() -> None:
    cache, step = begun()
    plan = step.plan()
    positions = plan.positions
    assert positions.dtype == np.int32 and positions.tolist() == [3, 4, 0]
    # Zero-copy: a view of the cache's plan buffer, which the caller cannot change.
    assert not positions.flags.owndata and not positions.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        positions[0] = 99
    assert plan.positions.tolist() == [3, 4, 0]
    assert plan.holes(0) == [] and plan.holes(1) == []
    with pytest.raises(kvcore.InvalidArgumentError, match=r"entry = 2: must be >= 0 and < n_entries = 2"):
        plan.holes(2)


def test_every_class_has_a_readable_repr() -> None:
    cache, step = begun()
    plan = step.plan()
    cache2 = small_cache()
    cache2.add_sequence(0)
    cache2.step([(0, 4)]).commit()
    cache2.remove(0, 1, 2)
    assert repr(cache) == "BatchCache(max_seqs=3, n_groups=2, block_size=2, capacity=16)"
    assert repr(kvcore.BatchLimits()) == "BatchLimits(block_size=16, max_seqs=64, max_step_tokens=0, num_blocks=0, max_holes=8)"
    assert repr(kvcore.BatchLimits(block_size=2, max_seqs=3, max_step_tokens=5, num_blocks=12, max_holes=1)) == (
        "BatchLimits(block_size=2, max_seqs=3, max_step_tokens=5, num_blocks=12, max_holes=1)"
    )
    assert repr(cache_config()).endswith(
        "batch=BatchLimits(block_size=2, max_seqs=3, max_step_tokens=0, num_blocks=12, max_holes=8))"
    )
    assert repr(step) == "BatchStep(n_entries=2, n_tokens=3)"
    assert repr(plan) == "BatchStepPlan(n_entries=2, n_tokens=3, n_groups=2)"
    assert repr(plan.groups[0]) == "GroupPlan(group=0, n_tokens=3, n_copies=1)"
    assert repr(plan.groups[1]) == "GroupPlan(group=1, n_tokens=3, n_copies=1)"
    assert repr(cache.sequence(1)) == "SequenceInfo(active=True, length=3, visible_start=0, holes=[])"
    assert repr(cache2.sequence(0)) == "SequenceInfo(active=True, length=4, visible_start=0, holes=[(1, 2)])"
    assert repr(cache2.sequence(2)) == "SequenceInfo(active=False, length=0, visible_start=0, holes=[])"


def cache_config() -> kvcore.CacheConfig:
    layers = [kvcore.LayerConfig(kvcore.Ring(3, 1), 1, 2), kvcore.LayerConfig(kvcore.Flat(), 1, 2)]
    return kvcore.CacheConfig(16, layers, max_step=4, batch=kvcore.BatchLimits(block_size=2, max_seqs=3, num_blocks=12))


VERBS = [
    "add_sequence", "release_sequence", "fork", "remove", "rewind", "can_rewind", "adopt_prefix",
    "begin_step", "step", "commit", "clear", "sequence", "length", "free_blocks", "cached_blocks",
    "blocks_held", "oldest_held", "group_of", "group_policy", "layer_config", "num_blocks",
    "used_blocks", "visible", "max_seqs", "capacity", "max_step", "max_step_tokens", "n_groups",
    "block_size", "table_stride",
]  # fmt: skip


def test_help_documents_every_verb() -> None:
    text = pydoc.plain(pydoc.render_doc(kvcore.BatchCache))
    for verb in VERBS:
        assert f"{verb}" in text, verb
        assert getattr(kvcore.BatchCache, verb).__doc__, f"{verb} has no docstring"
    for cls, names in (
        (kvcore.BatchStep, ["plan", "commit", "is_current", "n_entries", "n_tokens"]),
        (kvcore.BatchStepPlan, ["seq_ids", "query_starts", "first_positions", "context_lens", "visible_starts", "holes", "positions", "groups"]),
        (kvcore.BatchLimits, ["block_size", "max_seqs", "max_step_tokens", "num_blocks", "max_holes"]),
        (kvcore.SequenceInfo, ["active", "length", "visible_start", "holes", "visible_positions"]),
        (kvcore._core.GroupPlan, ["slots", "copies", "block_tables"]),
    ):
        assert cls.__doc__, cls
        for name in names:
            assert getattr(cls, name).__doc__, f"{cls.__name__}.{name} has no docstring"


def test_a_prompt_one_sequence_computed_is_adopted_whole_until_clear() -> None:
    """Prefix reuse where nothing forbids it: a sequence adopts every full block
    of a prompt another one computed (held, or cached after its release), and
    its rows hold what computing the prompt itself would have (the model's
    tags); after clear() nothing is adopted."""
    layers = [kvcore.LayerConfig(kvcore.Ring(4, 1), 1, 2), kvcore.LayerConfig(kvcore.Flat(), 1, 2)]
    cache = kvcore.BatchCache(kvcore.CacheConfig(32, layers, max_step=4, batch=kvcore.BatchLimits(block_size=2, max_seqs=3)))
    model = BatchModel(32, 4, [Policy(4, 1), Policy()], 2, 3, cache.max_step_tokens, 8)
    pools = Pools([cache.num_blocks(g) * 2 for g in range(2)], 2)
    blocks = [cache.num_blocks(g) for g in range(2)]

    def run(entries: list[Entry]) -> None:
        step = cache.begin_step(entries)
        tags = model.begin(entries)
        plan = step_plan(step.plan())
        pools.apply(plan, tags)
        check_step(model, plan, pools, tags, blocks)
        step.commit()
        model.commit()

    prompt = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]
    cache.add_sequence(0)
    model.add(0)
    for at in range(0, len(prompt), 4):
        run([(0, len(prompt[at : at + 4]), prompt[at : at + 4])])
    for seq, then in ((1, "release 0"), (2, "clear")):  # seq 2: from cached blocks alone
        cache.add_sequence(seq)
        model.add(seq)
        hit = cache.adopt_prefix(seq, prompt + [7])
        assert hit == 10 and not model.adopt(seq, prompt + [7], hit)
        run([(seq, 2, [5, 7])])  # reads the adopted rows: they hold the prompt's K/V
        if then == "release 0":
            for done in (0, 1):
                cache.release_sequence(done)
                model.release(done)
            assert cache.cached_blocks(1) >= 5  # the flat group keeps the prompt's full blocks, unowned
    cache.clear()
    cache.add_sequence(0)
    assert cache.adopt_prefix(0, prompt + [7]) == 0
