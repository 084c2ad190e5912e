"""BatchCache's Python boundary under hostile input, in the style of
test_boundary.py: -1, 2**31, 2**63 and non-integers for every integer
parameter of every BatchCache, BatchStepPlan and BatchLimits call; malformed
step entries (wrong sizes, a token count that is not T, tokens that are not
ints, entries that are not a list of tuples); objects used after clear(),
after their sequence was released, after their step was replaced, or with
another cache; objects made by `Class.__new__(Class)`. Each gets its exception
class and a message naming the parameter (or a TypeError where the type is
wrong), never a crash, and a refused call changes nothing.

Expected outcomes come from the rules (docs/design.md sections 2 and 6,
batch_faces.h, docs/errors.md), not from running the code.
"""

from __future__ import annotations

import copy
import gc
import pickle
import textwrap
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import kvcore
from batch_reference import observable
from blank_probe import assert_blank_objects_refuse_every_use

RING = kvcore.Ring(window=3, sinks=1)
HUGE = [2**31, 2**63, -(2**31) - 1, -(2**63) - 1, 2**70]
NOT_INTS: list[Any] = [1.0, 2.5, None, "1", b"1", np.float64(1.0), [1], 1j]


def config(**limits: int) -> kvcore.CacheConfig:
    layers = [kvcore.LayerConfig(RING, 1, 2), kvcore.LayerConfig(kvcore.Flat(), 1, 2)]
    # One pool for both groups: the flat layer's 16 blocks and as many for the ring's windows.
    batch = {"block_size": 2, "max_seqs": 4, "num_blocks": 32, "max_holes": 2, **limits}
    return kvcore.CacheConfig(16, layers, max_step=4, batch=kvcore.BatchLimits(**batch))


class Rig:
    """Ring(3, 1) and Flat layers (two groups), B = 2, capacity 16, max_step 4,
    sequence ids 0..3: 0 at length 6 with token ids, 1 a fork of 0 at 5 (they
    share a partly filled block), 2 active and empty, 3 inactive; a step over 0
    and 1 begun (with a copy-on-write in each group) and its plan."""

    def __init__(self) -> None:
        self.cache = c = kvcore.BatchCache(config())
        c.add_sequence(0)
        c.step([(0, 4, [1, 2, 3, 4])]).commit()
        c.step([(0, 2, [5, 6])]).commit()
        c.fork(0, 1, 5)
        c.add_sequence(2)
        self.step = c.begin_step([(0, 1), (1, 2)])
        self.plan = self.step.plan()
        self.tables = [g.block_tables for g in self.plan.groups]

    def state(self) -> tuple[Any, ...]:
        return observable(self.cache), tuple(t.tobytes() for t in self.tables), self.step.is_current


@pytest.fixture
def rig() -> Rig:
    return Rig()


def refused(rig: Rig, call: Callable[[], object], cls: type[BaseException], text: str = "") -> None:
    """`call` raises `cls` (whose message has `text`), and changes nothing."""
    before = rig.state()
    with pytest.raises(cls) as info:
        call()
    assert text in str(info.value), f"{str(info.value)!r} does not name {text!r}"
    assert rig.state() == before


# --- integer arguments -----------------------------------------------------------------------

