"""A hypothesis state machine drives a SequenceCache and a KVPool through random
configs and operation sequences against the brute-force reference
(reference.py): begin/plan/write/commit, abandoned and partly written steps,
stale handles and plans, rewinds inside and outside the allowed range, clears,
capacity exhaustion and invalid arguments. Every plan is judged by the
reference's simulated pools, every row the pool returns must hold the data last
written for the position it claims, and every refused call must raise the class
the reference names and change nothing.

Profiles (HYPOTHESIS_PROFILE; CI sets ci, see docs/robustness.md):
  dev   (default) 300 examples of up to 10 rules, derandomized: a quick check;
  ci    10,000 examples of up to 10 rules, derandomized (a fixed seed): what
        scripts/test.sh runs;
  long  200,000 examples of up to 50 rules, random seeds, failures saved in
        .hypothesis/ and replayed first next time.
A failure shrinks to a short list of operations; fix it at the root and keep
the reproducer as a plain test under tests/python/regressions/.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import HealthCheck
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

import kvcore
import reference
from hypothesis_profiles import profile_settings
from reference import observe

Array = npt.NDArray[Any]

# Each example is a fresh config plus up to stateful_step_count rules; `advance`
# and `speculate` commit up to 8 and 16 steps in one rule, so 10 rules reach wrapped
# rings, full caches and rewinds at the edge.
PROFILES: dict[str, dict[str, Any]] = {
    "dev": {"max_examples": 300, "stateful_step_count": 10, "derandomize": True, "database": None},
    "ci": {"max_examples": 10_000, "stateful_step_count": 10, "derandomize": True, "database": None},
    "long": {"max_examples": 200_000, "stateful_step_count": 50},
}
SETTINGS = profile_settings(PROFILES, HealthCheck.filter_too_much)

ERROR_CLASS: dict[str, type[kvcore.KVCacheError]] = {
    "InvalidArgument": kvcore.InvalidArgumentError,
    "OutOfResources": kvcore.CapacityError,
    "InvalidState": kvcore.InvalidStateError,
}

# Integers a caller may pass anywhere: the edges of C int, int64 and beyond.
EDGES = [-(2**63), -(2**31) - 1, -(2**31), -1, 2**31 - 1, 2**31, 2**63 - 1, 2**63, 2**70]
DTYPES = [np.float32, np.float16]  # the tags below are exact in both


def sometimes(strategy: st.SearchStrategy[int]) -> st.SearchStrategy[int | None]:
    """None four times in five, else a value of `strategy`."""
    return st.one_of(st.none(), st.none(), st.none(), st.none(), strategy)


@st.composite
def cache_configs(draw: st.DrawFn) -> tuple[kvcore.CacheConfig, list[reference.Policy], int | None]:
    # Mostly capacities and steps that let ring layers wrap within a few rules.
    capacity = draw(st.one_of(st.integers(1, 8), st.integers(12, 32), st.integers(12, 32)))
    step = st.integers(1, min(capacity, 4))
    max_step = draw(st.one_of(st.none(), step, step, step))
    n_layers = draw(st.integers(1, 4))
    ring = st.builds(reference.Policy, window=st.integers(1, 8), sinks=st.integers(0, 3))
    flat = st.just(reference.Policy())
    chunked = st.builds(reference.Policy, chunk=st.integers(1, 8))  # section 9
    policy = st.one_of(ring, ring, flat, chunked)
    broadcast = draw(st.booleans()) and draw(st.booleans())
    policies = [draw(policy)] * n_layers if broadcast else [draw(policy) for _ in range(n_layers)]
    shapes = [(draw(st.integers(1, 2)), draw(st.integers(1, 3)), draw(st.integers(0, 3))) for _ in policies]
    def layer_policy(p: reference.Policy) -> kvcore.LayerPolicy:
        if p.is_chunked:
            return kvcore.Chunked(p.chunk)
        return kvcore.Ring(p.window, p.sinks) if p.is_ring else kvcore.Flat()

    layers = [kvcore.LayerConfig(layer_policy(p), h, d, v) for p, (h, d, v) in zip(policies, shapes)]
    cfg = kvcore.CacheConfig(
        capacity,
        layers[:1] if broadcast else layers,
        n_layers=n_layers,
        max_step=max_step,
        initial_capacity=draw(st.integers(1, 8)),
    )
    return cfg, policies, max_step


class CacheMachine(RuleBasedStateMachine):
    """The cache under test, its pool, and the reference they must agree with.

    Every rule is always enabled (no preconditions, no bundles): hypothesis
    then never has to redraw a rule, which keeps 10,000 examples fast."""

    def __init__(self) -> None:
        super().__init__()
        self.cache: kvcore.SequenceCache
        self.pool: kvcore.KVPool
        self.ref: reference.Cache
        self.step: kvcore.Step | None = None  # the begun step
        self.ref_id = 0  # the reference's id of the begun step
        self.written: set[int] = set()  # layers whose rows of the begun step are in the pool
        self.handles: list[kvcore.Step] = []  # every step begun; all but the begun one are stale

    @initialize(config=cache_configs(), dtype=st.sampled_from(DTYPES))
    def create(self, config: tuple[kvcore.CacheConfig, list[reference.Policy], int | None], dtype: Any) -> None:
        cfg, policies, max_step = config
        self.cache = kvcore.SequenceCache(cfg)
        self.pool = kvcore.KVPool(self.cache, dtype)
        self.ref = reference.Cache(cfg.capacity, policies, max_step)
        assert self.cache.max_step == self.ref.max_step
        assert self.cache.n_groups == self.ref.n_groups
        assert [self.cache.rows(l) for l in range(cfg.n_layers)] == [layer.rows for layer in self.ref.layers]

    # --- helpers ------------------------------------------------------------------

    def refused(self, expected: str, call: Any) -> None:
        """`call` must raise the class of `expected`, with a message, and change nothing."""
        before = observe(self.cache)
        with pytest.raises(ERROR_CLASS[expected]) as info:
            call()
        assert str(info.value), "an error without a message"
        assert observe(self.cache) == before

    def rows(self, layer: int, positions: list[int], value: bool) -> Array:
        """The rows the pool must hold for `positions`: every element is the
        reference's version of the position (a fresh number per write), negated
        for V. Exact in float16 below 2048."""
        cfg = self.cache.config.layers[layer]
        dim = cfg.value_dim if value else cfg.head_dim
        tags = np.array([self.ref.version(p) % 2048 for p in positions], dtype=np.float64)
        out = np.broadcast_to(tags[:, None, None], (len(positions), cfg.n_kv_heads, dim))
        return np.ascontiguousarray(-out if value else out, dtype=self.pool.dtype)

    def write_layer(self, layer: int, split: bool) -> None:
        """Writes the begun step's rows of `layer`, then reads the plan back:
        through update() in one call, or write() then read()."""
        assert self.step is not None and self.ref.active is not None
        _, position, T = self.ref.active
        new = list(range(position, position + T))
        k, v = self.rows(layer, new, False), self.rows(layer, new, True)
        plan = self.step.plan(layer)
        if split:
            self.pool.write(layer, plan, k, v)
            got_k, got_v, positions = self.pool.read(layer, plan, order="positions")
        else:
            got_k, got_v, positions = self.pool.update(layer, self.step, k, v, order="positions")
        self.written.add(layer)
        wanted = [p for _, p in reference.expand(plan.read)]
        assert positions.tolist() == wanted == self.ref.policies[layer].needed(position, T)
        np.testing.assert_array_equal(got_k, self.rows(layer, wanted, False))
        np.testing.assert_array_equal(got_v, self.rows(layer, wanted, True))

    # --- rules -----------------------------------------------------------------------

    @rule(
        size=st.integers(1, 6),
        bad=sometimes(st.one_of(st.integers(-1, 8), st.sampled_from(EDGES))),
        write=st.sampled_from(["all", "some", "none"]),
        split=st.booleans(),
        commit=st.sampled_from(["step", "cache", "with", None]),
        verify=st.booleans(),
    )
    def begin(self, size: int, bad: int | None, write: str, split: bool, commit: str | None, verify: bool = False) -> None:
        """begin_step(T); writes all, some or none of its layers; and commits it
        right away (three times in four), or leaves it begun for later rules to
        commit, retry, rewind or clear. T is `bad` when given, else a legal size
        (which may still exceed the capacity left). A verify step (section 9)
        plans K/V layers exactly as any other step."""
        T = 1 + (size - 1) % self.ref.max_step if bad is None else bad
        expected = self.ref.begin_step(T)
        if expected is not None:
            self.refused(expected, lambda: self.cache.begin_step(T, verify=verify))
            return
        self.step = self.cache.begin_step(T, verify=verify)
        assert self.step.verify == verify
        self.handles.append(self.step)
        assert self.ref.active is not None
        self.ref_id, position, _ = self.ref.active
        assert (self.step.position, self.step.T, self.step.end) == (position, T, position + T)
        for layer in range(self.cache.n_layers):
            plan = self.step.plan(layer)
            assert plan == self.cache.plan(layer, position, T) == self.step.plan(layer)  # pure
            self.ref.check_plan(layer, plan.write, plan.read)
        self.written = set()
        # The backend may write any time after begin_step, and an abandoned
        # step may never be written.
        n = {"all": self.cache.n_layers, "some": self.cache.n_layers // 2, "none": 0}[write]
        for layer in range(n):
            self.write_layer(layer, split)
        if commit is not None:
            self.commit(split, commit)

    @rule(count=st.integers(1, 8), size=st.integers(1, 6), split=st.booleans())
    def advance(self, count: int, size: int, split: bool) -> None:
        """Up to `count` checked steps of `size` tokens (at most max_step),
        written and committed: long sequences, wrapped rings and full caches
        within a few rules."""
        T = min(size, self.ref.max_step)
        for _ in range(count):
            if self.ref.length + T > self.ref.capacity:
                break
            self.begin(T, None, "all", split, "step")

    @rule(
        count=st.integers(4, 16),
        size=st.integers(1, 6),
        how=st.sampled_from(["by 1", "by C/2", "by C", "by C+1", "to 0", "by back"]),
        back=st.integers(0, 8),
    )
    def speculate(self, count: int, size: int, how: str, back: int) -> None:
        """Speculative decoding: a run of steps long enough to wrap the rings,
        then a rewind of the rejected drafts (allowed up to max_step after a wrap)."""
        self.advance(count, size, True)
        self.rewind(how, back, None)

    @rule(split=st.booleans(), how=st.sampled_from(["step", "cache", "with"]))
    def commit(self, split: bool, how: str) -> None:
        """Writes the layers the begun step has not written yet, then commits it."""
        if self.step is None:
            return
        for layer in range(self.cache.n_layers):
            if layer not in self.written:
                self.write_layer(layer, split)
        assert self.ref.commit(self.ref_id) is None
        if how == "step":
            self.step.commit()
        elif how == "cache":
            self.cache.commit(self.step)
        else:
            with self.step:
                pass
        assert not self.step.is_current
        self.step = None

    @rule(pick=st.integers(0, 2**16))
    def stale(self, pick: int) -> None:
        """A step that is no longer the begun one commits, plans and writes nothing."""
        if not self.handles:
            return
        handle = self.handles[pick % len(self.handles)]
        if handle.is_current:
            return
        self.refused("InvalidState", handle.commit)
        self.refused("InvalidState", lambda: self.cache.commit(handle))
        self.refused("InvalidState", lambda: handle.plan(0))
        self.refused("InvalidState", lambda: handle.mask(0, order="positions"))
        cfg = self.cache.config.layers[0]
        k = np.zeros((handle.T, cfg.n_kv_heads, cfg.head_dim), self.pool.dtype)
        v = np.zeros((handle.T, cfg.n_kv_heads, cfg.value_dim), self.pool.dtype)
        self.refused("InvalidState", lambda: self.pool.update(0, handle, k, v, order="positions"))

    @rule(
        how=st.sampled_from(["by 1", "by C/2", "by C", "by C+1", "to 0", "by back"]),
        back=st.integers(0, 8),
        bad=sometimes(st.one_of(st.integers(-3, 12), st.sampled_from(EDGES))),
    )
    def rewind(self, how: str, back: int, bad: int | None) -> None:
        """rewind(n) around the edge DESIGN sets for wrapped rings (back by up to
        max_step = C is allowed after a wrap, by C + 1 is not), or by `bad`, anywhere."""
        L, C = self.ref.length, self.ref.max_step
        by = {"by 1": 1, "by C/2": max(1, C // 2), "by C": C, "by C+1": C + 1, "to 0": L, "by back": back}[how]
        n = max(0, L - by) if bad is None else L - bad
        expected = self.ref.rewind(n)
        assert self.cache.can_rewind(n) == (expected is None)
        if expected is not None:
            self.refused(expected, lambda: self.cache.rewind(n))
            return
        self.cache.rewind(n)
        self.step = None

    @rule()
    def clear(self) -> None:
        self.ref.clear()
        self.cache.clear()
        self.step = None

    @rule(
        layer=st.one_of(st.integers(-1, 4), st.sampled_from(EDGES)),
        dp=st.one_of(st.integers(-2, 2), st.sampled_from(EDGES)),
        dT=st.one_of(st.integers(-1, 1), st.sampled_from(EDGES)),
        n=st.one_of(st.integers(-2, 42), st.sampled_from(EDGES)),
        q=st.one_of(st.integers(-1, 45), st.sampled_from(EDGES)),
        k=st.one_of(st.integers(-1, 45), st.sampled_from(EDGES)),
    )
    def probe(self, layer: int, dp: int, dT: int, n: int, q: int, k: int) -> None:
        """plan() of anything but the begun step is refused; can_extend and
        visible answer by the rules (or refuse what is not a position)."""
        active = self.ref.active
        position = (active[1] if active else self.ref.length) + dp
        T = (active[2] if active else 1) + dT
        is_int = all(-(2**31) <= x < 2**31 for x in (layer, position, T))
        if not is_int or not 0 <= layer < self.cache.n_layers:
            self.refused("InvalidArgument", lambda: self.cache.plan(layer, position, T))
        elif active is None or (position, T) != active[1:]:
            self.refused("InvalidState", lambda: self.cache.plan(layer, position, T))
        else:
            plan = self.cache.plan(layer, position, T)
            self.ref.check_plan(layer, plan.write, plan.read)

        assert self.cache.can_extend(n) == (0 <= n and self.ref.length + n <= self.ref.capacity)

        if all(0 <= x < 2**31 for x in (q, k)) and 0 <= layer < self.cache.n_layers:
            assert self.cache.visible(layer, q, k) == self.ref.policies[layer].visible(q, k)
        else:
            self.refused("InvalidArgument", lambda: self.cache.visible(layer, q, k))

    # --- after every rule -------------------------------------------------------------

    @invariant()
    def agrees_with_the_reference(self) -> None:
        if not hasattr(self, "ref"):
            return
        assert self.cache.length == self.ref.length
        active = self.cache.active_step
        assert (active is None) == (self.ref.active is None)
        if active is not None:
            assert self.ref.active is not None and (active.position, active.T) == self.ref.active[1:]
        expected = self.ref.can_rewind_all()
        got = [self.cache.can_rewind(n) for n in range(self.ref.length + 1)]
        assert got == expected, f"can_rewind wrong for n in {[n for n, ok in enumerate(got) if ok != expected[n]]}"
        assert not self.cache.can_rewind(-1) and not self.cache.can_rewind(self.ref.length + 1)
        assert self.pool.nbytes <= self.pool.reserved_bytes


CacheMachine.TestCase.settings = SETTINGS
TestCacheMachine = CacheMachine.TestCase
