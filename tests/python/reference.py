"""A brute-force reference model of docs/design.md section 2, written from the contract
and independent of kvcore (it never imports it).

Each layer has a simulated pool whose rows record what was last written there:
(position, version). Every write of a position gets a fresh version, so a row
left over from an abandoned or rewound timeline never passes for the current one.
Plans are judged against the pools; can_rewind is judged from what the rows hold.

Runs are plain (row, len, pos) triples; kvcore.Run unpacks to one.
Errors are named by their kvcore.Error member name ("InvalidArgument", ...).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

RunTuple = tuple[int, int, int]
Slot = tuple[int, int]  # (position, version) a row holds


@dataclass(frozen=True)
class Policy:
    """A layer policy as docs/design.md states it: window == 0 means Flat;
    chunk > 0 a Chunked(chunk) layer, source >= 0 a Shared(source) one (section 9)."""

    window: int = 0
    sinks: int = 0
    chunk: int = 0
    source: int = -1

    @property
    def is_ring(self) -> bool:
        return self.window > 0

    @property
    def is_chunked(self) -> bool:
        return self.chunk > 0

    @property
    def is_shared(self) -> bool:
        return self.source >= 0

    @property
    def evicts(self) -> bool:
        """Rings and chunked layers let old positions go."""
        return self.is_ring or self.is_chunked

    def kept_from(self, length: int, C: int) -> int:
        """Section 6 and 9: the lowest position a query after a rewind of up to C
        from `length` may need past the sinks: length - C - W + 1 on a ring, the
        chunk start K * floor((length - C) / K) on a chunked layer, 0 when flat."""
        if self.is_chunked:
            return self.chunk * ((length - C) // self.chunk)
        return length - C - self.window + 1 if self.is_ring else 0

    def visible(self, q: int, k: int) -> bool:
        """May a query at q see key k (docs/design.md sections 2 and 9, Visibility)?"""
        if k > q:
            return False
        if self.is_chunked:
            return k // self.chunk == q // self.chunk
        if not self.is_ring:
            return True
        return q - k < self.window or k < self.sinks

    def needed(self, position: int, T: int) -> list[int]:
        """The needed set of a step, by the formula of docs/design.md section 2."""
        end = position + T
        if self.is_chunked:
            return list(range(position - position % self.chunk, end))
        if not self.is_ring:
            return list(range(end))
        sinks = set(range(min(self.sinks, end)))
        window = set(range(max(0, position - self.window + 1), end))
        return sorted(sinks | window)

    def needed_by_visibility(self, position: int, T: int) -> list[int]:
        """The needed set straight from its definition: every key visible to some
        query of the step (slow; cross-checks needed())."""
        end = position + T
        return [k for k in range(end) if any(self.visible(q, k) for q in range(position, end))]

    def history_below(self, n: int) -> tuple[range, range]:
        """Keys below n that a query at n sees, as (sinks, window) ranges."""
        if self.is_chunked:
            return range(0), range(n - n % self.chunk, n)
        if not self.is_ring:
            return range(0), range(n)
        return range(min(self.sinks, n)), range(max(0, n - self.window + 1), n)


def policy_of(layer_policy: Any) -> Policy:
    """The Policy of any object with `is_ring`, `window` and `sinks` (a
    kvcore.LayerPolicy, duck-typed: this module never imports kvcore). A
    Chunked policy (its kind's name; section 9) keeps its chunk in `window`."""
    if getattr(getattr(layer_policy, "kind", None), "name", "") == "Chunked":
        return Policy(chunk=layer_policy.window)
    return Policy(layer_policy.window if layer_policy.is_ring else 0, layer_policy.sinks)


def visible(layer_policy: Any, q: int, k: int) -> bool:
    """May a query at q see key k under `layer_policy` (docs/design.md section 2)?"""
    return policy_of(layer_policy).visible(q, k)


def needed(layer_policy: Any, position: int, T: int) -> list[int]:
    """Every key some query of the step [position, position + T) may see, in
    increasing order, straight from the visibility rule."""
    return policy_of(layer_policy).needed_by_visibility(position, T)


@dataclass
class Layer:
    """One layer's row mapping (docs/design.md section 2, Rows) and simulated pool."""

    policy: Policy
    capacity: int
    max_step: int
    rows: int = 0
    ring: int = 0  # ring rows after the sinks; 0 when the layer never wraps
    pool: list[Slot | None] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.policy.evicts:  # a chunked layer: a ring of K + C - 1 rows, no sinks (section 9)
            ring = max(self.policy.window, self.policy.chunk) + self.max_step - 1
            if self.policy.sinks + ring < self.capacity:
                self.ring = ring
            self.rows = min(self.capacity, self.policy.sinks + ring)
        else:
            self.rows = self.capacity
        self.pool = [None] * self.rows

    def row(self, position: int) -> int:
        if self.ring == 0 or position < self.policy.sinks:
            return position
        return self.policy.sinks + (position - self.policy.sinks) % self.ring

    def holds(self, position: int, version: int) -> bool:
        return self.pool[self.row(position)] == (position, version)


def as_run(run: Iterable[int]) -> RunTuple:
    row, length, pos = run
    return (row, length, pos)


def expand(runs: Iterable[Iterable[int]]) -> list[tuple[int, int]]:
    """(row, position) for every row a list of runs names, in order."""
    out: list[tuple[int, int]] = []
    for row, length, pos in map(as_run, runs):
        out.extend((row + i, pos + i) for i in range(length))
    return out


class Cache:
    """The reference SequenceCache: lifecycle, plans and rewind, by brute force.

    Mutators return None on success or the name of the expected error, and change
    nothing when they fail.
    """

    def __init__(self, capacity: int, policies: Sequence[Policy], max_step: int | None = None):
        self.capacity = capacity
        self.max_step = min(512, capacity) if max_step is None else max_step
        self.policies = list(policies)
        self.layers = [Layer(p, capacity, self.max_step) for p in self.policies]
        self.content: list[int] = []  # version of each committed position
        self.active: tuple[int, int, int] | None = None  # (id, position, T)
        self.pending: list[int] = []  # versions the begun step wrote
        self._last_id = 0
        self._last_version = 0

    @property
    def length(self) -> int:
        return len(self.content)

    @property
    def n_groups(self) -> int:
        return len(set(self.policies))

    # --- lifecycle ------------------------------------------------------------

    def begin_step(self, T: int) -> str | None:
        if not 1 <= T <= self.max_step:
            return "InvalidArgument"
        if self.length + T > self.capacity:
            return "OutOfResources"
        position = self.length
        self.pending = []
        for p in range(position, position + T):
            self._last_version += 1
            self.pending.append(self._last_version)
            for layer in self.layers:  # begun rows count as written
                layer.pool[layer.row(p)] = (p, self._last_version)
        self._last_id += 1
        self.active = (self._last_id, position, T)
        return None

    def commit(self, step_id: int) -> str | None:
        if self.active is None or self.active[0] != step_id:
            return "InvalidState"
        self.content.extend(self.pending)
        self.active, self.pending = None, []
        return None

    def can_rewind(self, n: int) -> bool:
        if not 0 <= n <= self.length:
            return False
        for layer in self.layers:
            for keys in layer.policy.history_below(n):
                if not all(layer.holds(k, self.content[k]) for k in keys):
                    return False
        return True

    def can_rewind_all(self) -> list[bool]:
        """can_rewind(n) for every n in [0, length], in O(layers * length)."""
        ok = [True] * (self.length + 1)
        for layer in {layer.policy: layer for layer in self.layers}.values():  # same policy, same rows
            missing = [0]  # missing[i]: keys in [0, i) the rows no longer hold
            for k, version in enumerate(self.content):
                missing.append(missing[-1] + (not layer.holds(k, version)))
            for n in range(self.length + 1):
                sinks, window = layer.policy.history_below(n)
                if missing[sinks.stop] > missing[sinks.start] or missing[window.stop] > missing[window.start]:
                    ok[n] = False
        return ok

    def rewind(self, n: int) -> str | None:
        if not 0 <= n <= self.length:
            return "InvalidArgument"
        if not self.can_rewind(n):
            return "InvalidState"
        del self.content[n:]
        self.active, self.pending = None, []
        return None

    def clear(self) -> None:
        self.content = []
        self.active, self.pending = None, []

    # --- plans ----------------------------------------------------------------

    def version(self, position: int) -> int:
        """The current version of a committed or begun position."""
        if position < self.length:
            return self.content[position]
        assert self.active is not None
        return self.pending[position - self.active[1]]

    def check_plan(self, layer_index: int, write: Iterable[Iterable[int]], read: Iterable[Iterable[int]]) -> None:
        """Asserts that `write`/`read` is a correct plan of `layer_index` for the
        begun step, by docs/design.md section 2 (Plan of a step)."""
        assert self.active is not None, "no step is begun"
        _, position, T = self.active
        writes, reads = [as_run(r) for r in write], [as_run(r) for r in read]
        layer = self.layers[layer_index]
        where = f"layer {layer_index} {layer.policy} step ({position}, {T}): write={writes} read={reads}"

        assert all(length >= 1 for _, length, _ in [*writes, *reads]), f"empty run: {where}"
        # Write: the rows of [P, P+T) in order, split only where rows jump.
        assert expand(writes) == [(layer.row(p), p) for p in range(position, position + T)], f"write: {where}"
        assert len(writes) <= 2, f"more than 2 write runs: {where}"
        for a, b in zip(writes, writes[1:]):
            assert a[0] + a[1] != b[0], f"write runs not merged: {where}"

        # Read: exactly the needed set, each row holding the position it claims.
        pairs = expand(reads)
        assert [p for _, p in pairs] == layer.policy.needed(position, T), f"read != needed set: {where}"
        for row, p in pairs:
            assert 0 <= row < layer.rows, f"row {row} outside [0, {layer.rows}): {where}"
            held = layer.pool[row]
            assert held == (p, self.version(p)), f"row {row} holds {held}, read claims position {p}: {where}"
        for a, b in zip(reads, reads[1:]):
            assert not (a[0] + a[1] == b[0] and a[2] + a[1] == b[2]), f"read runs not merged: {where}"
        assert len(reads) <= (3 if layer.policy.evicts else 1), f"too many read runs: {where}"


# --- driving a real cache alongside the reference ------------------------------
# Duck-typed (no kvcore import): anything with SequenceCache's Python surface.


def observe(cache: Any, *steps: Any) -> dict[str, object]:
    """Everything a caller can observe of a cache (and of step handles it holds),
    to prove a failed call changed nothing."""
    active = cache.active_step
    room = cache.capacity - cache.length
    extend = sorted({*range(-1, min(room, 64) + 2), room - 1, room, room + 1})  # bounded for huge capacities
    return {
        "length": cache.length,
        "active": None if active is None else (active.position, active.T),
        "current": [s.is_current for s in steps],
        "can_rewind": [cache.can_rewind(n) for n in range(-1, cache.length + 2)],
        "can_extend": [cache.can_extend(n) for n in extend],
        "plans": None if active is None else [repr(active.plan(l)) for l in range(cache.n_layers)],
    }


class Lockstep:
    """A kvcore SequenceCache and the reference Cache driven together: every begun
    step's plans are checked against the reference pools, every outcome compared."""

    def __init__(self, cache: Any):
        self.cache = cache
        policies = [cache.layer_policy(l) for l in range(cache.n_layers)]
        self.ref = Cache(cache.capacity, [Policy(p.window, p.sinks) for p in policies], cache.max_step)
        self.step: Any = None  # the kvcore Step of the reference's begun step
        self.step_id = 0

    def check_plans(self) -> None:
        assert self.step is not None and self.ref.active is not None
        _, position, T = self.ref.active
        assert (self.step.position, self.step.T) == (position, T)
        for l in range(self.cache.n_layers):
            plan = self.step.plan(l)
            assert plan == self.cache.plan(l, position, T)  # both spellings, and pure
            self.ref.check_plan(l, plan.write, plan.read)

    def begin(self, T: int) -> Any:
        """Begins a step of T in both; checks the plans. Returns the Step."""
        expected = self.ref.begin_step(T)
        assert expected is None, f"the reference refuses begin_step({T}): {expected}"
        self.step = self.cache.begin_step(T)
        self.step_id = self.ref.active[0] if self.ref.active else 0
        self.check_plans()
        return self.step

    def commit(self) -> None:
        assert self.ref.commit(self.step_id) is None
        self.step.commit()
        self.step = None
        self.check_length()

    def advance(self, T: int) -> Any:
        """One checked, committed step of T tokens. Returns the Step."""
        step = self.begin(T)
        self.commit()
        return step

    def rewind(self, n: int) -> None:
        assert self.ref.rewind(n) is None, f"the reference refuses rewind({n})"
        self.cache.rewind(n)
        self.step = None
        self.check_length()

    def clear(self) -> None:
        self.ref.clear()
        self.cache.clear()
        self.step = None
        self.check_length()

    def check_length(self) -> None:
        assert self.cache.length == self.ref.length
        expected = self.ref.can_rewind_all()
        got = [self.cache.can_rewind(n) for n in range(self.ref.length + 1)]
        wrong = [n for n in range(len(got)) if got[n] != expected[n]]
        assert not wrong, f"can_rewind(n) wrong for n in {wrong} at length {self.ref.length}"