# Every integer parameter of the Python API of the batch cache: (name in the
# 32-bit message, the call with x, the message -1 gets or None when -1 is legal).
INT_PARAMETERS: dict[str, tuple[str, Callable[[Rig, Any], object], str | None]] = {
    "add_sequence.seq": ("seq", lambda r, x: r.cache.add_sequence(x), "add_sequence: sequence -1 must be in [0, max_seqs = 4)"),
    "release_sequence.seq": ("seq", lambda r, x: r.cache.release_sequence(x), "release_sequence: sequence -1 must be in"),
    "fork.src": ("src", lambda r, x: r.cache.fork(x, 2), "fork: sequence -1 must be in [0, max_seqs = 4)"),
    "fork.dst": ("dst", lambda r, x: r.cache.fork(0, x), "fork: sequence -1 must be in [0, max_seqs = 4)"),
    "fork.upto": ("upto", lambda r, x: r.cache.fork(0, 2, x), "fork(0, 2, upto = -1): must be in [0, length = 6]"),
    "remove.seq": ("seq", lambda r, x: r.cache.remove(x, 0, 1), "remove: sequence -1 must be in"),
    "remove.p0": ("p0", lambda r, x: r.cache.remove(0, x, 1), "remove(0, p0 = -1, p1 = 1): needs 0 <= p0 <= p1"),
    "remove.p1": ("p1", lambda r, x: r.cache.remove(0, 1, x), "remove(0, p0 = 1, p1 = -1): needs 0 <= p0 <= p1"),
    "rewind.seq": ("seq", lambda r, x: r.cache.rewind(x, 0), "rewind: sequence -1 must be in"),
    "rewind.n": ("n", lambda r, x: r.cache.rewind(0, x), "rewind(0, n = -1): must be in [0, length = 6]"),
    "adopt_prefix.seq": ("seq", lambda r, x: r.cache.adopt_prefix(x, [1, 2, 3]), "adopt_prefix: sequence -1 must be in"),
    "adopt_prefix.token": ("adopt_prefix: tokens[1]", lambda r, x: r.cache.adopt_prefix(2, [1, x, 3]), None),  # any int32 is a token id
    "begin_step.seq": ("seq", lambda r, x: r.cache.begin_step([(2, 1), (x, 1)]), "begin_step: sequence -1 must be in"),
    "begin_step.T": ("T", lambda r, x: r.cache.begin_step([(2, x)]), "begin_step: sequence 2 with T = -1, must be in [1, max_step = 4]"),
    "begin_step.token": ("token", lambda r, x: r.cache.begin_step([(2, 2, [7, x])]), None),
    "step.T": ("T", lambda r, x: r.cache.step([(0, x)]), "begin_step: sequence 0 with T = -1, must be in"),
    "sequence.seq": ("seq", lambda r, x: r.cache.sequence(x), "sequence: sequence -1 must be in"),
    "length.seq": ("seq", lambda r, x: r.cache.length(x), "sequence: sequence -1 must be in"),
    "blocks_held.seq": ("seq", lambda r, x: r.cache.blocks_held(x, 0), "blocks_held: sequence -1 must be in"),
    "blocks_held.group": ("group", lambda r, x: r.cache.blocks_held(0, x), "group = -1: must be in [0, n_groups = 2)"),
    "oldest_held.seq": ("seq", lambda r, x: r.cache.oldest_held(x, 0), "oldest_held: sequence -1 must be in"),
    "oldest_held.group": ("group", lambda r, x: r.cache.oldest_held(0, x), "group = -1: must be in [0, n_groups = 2)"),
    "free_blocks.group": ("group", lambda r, x: r.cache.free_blocks(x), "group = -1: must be in [0, n_groups = 2)"),
    "cached_blocks.group": ("group", lambda r, x: r.cache.cached_blocks(x), "group = -1: must be in"),
    "num_blocks.group": ("group", lambda r, x: r.cache.num_blocks(x), "group = -1: must be in"),
    "used_blocks.group": ("group", lambda r, x: r.cache.used_blocks(x), "group = -1: must be in"),
    "group_policy.group": ("group", lambda r, x: r.cache.group_policy(x), "group = -1: must be in"),
    "group_of.layer": ("layer", lambda r, x: r.cache.group_of(x), "layer = -1: must be in [0, n_layers = 2)"),
    "layer_config.layer": ("layer", lambda r, x: r.cache.layer_config(x), "layer = -1: must be in [0, n_layers = 2)"),
    "visible.group": ("group", lambda r, x: r.cache.visible(x, 0, 1, 0), "group = -1: must be in"),
    "visible.seq": ("seq", lambda r, x: r.cache.visible(0, x, 1, 0), "visible: sequence -1 must be in"),
    "visible.q": ("q", lambda r, x: r.cache.visible(0, 0, x, 0), "visible(q = -1, k = 0): positions must be >= 0"),
    "visible.k": ("k", lambda r, x: r.cache.visible(0, 0, 3, x), "visible(q = 3, k = -1): positions must be >= 0"),
    "BatchStepPlan.holes.entry": ("entry", lambda r, x: r.plan.holes(x), "entry = -1: must be >= 0 and < n_entries = 2"),
    "BatchStepPlan.mask.group": ("group", lambda r, x: r.plan.mask(x), "group = -1: must be in [0, n_groups = 2)"),
    "BatchStepPlan.mask.rows": ("rows", lambda r, x: r.plan.mask(0, x), "rows = -1: must be >= 0"),
    "BatchLimits.block_size": ("block_size", lambda r, x: kvcore.BatchCache(config(block_size=x)), "batch.block_size = -1: must be >= 1"),
    "BatchLimits.max_seqs": ("max_seqs", lambda r, x: kvcore.BatchCache(config(max_seqs=x)), "batch.max_seqs = -1: must be in [1, 1048576]"),
    "BatchLimits.max_step_tokens": (
        "max_step_tokens",
        lambda r, x: kvcore.BatchCache(config(max_step_tokens=x)),
        "batch.max_step_tokens = -1: must be >= 1 (or 0 for the default)",
    ),
    "BatchLimits.num_blocks": (
        "num_blocks",
        lambda r, x: kvcore.BatchCache(config(num_blocks=x)),
        "batch.num_blocks = -1: must be >= 1 (or 0 for the default)",
    ),
    "BatchLimits.max_holes": ("max_holes", lambda r, x: kvcore.BatchCache(config(max_holes=x)), "batch.max_holes = -1: must be in [0, 4096]"),
}


