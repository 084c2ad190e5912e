"""kvcore against the brute-force reference (reference.py) on seeded random
configs and operation sequences: mixed policies, sinks, T from 1 to max_step,
rewinds inside and outside the allowed range, aborted steps and retries, clears,
capacity exhaustion and invalid calls.

After every operation: the length, the begun step and can_rewind(n) for every n
in [0, length] agree with the reference; every plan is checked row by row against
the reference pools. Reproduce one case with `run_case(seed)`; set
KVCORE_REFERENCE_CASES to run more than the default 2,000.
"""

from __future__ import annotations

import collections
import os
import random
from typing import Any

import pytest

import kvcore
import reference
from conftest import layer
from reference import Policy, observe

N_CASES = int(os.environ.get("KVCORE_REFERENCE_CASES", "2000"))
N_BLOCKS = 20
ERRORS = {
    "InvalidArgument": kvcore.InvalidArgumentError,
    "InvalidState": kvcore.InvalidStateError,
    "OutOfResources": kvcore.CapacityError,
}


def random_policy(rng: random.Random) -> kvcore.LayerPolicy:
    if rng.random() < 0.25:
        return kvcore.Flat()
    return kvcore.Ring(window=rng.randint(1, 10), sinks=0 if rng.random() < 0.5 else rng.randint(1, 4))


def random_config(rng: random.Random) -> kvcore.CacheConfig:
    capacity = rng.randint(1, 12) if rng.random() < 0.2 else rng.randint(8, 48)
    max_step = None if rng.random() < 0.1 else rng.randint(1, min(capacity, 6))
    n_layers = rng.randint(1, 4)
    if rng.random() < 0.2:  # one entry, broadcast
        return kvcore.CacheConfig(capacity, layer(random_policy(rng)), n_layers=n_layers, max_step=max_step)
    policies: list[kvcore.LayerPolicy] = []
    for _ in range(n_layers):  # sometimes repeat a policy: it must share one object
        policies.append(rng.choice(policies) if policies and rng.random() < 0.3 else random_policy(rng))
    return kvcore.CacheConfig(capacity, [layer(p) for p in policies], max_step=max_step)