@pytest.mark.parametrize("value", HUGE, ids=str)
@pytest.mark.parametrize("name", list(INT_PARAMETERS))
def test_an_int_beyond_32_bits_is_an_invalid_argument_naming_it(rig: Rig, name: str, value: int) -> None:
    param, call, _ = INT_PARAMETERS[name]
    refused(rig, lambda: call(rig, value), kvcore.InvalidArgumentError, f"{param} = {value}: must fit in a 32-bit signed int")


@pytest.mark.parametrize("name", [n for n, (_, _, text) in INT_PARAMETERS.items() if text is not None])
def test_minus_one_is_an_invalid_argument_naming_it(rig: Rig, name: str) -> None:
    _, call, text = INT_PARAMETERS[name]
    assert text is not None
    refused(rig, lambda: call(rig, -1), kvcore.InvalidArgumentError, text)


def test_minus_one_is_a_token_id_like_any_other(rig: Rig) -> None:
    assert rig.cache.adopt_prefix(2, [1, -1, 3]) == 0
    step = rig.cache.begin_step([(2, 2, [7, -1])])
    assert step.n_tokens == 2


# None is the default of fork's upto, remove's p1 and a plan mask's rows, and a step entry's tokens.
NOT_INT_CASES = [
    pytest.param(name, value, id=f"{name}-{value!r}")
    for name in INT_PARAMETERS
    for value in NOT_INTS
    if not (value is None and name in ("fork.upto", "remove.p1", "BatchStepPlan.mask.rows"))
]


@pytest.mark.parametrize("name, value", NOT_INT_CASES)
def test_a_non_integer_is_a_type_error(rig: Rig, name: str, value: Any) -> None:
    _, call, _ = INT_PARAMETERS[name]
    refused(rig, lambda: call(rig, value), TypeError)


@pytest.mark.parametrize(
    "entry, text",
    [
        ((1.5, 1), "begin_step: seq = 1.5: must be an int, got float"),
        ((2, "1"), "begin_step: T = '1': must be an int, got str"),
        ((2, None), "begin_step: T = None: must be an int, got NoneType"),
        ((2, 2, [7, 1.0]), "begin_step: token = 1.0: must be an int, got float"),
        ((2, 2, [7, None]), "begin_step: token = None: must be an int, got NoneType"),
        ((2, 2, "ab"), "begin_step: token = 'a': must be an int, got str"),
        ((2, 1, [np.float32(1)]), "begin_step: token = np.float32(1.0): must be an int, got float32"),
    ],
)
def test_a_step_entry_field_that_is_not_an_int_is_a_type_error_naming_it(rig: Rig, entry: Any, text: str) -> None:
    refused(rig, lambda: rig.cache.begin_step([entry]), TypeError, text)
    refused(rig, lambda: rig.cache.step([(0, 1), entry]), TypeError, text)


def test_numpy_integers_are_integers(rig: Rig) -> None:
    c = rig.cache
    assert c.blocks_held(np.int64(0), np.uint8(1)) == c.blocks_held(0, 1)
    assert c.can_rewind(np.int32(0), np.int16(6))
    tokens = [np.int16(t) for t in (1, 2, 3, 4, 5)]
    c.release_sequence(2)
    c.add_sequence(2)
    assert c.adopt_prefix(np.int8(2), tokens) == 4  # seq 0's first two blocks, keyed by token ids
    step = c.begin_step([(np.int64(2), np.uint16(1), np.array([5], np.uint8))])
    assert step.n_tokens == 1
    with pytest.raises(kvcore.InvalidArgumentError, match=f"seq = {2**64 - 1}: must fit"):
        c.sequence(np.uint64(2**64 - 1))


@pytest.mark.parametrize("value", [*HUGE, -1, -(2**31), 2**31 - 1], ids=str)
def test_can_rewind_answers_false_for_any_int_and_never_raises(rig: Rig, value: int) -> None:
    before = rig.state()
    assert rig.cache.can_rewind(value, 0) is False
    assert rig.cache.can_rewind(0, value) is False
    assert rig.cache.can_rewind(3, 0) is False  # inactive
    assert rig.state() == before


@pytest.mark.parametrize("value", NOT_INTS, ids=repr)
def test_can_rewind_refuses_a_non_integer_with_a_type_error(rig: Rig, value: Any) -> None:
    refused(rig, lambda: rig.cache.can_rewind(value, 0), TypeError)
    refused(rig, lambda: rig.cache.can_rewind(0, value), TypeError)


def test_huge_limits_are_refused_before_anything_is_allocated() -> None:
    layer = kvcore.LayerConfig(kvcore.Flat(), 1, 2)
    big = kvcore.CacheConfig(2**31 - 1, layer, max_step=1, batch=kvcore.BatchLimits(block_size=1, max_seqs=2))
    with pytest.raises(kvcore.InvalidArgumentError, match=r"the tables would pass 2\^31 entries"):
        kvcore.BatchCache(big)
    with pytest.raises(kvcore.InvalidArgumentError, match=r"batch.max_seqs = 1048577: must be in \[1, 1048576\]"):
        kvcore.BatchCache(kvcore.CacheConfig(8, layer, batch=kvcore.BatchLimits(max_seqs=2**20 + 1)))
    with pytest.raises(kvcore.InvalidArgumentError, match=r"batch.max_holes = 4097: must be in \[0, 4096\]"):
        kvcore.BatchCache(kvcore.CacheConfig(8, layer, batch=kvcore.BatchLimits(max_holes=4097)))
    with pytest.raises(kvcore.InvalidArgumentError, match="batch.block_size = 0: must be >= 1"):
        kvcore.BatchCache(kvcore.CacheConfig(8, layer, batch=kvcore.BatchLimits(block_size=0)))
    with pytest.raises(kvcore.InvalidArgumentError, match="batch.max_seqs = 0"):
        kvcore.BatchCache(kvcore.CacheConfig(8, layer, batch=kvcore.BatchLimits(max_seqs=0)))


def test_batch_limits_take_keywords_only_and_refuse_unknown_ones() -> None:
    with pytest.raises(TypeError):
        kvcore.BatchLimits(16)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        kvcore.BatchLimits(blocksize=16)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        kvcore.BatchCache(None)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        kvcore.BatchCache(kvcore.BatchLimits())  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        kvcore.CacheConfig(8, kvcore.LayerConfig(kvcore.Flat(), 1, 2), batch=None)  # type: ignore[arg-type]


# --- malformed step entries -------------------------------------------------------------------