class Case:
    """One random config and operation sequence, kvcore and reference in step."""

    def __init__(self, seed: int):
        self.rng = random.Random(seed)
        self.cache = kvcore.SequenceCache(random_config(self.rng))
        self.C = self.cache.max_step
        policies = [self.cache.layer_policy(l) for l in range(self.cache.n_layers)]
        self.ref = reference.Cache(self.cache.capacity, [Policy(p.window, p.sinks) for p in policies], self.C)
        self.handles: dict[int, kvcore.Step] = {}  # reference step id -> kvcore Step
        self.events: collections.Counter[str] = collections.Counter()
        self.log: list[str] = []

    # --- checks -------------------------------------------------------------------

    def check_static(self) -> None:
        cache, ref = self.cache, self.ref
        assert cache.n_groups == ref.n_groups
        for l, ref_layer in enumerate(ref.layers):
            assert cache.rows(l) == ref_layer.rows
            if ref_layer.ring:
                self.events["ring wraps"] += 1
        for _ in range(20):
            l, q, k = self.rng.randrange(cache.n_layers), self.rng.randrange(60), self.rng.randrange(60)
            assert cache.visible(l, q, k) == ref.policies[l].visible(q, k)

    def check_state(self) -> None:
        cache, ref = self.cache, self.ref
        assert cache.length == ref.length
        active = cache.active_step
        if ref.active is None:
            assert active is None
        else:
            assert active is not None and (active.position, active.T) == ref.active[1:]
        for step_id, handle in self.handles.items():
            assert handle.is_current == (ref.active is not None and ref.active[0] == step_id)
        expected = ref.can_rewind_all()
        wrong = [n for n in range(ref.length + 1) if cache.can_rewind(n) != expected[n]]
        assert not wrong, f"can_rewind(n) wrong for n in {wrong} at length {ref.length}"

    def check_plans(self) -> None:
        assert self.ref.active is not None
        step_id, position, T = self.ref.active
        step = self.handles[step_id]
        for l in range(self.cache.n_layers):
            plan = step.plan(l)
            assert plan == self.cache.plan(l, position, T)
            self.ref.check_plan(l, plan.write, plan.read)
            self.events[f"write runs {len(plan.write)}"] += 1
            self.events[f"read runs {len(plan.read)}"] += 1

    def expect_error(self, name: str, call: Any) -> None:
        """`call` must raise the error `name` and change nothing."""
        handles = list(self.handles.values())
        before = observe(self.cache, *handles)
        with pytest.raises(ERRORS[name]):
            call()
        assert observe(self.cache, *handles) == before
        self.events[f"refused {name}"] += 1

    # --- operations ---------------------------------------------------------------

    def op_begin(self) -> None:
        rng, L = self.rng, self.ref.length
        roll = rng.random()
        if roll < 0.8:
            T = rng.randint(1, self.C)
        elif roll < 0.9:
            T = rng.choice([0, -1, self.C + 1])
        else:
            T = self.cache.capacity - L + rng.randint(1, 2)  # past capacity
        retry = self.ref.active is not None
        self.log.append(f"begin({T})")
        expected = self.ref.begin_step(T)
        if expected is not None:
            self.expect_error(expected, lambda: self.cache.begin_step(T))
            return
        assert self.ref.active is not None
        self.handles[self.ref.active[0]] = self.cache.begin_step(T)
        self.events["retry" if retry else "begin"] += 1
        self.check_plans()
        if rng.random() < 0.65:
            self.op_commit()

    def op_commit(self) -> None:
        if self.ref.active is None:
            return
        step_id = self.ref.active[0]
        self.log.append("commit")
        assert self.ref.commit(step_id) is None
        self.handles[step_id].commit()

    def op_commit_stale(self) -> None:
        stale = [i for i in self.handles if self.ref.active is None or i != self.ref.active[0]]
        if not stale:
            return
        step_id = self.rng.choice(stale)
        self.log.append(f"commit stale #{step_id}")
        assert self.ref.commit(step_id) == "InvalidState"
        self.expect_error("InvalidState", self.handles[step_id].commit)

    def op_rewind(self) -> None:
        rng, L = self.rng, self.ref.length
        roll = rng.random()
        if roll < 0.5:
            n = rng.randint(max(0, L - self.C - 2), L)
        elif roll < 0.8:
            n = rng.randint(0, L)
        else:
            n = rng.choice([-1, -2, L + 1, L + 3])
        self.log.append(f"rewind({n})")
        can = self.ref.can_rewind(n)
        assert self.cache.can_rewind(n) == can
        expected = self.ref.rewind(n)
        assert (expected is None) == can
        if expected is not None:
            self.expect_error(expected, lambda: self.cache.rewind(n))
            return
        self.cache.rewind(n)
        self.events["rewind"] += 1

    def op_clear(self) -> None:
        self.log.append("clear")
        self.ref.clear()
        self.cache.clear()

    def op_bad_plan(self) -> None:
        rng = self.rng
        if self.ref.active is None:
            self.log.append("plan without step")
            self.expect_error("InvalidState", lambda: self.cache.plan(0, self.ref.length, 1))
            return
        _, position, T = self.ref.active
        layer_index = rng.randrange(self.cache.n_layers)
        kind = rng.choice(["position", "T", "layer"])
        self.log.append(f"bad plan ({kind})")
        if kind == "position":
            self.expect_error("InvalidState", lambda: self.cache.plan(layer_index, position + rng.choice([-1, 1]), T))
        elif kind == "T":
            self.expect_error("InvalidState", lambda: self.cache.plan(layer_index, position, T + 1))
        else:
            bad = rng.choice([-1, self.cache.n_layers])
            self.expect_error("InvalidArgument", lambda: self.cache.plan(bad, position, T))

    def op_with(self) -> None:
        T = self.rng.randint(1, self.C)
        if self.ref.begin_step(T) is not None:
            return  # begin() covers the refusals
        assert self.ref.active is not None
        step_id = self.ref.active[0]
        fail = self.rng.random() < 0.3
        self.log.append(f"with step({T}){' raising' if fail else ''}")
        try:
            with self.cache.step(T) as step:
                self.handles[step_id] = step
                self.check_plans()
                if fail:
                    raise KeyboardInterrupt  # any exception: the step stays begun
        except KeyboardInterrupt:
            self.events["with raised"] += 1
        else:
            assert self.ref.commit(step_id) is None

    def run(self, n_ops: int) -> None:
        self.check_static()
        ops = [self.op_begin, self.op_commit, self.op_commit_stale, self.op_rewind, self.op_clear,
               self.op_bad_plan, self.op_with]
        weights = [50, 8, 4, 16, 2, 4, 6]
        for op in self.rng.choices(ops, weights, k=n_ops):
            op()
            self.check_state()


def run_case(seed: int) -> collections.Counter[str]:
    case = Case(seed)
    try:
        case.run(n_ops=case.rng.randint(10, 40))
    except AssertionError as e:
        raise AssertionError(f"seed {seed}, {case.cache.config!r}, ops {case.log}: {e}") from e
    return case.events


@pytest.mark.parametrize("block", range(N_BLOCKS))
def test_random_configs_and_operations_agree_with_the_reference(block: int) -> None:
    events: collections.Counter[str] = collections.Counter()
    for seed in range(block, N_CASES, N_BLOCKS):
        events += run_case(seed)
    # Each block must reach the interesting cases, or it proves little.
    for event in ("ring wraps", "retry", "rewind", "refused InvalidState", "refused OutOfResources",
                  "refused InvalidArgument", "write runs 2", "read runs 3", "with raised"):
        assert events[event] > 0, f"block {block} never saw {event!r}: {dict(events)}"


def test_reference_needed_set_formula_matches_visibility() -> None:
    # The reference's needed() is DESIGN's formula; check it against the definition
    # (every key visible to some query of the step) so the two cannot drift apart.
    for window in range(0, 7):
        for sinks in range(0, 4) if window else [0]:
            policy = Policy(window, sinks)
            for position in range(0, 14):
                for T in range(1, 5):
                    assert policy.needed(position, T) == policy.needed_by_visibility(position, T), (policy, position, T)


def test_reference_can_rewind_all_matches_can_rewind() -> None:
    for seed in range(50):
        case = Case(seed)
        case.run(n_ops=25)
        assert case.ref.can_rewind_all() == [case.ref.can_rewind(n) for n in range(case.ref.length + 1)]