@pytest.mark.parametrize(
    "entries, cls, text",
    [
        ([], kvcore.InvalidArgumentError, "begin_step: 0 entries, must be in [1, max_seqs = 4]"),
        ([(0,)], kvcore.InvalidArgumentError, "begin_step: each entry is (seq, T), (seq, T, tokens) or (seq, T, tokens, parents), got (0,)"),
        ([()], kvcore.InvalidArgumentError, "each entry is (seq, T), (seq, T, tokens) or (seq, T, tokens, parents), got ()"),
        ([(2, 1, [7], None, None)], kvcore.InvalidArgumentError, "got (2, 1, [7], None, None)"),
        ([2], kvcore.InvalidArgumentError, "each entry is (seq, T), (seq, T, tokens) or (seq, T, tokens, parents), got 2"),
        ([None], kvcore.InvalidArgumentError, "got None"),
        ([{2: 1}], kvcore.InvalidArgumentError, "got {2: 1}"),
        ([(2, 2, [7])], kvcore.InvalidArgumentError, "begin_step: sequence 2 has T = 2 but 1 tokens"),
        ([(2, 1, [7, 8])], kvcore.InvalidArgumentError, "begin_step: sequence 2 has T = 1 but 2 tokens"),
        ([(2, 1, [])], kvcore.InvalidArgumentError, "begin_step: sequence 2 has T = 1 but 0 tokens"),
        ([(2, 1), (2, 1)], kvcore.InvalidArgumentError, "begin_step: sequence 2 appears twice"),
        ([(3, 1)], kvcore.InvalidStateError, "begin_step: sequence 3 is not active"),
        ([(2, 5)], kvcore.InvalidArgumentError, "T = 5, must be in [1, max_step = 4]"),
        ([(2, 1, 7)], TypeError, "not iterable"),
        ([(0, 1), (1, 1), (2, 1), (0, 1), (1, 1)], kvcore.InvalidArgumentError, "5 entries, must be in [1, max_seqs = 4]"),
        (5, TypeError, "begin_step takes entries [(seq, T), (seq, T, tokens) or (seq, T, tokens, parents), ...] or arrays (seqs, T, "),
        (None, TypeError, "begin_step takes entries [(seq, T), (seq, T, tokens) or (seq, T, tokens, parents), ...] or arrays (seqs, T, "),
    ],
    ids=lambda x: repr(x) if not isinstance(x, type) else x.__name__,
)
def test_malformed_step_entries_are_refused_and_change_nothing(rig: Rig, entries: Any, cls: type[BaseException], text: str) -> None:
    refused(rig, lambda: rig.cache.begin_step(entries), cls, text)
    refused(rig, lambda: rig.cache.step(entries), cls, text)


def test_steps_past_capacity_or_the_token_limit_are_refused_and_change_nothing(rig: Rig) -> None:
    c = rig.cache
    for _ in range(2):
        c.step([(0, 4)]).commit()  # seq 0 at 14 of 16
    rig.step = c.begin_step([(0, 1), (1, 2)])
    rig.tables = [g.block_tables for g in rig.step.plan().groups]
    refused(rig, lambda: c.begin_step([(2, 1), (0, 3)]), kvcore.CapacityError, "begin_step: sequence 0 at length 14 with T = 3 would pass capacity = 16")
    small = kvcore.BatchCache(config(max_step_tokens=3))
    small.add_sequence(0)
    small.add_sequence(1)
    with pytest.raises(kvcore.InvalidArgumentError, match=r"begin_step: 4 tokens or more, must be <= max_step_tokens = 3"):
        small.begin_step([(0, 2), (1, 2)])
    assert small.begin_step([(0, 2), (1, 1)]).n_tokens == 3


def test_a_pool_that_runs_short_refuses_the_step_naming_the_pool() -> None:
    c = kvcore.BatchCache(config(num_blocks=6))  # one pool of 6 blocks of 2 rows for both groups
    for seq in range(3):
        c.add_sequence(seq)
    # Each group holds ceil(4 / 2) blocks for sequence 0 (the ring's window keeps them all at
    # length 4) and 1 for sequence 1: 6, the whole pool.
    c.step([(0, 4), (1, 2)]).commit()
    assert c.free_blocks(0) == 0 and [c.held_blocks(g) for g in range(2)] == [3, 3]
    before = [(c.free_blocks(g), c.held_blocks(g)) for g in range(2)]
    # Three tokens take ceil(3 / 2) = 2 blocks in each group.
    with pytest.raises(kvcore.CapacityError, match=r"begin_step: the step needs 4 blocks over its 2 groups, 0 of the pool's 6 are free"):
        c.begin_step([(2, 3)])
    assert [(c.free_blocks(g), c.held_blocks(g)) for g in range(2)] == before and c.length(2) == 0
    c.release_sequence(1)
    c.step([(2, 2)]).commit()  # fits now: sequence 1's two blocks came back


# --- objects after their moment -------------------------------------------------------------------


def stale_calls(cache: kvcore.BatchCache, step: kvcore.BatchStep, plan: kvcore.BatchStepPlan, group: Any) -> list[Callable[[], object]]:
    return [
        step.commit,
        lambda: cache.commit(step),
        step.plan,
        lambda: plan.seq_ids,
        lambda: plan.context_lens,
        lambda: plan.positions,
        lambda: plan.groups,
        lambda: plan.holes(0),
        lambda: group.slots,
        lambda: group.copies,
        lambda: group.block_tables,
    ]


def test_a_step_its_plan_and_views_after_clear(rig: Rig) -> None:
    step, plan, group = rig.step, rig.plan, rig.plan.groups[1]
    slots, tables = group.slots, group.block_tables
    expected_slots = slots.copy()
    rig.cache.clear()
    assert not step.is_current
    for call in stale_calls(rig.cache, step, plan, group):
        with pytest.raises(kvcore.InvalidStateError, match="no step is begun"):
            call()
    with pytest.raises(kvcore.InvalidStateError):
        with step:
            pass
    # Views taken before stay readable (the cache's memory): the slots as they
    # were, the tables as they are now (cleared: no blocks).
    np.testing.assert_array_equal(slots, expected_slots)
    assert (tables == -1).all()
    assert all(not rig.cache.sequence(s).active for s in range(4))
    assert [rig.cache.free_blocks(g) for g in range(2)] == [rig.cache.num_blocks(g) for g in range(2)]
    rig.cache.add_sequence(0)
    with rig.cache.step([(0, 2)]):
        pass
    assert (tables[0, :1] >= 0).all()


def test_a_step_after_one_of_its_sequences_was_released(rig: Rig) -> None:
    info, group = rig.cache.sequence(1), rig.plan.groups[0]
    rig.cache.release_sequence(1)
    assert not rig.step.is_current
    for call in stale_calls(rig.cache, rig.step, rig.plan, group):
        with pytest.raises(kvcore.InvalidStateError):
            call()
    assert (info.active, info.length) == (True, 5)  # a copy, as it was
    with pytest.raises(kvcore.InvalidStateError, match="begin_step: sequence 1 is not active"):
        rig.cache.begin_step([(0, 1), (1, 1)])
    for call in (
        lambda: rig.cache.fork(1, 2),
        lambda: rig.cache.rewind(1, 0),
        lambda: rig.cache.remove(1, 0, 1),
        lambda: rig.cache.release_sequence(1),
        lambda: rig.cache.adopt_prefix(1, [1, 2, 3]),
    ):
        with pytest.raises(kvcore.InvalidStateError, match="sequence 1 is not active"):
            call()
    assert rig.cache.can_rewind(1, 0) is False
    assert rig.cache.blocks_held(1, 0) == 0 and rig.cache.oldest_held(1, 0) == 0


def test_a_step_after_it_was_replaced_or_ended_by_a_verb(rig: Rig) -> None:
    old, plan = rig.step, rig.plan
    retry = rig.cache.begin_step([(0, 1)])  # replaces the begun step (the retry path)
    for call in stale_calls(rig.cache, old, plan, None)[:3]:
        with pytest.raises(kvcore.InvalidStateError, match="not the begun step"):
            call()
    with pytest.raises(kvcore.InvalidStateError, match="not the begun step"):
        plan.seq_ids
    rig.cache.remove(0, 6)  # removes nothing (at the end), but it is a verb: the step is over
    with pytest.raises(kvcore.InvalidStateError, match="no step is begun"):
        retry.commit()


def test_a_step_of_another_cache_is_refused(rig: Rig) -> None:
    other = kvcore.BatchCache(config())
    other.add_sequence(0)
    foreign = other.begin_step([(0, 1)])
    refused(rig, lambda: rig.cache.commit(foreign), kvcore.InvalidStateError, "commit: the step belongs to another cache")
    assert foreign.is_current
    foreign.commit()
    refused(rig, lambda: rig.cache.commit(None), TypeError)  # type: ignore[arg-type]
    refused(rig, lambda: rig.cache.commit(rig.plan), TypeError)  # type: ignore[arg-type]


def test_objects_outlive_their_cache() -> None:
    rig = Rig()
    info = rig.cache.sequence(0)
    step, plan, group = rig.step, rig.plan, rig.plan.groups[0]
    seq_ids = plan.seq_ids
    del rig
    gc.collect()
    churn = [np.full(1 << 12, 9, np.int32) for _ in range(64)]
    assert step.is_current and plan.seq_ids.tolist() == seq_ids.tolist() == [0, 1]
    assert group.slots.shape == (3,) and info.length == 6
    step.commit()  # the step kept its cache alive
    del churn


def test_kvcore_batch_objects_cannot_be_copied_or_pickled(rig: Rig) -> None:
    objects = [rig.cache, rig.step, rig.plan, rig.plan.groups[0], rig.cache.sequence(0)]
    for obj in objects:
        for operation in (copy.copy, copy.deepcopy, pickle.dumps):
            refused(rig, lambda: operation(obj), TypeError, "pickle")
    # BatchLimits is an immutable value, as CacheConfig is: it copies, it does not pickle.
    limits = kvcore.BatchLimits(block_size=4, max_seqs=3, max_holes=2)
    for operation in (copy.copy, copy.deepcopy):
        copied = operation(limits)
        assert copied is not limits and repr(copied) == repr(limits)
    refused(rig, lambda: pickle.dumps(limits), TypeError, "pickle")


# --- objects made by Class.__new__(Class) ---------------------------------------------------------

BLANK_SETUP = textwrap.dedent(
    """
    import kvcore, kvcore._core

    def fresh():
        layers = [kvcore.LayerConfig(kvcore.Ring(3, 1), 1, 2), kvcore.LayerConfig(kvcore.Flat(), 1, 2)]
        limits = kvcore.BatchLimits(block_size=2, max_seqs=4, num_blocks=16)
        cache = kvcore.BatchCache(kvcore.CacheConfig(16, layers, max_step=4, batch=limits))
        cache.add_sequence(0)
        cache.step([(0, 3)]).commit()
        cache.fork(0, 1)
        cache.add_sequence(2)
        step = cache.begin_step([(1, 1)])
        plan = step.plan()
        live = {"BatchCache": cache, "BatchStep": step, "BatchStepPlan": plan, "GroupPlan": plan.groups[0],
                "SequenceInfo": cache.sequence(0), "BatchLimits": limits}
        return live, cache, step

    calls = {
        "BatchCache": ["max_seqs", "capacity", "max_step", "max_step_tokens", "n_layers", "n_groups", "block_size",
                       "table_stride", "group_of(0)", "group_policy(0)", "layer_config(0)", "num_blocks(0)",
                       "used_blocks(0)", "free_blocks(0)", "cached_blocks(0)", "blocks_held(0, 0)", "oldest_held(0, 0)",
                       "sequence(0)", "length(0)", "add_sequence(3)", "release_sequence(0)", "fork(0, 2)",
                       "remove(0, 0, 1)", "rewind(0, 1)", "can_rewind(0, 1)", "adopt_prefix(2, [1, 2])",
                       "begin_step([(0, 1)])", "step([(0, 1)])", "commit(step)", "visible(0, 0, 1, 0)", "clear()",
                       "__repr__()"],
        # (__enter__ returns the object itself without touching it; __exit__ refuses.)
        "BatchStep": ["n_entries", "n_tokens", "is_current", "plan()", "commit()", "__exit__(None, None, None)",
                      "__repr__()"],
        "BatchStepPlan": ["n_entries", "n_tokens", "block_size", "seq_ids", "query_starts", "first_positions",
                          "context_lens", "visible_starts", "holes(0)", "positions", "groups", "__repr__()"],
        "GroupPlan": ["group", "slots", "copies", "block_tables", "policy", "__repr__()"],
        "SequenceInfo": ["active", "length", "visible_start", "holes", "visible_positions", "__repr__()"],
        "BatchLimits": ["block_size", "max_seqs", "max_step_tokens", "num_blocks", "max_holes", "__repr__()"],
    }
    uses = ["cache.commit(blank)", "kvcore.BatchCache(blank)",
                    "kvcore.CacheConfig(8, kvcore.LayerConfig(kvcore.Flat(), 1, 2), batch=blank)"]
    """
)


def test_objects_made_by_new_without_init_refuse_every_use() -> None:
    assert_blank_objects_refuse_every_use(BLANK_SETUP)
