"""BatchCache's verbs over arrays: begin_step / step with seqs, T, tokens and
token_offsets as arrays, add_sequences, release_sequences and fork_many.

The array form must plan exactly what the list form plans for the same entries
(the list form is the reference), every bad array must be refused with an
error naming the value and the rule and change nothing, and the many-sequence
verbs are all or nothing. Expected outcomes come from the rules (docs/batch.md,
docs/errors.md), not from running the code.
"""

from __future__ import annotations

import array
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from needs import need

import kvcore
from batch_reference import observable

RING = kvcore.Ring(window=3, sinks=1)


def config() -> kvcore.CacheConfig:
    layers = [kvcore.LayerConfig(RING, 1, 2), kvcore.LayerConfig(kvcore.Flat(), 1, 2)]
    limits = kvcore.BatchLimits(block_size=2, max_seqs=4, num_blocks=16, max_holes=2)
    return kvcore.CacheConfig(16, layers, max_step=4, batch=limits)


def made() -> kvcore.BatchCache:
    """Sequence 0 at length 6 with token ids, 1 a fork of 0 at 5, 2 active and
    empty, 3 inactive."""
    c = kvcore.BatchCache(config())
    c.add_sequence(0)
    c.step([(0, 4, [1, 2, 3, 4])]).commit()
    c.step([(0, 2, [5, 6])]).commit()
    c.fork(0, 1, 5)
    c.add_sequence(2)
    return c


def state(c: kvcore.BatchCache) -> tuple[Any, ...]:
    return observable(c)


def plan_of(step: kvcore.BatchStep) -> tuple[Any, ...]:
    p = step.plan()
    arrays = (p.seq_ids, p.query_starts, p.first_positions, p.context_lens, p.visible_starts)
    groups = tuple((g.slots.tolist(), g.copies.tolist(), g.block_tables.tolist()) for g in p.groups)
    return tuple(a.tolist() for a in arrays), groups


class Rig:
    """made(), with a step over 0 and 1 begun: a refusal must leave it begun."""

    def __init__(self) -> None:
        self.cache = made()
        self.step = self.cache.begin_step([(0, 1), (1, 2)])
        self.tables = [g.block_tables for g in self.step.plan().groups]

    def state(self) -> tuple[Any, ...]:
        return state(self.cache), tuple(t.tobytes() for t in self.tables), self.step.is_current


@pytest.fixture
def rig() -> Rig:
    return Rig()


def refused(rig: Rig, call: Callable[[], object], cls: type[BaseException], text: str) -> None:
    """`call` raises `cls` with `text` in its one-line message, and changes nothing."""
    before = rig.state()
    with pytest.raises(cls) as info:
        call()
    assert text in str(info.value), f"{str(info.value)!r} does not name {text!r}"
    assert "\n" not in str(info.value)
    assert rig.state() == before


# --- the array form plans what the list form plans ------------------------------------------------

I32, I64 = np.int32, np.int64


@pytest.mark.parametrize(
    "entries, arrays",
    [
        ([(0, 1), (1, 2)], dict(entries=np.array([0, 1], I32), T=np.array([1, 2], I32))),
        ([(0, 1), (1, 2)], dict(entries=np.array([0, 1], I64), T=np.array([1, 2], I64))),
        ([(0, 1), (1, 2)], dict(entries=[0, 1], T=[1, 2])),
        ([(0, 1), (1, 2)], dict(entries=array.array("i", [0, 1]), T=array.array("q", [1, 2]))),
        ([(2, 3), (0, 3)], dict(entries=np.array([2, 0], I32), T=3)),
        ([(2, 3), (0, 3)], dict(entries=np.array([2, 0], I32), T=np.int64(3))),
        ([(2, 2, [1, 2]), (0, 1, [7])], dict(entries=np.array([2, 0]), T=np.array([2, 1]),
                                              tokens=np.array([1, 2, 7], I32))),
        ([(2, 2, [1, 2]), (0, 1, [7])], dict(entries=np.array([2, 0]), T=np.array([2, 1]),
                                              tokens=np.array([1, 2, 7], I64))),
        ([(2, 2, [1, 2]), (0, 1, [7])], dict(entries=[2, 0], T=[2, 1], tokens=[1, 2, 7], token_offsets=[0, 2, 3])),
        ([(2, 2), (0, 1, [7])], dict(entries=np.array([2, 0]), T=np.array([2, 1]), tokens=np.array([7], I32),
                                     token_offsets=np.array([0, 0, 1], I32))),
        ([(2, 2, [1, 2]), (0, 1)], dict(entries=np.array([2, 0]), T=np.array([2, 1]), tokens=np.array([1, 2], I32),
                                        token_offsets=np.array([0, 2, 2], I64))),
    ],
)
def test_the_array_form_plans_what_the_list_form_plans(entries: Any, arrays: dict[str, Any]) -> None:
    by_list, by_arrays = made(), made()
    a, b = by_list.begin_step(entries), by_arrays.begin_step(**arrays)
    assert plan_of(a) == plan_of(b)
    a.commit()
    b.commit()
    assert state(by_list) == state(by_arrays)
    # Token ids given by either form key the same blocks for reuse.
    for c in (by_list, by_arrays):
        c.add_sequence(3)
    assert by_list.adopt_prefix(3, [1, 2, 7, 9]) == by_arrays.adopt_prefix(3, [1, 2, 7, 9])
    assert state(by_list) == state(by_arrays)


def test_step_takes_the_array_form_as_a_context_manager() -> None:
    c = made()
    with c.step(np.array([0, 1], I32), 1, tokens=np.array([7, 8], I32)) as step:
        assert step.plan().seq_ids.tolist() == [0, 1]
    assert (c.length(0), c.length(1)) == (7, 6)


def test_torch_tensors_are_taken_through_dlpack() -> None:
    torch = need("torch")
    by_list, by_tensors = made(), made()
    a = by_list.begin_step([(0, 1, [7]), (1, 2, [8, 9])])
    b = by_tensors.begin_step(torch.tensor([0, 1], dtype=torch.int32), torch.tensor([1, 2]),
                              tokens=torch.tensor([7, 8, 9], dtype=torch.int32))
    assert plan_of(a) == plan_of(b)


def test_a_tensor_numpy_cannot_read_in_place_is_refused(rig: Rig) -> None:
    torch = need("torch")
    meta = torch.zeros(2, dtype=torch.int32, device="meta")
    refused(rig, lambda: rig.cache.begin_step(meta, 1), kvcore.InvalidArgumentError,
            "begin_step: seqs: numpy cannot read this DLPack tensor in place")


# --- plan arrays: zero-copy numpy, zero-copy torch --------------------------------------------------

def test_plan_arrays_reach_torch_without_a_copy_or_a_warning() -> None:
    torch = need("torch")
    c = made()
    plan = c.begin_step(np.array([0, 1], I32), 1).plan()
    for a in (plan.seq_ids, plan.query_starts, plan.context_lens, plan.groups[0].slots, plan.groups[1].block_tables):
        assert not a.flags.writeable
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            t = torch.from_dlpack(a)
        assert t.data_ptr() == a.ctypes.data and t.dtype == torch.int32
        assert t.tolist() == a.tolist()


# --- bad arrays: a clear error, nothing changed -------------------------------------------------------

BAD_STEPS: list[tuple[str, dict[str, Any], type[BaseException], str]] = [
    ("seqs float", dict(entries=np.array([0.0, 1.0]), T=1), kvcore.InvalidArgumentError,
     "begin_step: seqs.dtype = float64: must be int32 or int64"),
    ("seqs uint32", dict(entries=np.array([0, 1], np.uint32), T=1), kvcore.InvalidArgumentError,
     "begin_step: seqs.dtype = uint32: must be int32 or int64"),
    ("seqs int16", dict(entries=np.array([0, 1], np.int16), T=1), kvcore.InvalidArgumentError,
     "begin_step: seqs.dtype = int16: must be int32 or int64"),
    ("seqs bytes", dict(entries=array.array("b", [0, 1]), T=1), kvcore.InvalidArgumentError,
     "begin_step: seqs.dtype = format 'b': must be int32 or int64"),
    ("seqs 2-D", dict(entries=np.zeros((2, 1), I32), T=1), kvcore.InvalidArgumentError,
     "begin_step: seqs has 2 dimensions: must be 1-D"),
    ("seqs 0-D", dict(entries=np.array(0, I32), T=1), kvcore.InvalidArgumentError,
     "begin_step: seqs has 0 dimensions: must be 1-D"),
    ("seqs strided", dict(entries=np.array([0, 9, 1], I32)[::2], T=1), kvcore.InvalidArgumentError,
     "begin_step: seqs is not contiguous: use numpy.ascontiguousarray"),
    ("seqs a str", dict(entries="01", T=1), kvcore.InvalidArgumentError,
     "begin_step: seqs must be a 1-D int32 or int64 array"),
    ("seqs item not an int", dict(entries=[0, "1"], T=1), TypeError,
     "begin_step: seqs[1] = '1': must be an int, got str"),
    ("seqs item beyond 64 bits", dict(entries=[2**70], T=1), kvcore.InvalidArgumentError,
     "begin_step: seqs[0] = 1180591620717411303424: must fit in a 32-bit signed int"),
    ("seqs beyond 32 bits", dict(entries=np.array([0, 2**32]), T=1), kvcore.InvalidArgumentError,
     "begin_step: seqs[1] = 4294967296: must fit in a 32-bit signed int"),
    ("seqs negative", dict(entries=np.array([0, -1], I32), T=1), kvcore.InvalidArgumentError,
     "begin_step: sequence -1 must be in [0, max_seqs = 4)"),
    ("seqs past max_seqs", dict(entries=np.array([4], I32), T=1), kvcore.InvalidArgumentError,
     "begin_step: sequence 4 must be in [0, max_seqs = 4)"),
    ("seqs repeated", dict(entries=np.array([0, 0], I32), T=1), kvcore.InvalidArgumentError,
     "begin_step: sequence 0 appears twice"),
    ("seqs inactive", dict(entries=np.array([3], I32), T=1), kvcore.InvalidStateError,
     "begin_step: sequence 3 is not active"),
    ("seqs empty", dict(entries=np.array([], I32), T=1), kvcore.InvalidArgumentError,
     "begin_step: 0 entries, must be in [1, max_seqs = 4]"),
    ("seqs too many", dict(entries=np.arange(5, dtype=I32), T=1), kvcore.InvalidArgumentError,
     "begin_step: 5 entries, must be in [1, max_seqs = 4]"),
    ("T too few", dict(entries=np.array([0, 1], I32), T=np.array([1], I32)), kvcore.InvalidArgumentError,
     "begin_step: T has 1 values for 2 sequences: give one per sequence, or one int for all"),
    ("T float", dict(entries=np.array([0, 1], I32), T=np.array([1.0, 1.0])), kvcore.InvalidArgumentError,
     "begin_step: T.dtype = float64: must be int32 or int64"),
    ("T a float", dict(entries=np.array([0, 1], I32), T=1.5), kvcore.InvalidArgumentError,
     "begin_step: T must be a 1-D int32 or int64 array"),
    ("T zero", dict(entries=np.array([0, 1], I32), T=0), kvcore.InvalidArgumentError,
     "begin_step: sequence 0 with T = 0, must be in [1, max_step = 4]"),
    ("T negative", dict(entries=np.array([0, 1], I32), T=np.array([1, -2], I32)), kvcore.InvalidArgumentError,
     "begin_step: sequence 1 with T = -2, must be in [1, max_step = 4]"),
    ("tokens too few", dict(entries=np.array([0, 1], I32), T=1, tokens=np.array([7], I32)),
     kvcore.InvalidArgumentError, "begin_step: tokens has 1 ids, the entries' T add up to 2"),
    ("tokens float", dict(entries=np.array([0, 1], I32), T=1, tokens=np.array([7.0, 8.0])),
     kvcore.InvalidArgumentError, "begin_step: tokens.dtype = float64: must be int32 or int64"),
    ("tokens beyond 32 bits", dict(entries=np.array([0, 1], I32), T=1, tokens=np.array([7, 2**31])),
     kvcore.InvalidArgumentError, "begin_step: tokens[1] = 2147483648: must fit in a 32-bit signed int"),
    ("tokens strided", dict(entries=np.array([0, 1], I32), T=1, tokens=np.arange(4, dtype=I32)[::2]),
     kvcore.InvalidArgumentError, "begin_step: tokens is not contiguous"),
    ("offsets without tokens", dict(entries=np.array([0, 1], I32), T=1, token_offsets=np.array([0, 1, 2])),
     kvcore.InvalidArgumentError, "begin_step: token_offsets given without tokens"),
    ("offsets without tokens, with parents",
     dict(entries=np.array([0, 1], I32), T=1, token_offsets=np.array([0, 1, 2]), parents=np.array([-1, -1], I32)),
     kvcore.InvalidArgumentError, "begin_step: token_offsets given without tokens"),
    ("offsets too few", dict(entries=np.array([0, 1], I32), T=1, tokens=np.array([7, 8], I32),
                             token_offsets=np.array([0, 2])),
     kvcore.InvalidArgumentError, "begin_step: token_offsets has 2 values for 2 sequences: must have n + 1 = 3"),
    ("offsets not from 0", dict(entries=np.array([0, 1], I32), T=1, tokens=np.array([7, 8], I32),
                                token_offsets=np.array([1, 1, 2])),
     kvcore.InvalidArgumentError, "begin_step: token_offsets[0] = 1: must be 0"),
    ("offsets not to the end", dict(entries=np.array([0, 1], I32), T=1, tokens=np.array([7, 8, 9], I32),
                                    token_offsets=np.array([0, 1, 2])),
     kvcore.InvalidArgumentError, "begin_step: token_offsets[2] = 2: must be len(tokens) = 3"),
    ("offsets decreasing", dict(entries=np.array([0, 1, 2], I32), T=np.array([2, 1, 1]), tokens=np.array([7, 8], I32),
                                token_offsets=np.array([0, 2, 1, 2])),
     kvcore.InvalidArgumentError, "begin_step: token_offsets[2] = 1 < token_offsets[1] = 2: must not decrease"),
    ("offsets not T", dict(entries=np.array([0, 1], I32), T=2, tokens=np.array([7, 8, 9], I32),
                           token_offsets=np.array([0, 1, 3])),
     kvcore.InvalidArgumentError, "begin_step: sequence 0 has T = 2 but token_offsets gives it 1 tokens"),
    ("offsets 2-D", dict(entries=np.array([0, 1], I32), T=1, tokens=np.array([7, 8], I32),
                         token_offsets=np.array([[0, 1, 2]])),
     kvcore.InvalidArgumentError, "begin_step: token_offsets has 2 dimensions: must be 1-D"),
    ("tokens without T", dict(entries=[(0, 1)], tokens=np.array([7], I32)), kvcore.InvalidArgumentError,
     "begin_step: tokens, token_offsets and parents need seqs and T as arrays"),
]


@pytest.mark.parametrize("how", ["begin_step", "step"])
@pytest.mark.parametrize("name, kwargs, cls, text", BAD_STEPS, ids=[b[0] for b in BAD_STEPS])
def test_a_bad_array_is_refused_naming_it_and_changes_nothing(
    rig: Rig, how: str, name: str, kwargs: dict[str, Any], cls: type[BaseException], text: str
) -> None:
    refused(rig, lambda: getattr(rig.cache, how)(**kwargs), cls, text)


def test_a_step_past_capacity_from_arrays_is_a_capacity_error(rig: Rig) -> None:
    c = rig.cache
    for _ in range(2):
        c.step(np.array([0], I32), 4).commit()  # length 14 of 16
    rig.step = c.begin_step([(1, 1)])
    rig.tables = [g.block_tables for g in rig.step.plan().groups]
    refused(rig, lambda: c.begin_step(np.array([1, 0], I32), np.array([1, 3], I32)), kvcore.CapacityError,
            "begin_step: sequence 0 at length 14 with T = 3 would pass capacity = 16")


@pytest.mark.parametrize("entries", [5, None, np.array([0, 1], I32)], ids=["int", "None", "array"])
def test_begin_step_of_what_it_does_not_take_says_what_it_takes(rig: Rig, entries: Any) -> None:
    text = "begin_step takes entries [(seq, T), (seq, T, tokens) or (seq, T, tokens, parents), ...] or arrays (seqs, T, "
    refused(rig, lambda: rig.cache.begin_step(entries), TypeError, text)
    refused(rig, lambda: rig.cache.step(entries), TypeError, text)


# --- a sequence id that is not an int: one line naming it ----------------------------------------------

@pytest.mark.parametrize(
    "call, text",
    [
        (lambda c: c.add_sequence("a"), "seq = 'a': must be an int, got str"),
        (lambda c: c.release_sequence(1.5), "seq = 1.5: must be an int, got float"),
        (lambda c: c.fork(0, "3"), "dst = '3': must be an int, got str"),
        (lambda c: c.fork(0, 3, upto="2"), "upto = '2': must be an int, got str"),
        (lambda c: c.rewind("0", 1), "seq = '0': must be an int, got str"),
        (lambda c: c.remove(0, 1, p1=2.0), "p1 = 2.0: must be an int, got float"),
        (lambda c: c.sequence(None), "seq = None: must be an int, got NoneType"),
        (lambda c: c.length([0]), "seq = [0]: must be an int, got list"),
        (lambda c: c.blocks_held(0, "x"), "group = 'x': must be an int, got str"),
        (lambda c: c.can_rewind("0", 1), "seq = '0': must be an int, got str"),
        (lambda c: c.adopt_prefix("2", [1]), "seq = '2': must be an int, got str"),
        (lambda c: c.fork_many("0", [3]), "src = '0': must be an int, got str"),
    ],
)
def test_an_id_that_is_not_an_int_is_one_line_naming_it(rig: Rig, call: Callable[[Any], object], text: str) -> None:
    before = rig.state()
    with pytest.raises(TypeError) as info:
        call(rig.cache)
    assert str(info.value) == text
    assert rig.state() == before


# --- many sequences in one call -------------------------------------------------------------------------

def test_plan_arrays_in_one_call_are_the_properties_views() -> None:
    """plan.arrays(): every array in one call, the same zero-copy read-only views."""
    c = made()
    step = c.begin_step([(0, 1), (1, 2)])
    p = step.plan()
    seq_ids, query_starts, first_positions, context_lens, visible_starts, table_rows, groups = p.arrays()
    singles = (p.seq_ids, p.query_starts, p.first_positions, p.context_lens, p.visible_starts, p.table_rows)
    every = [(seq_ids, singles[0]), (query_starts, singles[1]), (first_positions, singles[2]),
             (context_lens, singles[3]), (visible_starts, singles[4]), (table_rows, singles[5])]
    assert len(groups) == c.n_groups
    for (slots, copies, tables), g in zip(groups, p.groups):
        every += [(slots, g.slots), (copies, g.copies), (tables, g.block_tables)]
    for one, single in every:
        assert one.dtype == np.int32 and one.shape == single.shape and one.tolist() == single.tolist()
        assert not one.flags.writeable and (one.size == 0 or np.shares_memory(one, single))
    assert seq_ids.tolist() == [0, 1] and context_lens.tolist() == [7, 7]
    step.commit()
    with pytest.raises(kvcore.InvalidStateError, match="no step is begun"):
        p.arrays()


def test_add_and_release_sequences_match_one_by_one() -> None:
    one, many = made(), made()
    one.release_sequence(0)
    one.release_sequence(2)
    one.add_sequence(3)
    one.add_sequence(0)
    many.release_sequences(np.array([0, 2], I32))
    many.add_sequences([3, 0])
    assert state(one) == state(many)
    many.add_sequences(np.array([], I64))  # no step begun: nothing happens
    many.release_sequences([])
    assert state(one) == state(many)


def test_fork_many_matches_forks_one_by_one() -> None:
    one, many = made(), made()
    for d in (2, 3):
        one.fork(0, d, 5)
    many.fork_many(0, np.array([2, 3], I64), upto=5)
    assert state(one) == state(many)
    one.release_sequences([2, 3])
    many.release_sequences([2, 3])
    one.fork(1, 2)
    one.fork(1, 3)
    many.fork_many(1, [2, 3])  # upto: all of src
    assert state(one) == state(many)


MANY: list[tuple[str, Callable[[kvcore.BatchCache], object], type[BaseException], str]] = [
    ("add: out of range", lambda c: c.add_sequences([3, 4]), kvcore.InvalidArgumentError,
     "add_sequences: seqs[1] = 4: must be in [0, max_seqs = 4)"),
    ("add: negative", lambda c: c.add_sequences(np.array([-1], I32)), kvcore.InvalidArgumentError,
     "add_sequences: seqs[0] = -1: must be in [0, max_seqs = 4)"),
    ("add: repeated", lambda c: c.add_sequences(np.array([3, 3], I32)), kvcore.InvalidArgumentError,
     "add_sequences: sequence 3 appears twice in seqs"),
    ("add: active", lambda c: c.add_sequences(np.array([3, 2], I32)), kvcore.InvalidStateError,
     "add_sequences: sequence 2 is already active"),
    ("add: dtype", lambda c: c.add_sequences(np.array([3.0])), kvcore.InvalidArgumentError,
     "add_sequences: seqs.dtype = float64: must be int32 or int64"),
    ("add: 2-D", lambda c: c.add_sequences(np.array([[3]], I32)), kvcore.InvalidArgumentError,
     "add_sequences: seqs has 2 dimensions: must be 1-D"),
    ("add: item", lambda c: c.add_sequences([3, None]), TypeError,
     "add_sequences: seqs[1] = None: must be an int, got NoneType"),
    ("release: inactive", lambda c: c.release_sequences(np.array([2, 3], I32)), kvcore.InvalidStateError,
     "release_sequences: sequence 3 is not active"),
    ("release: repeated", lambda c: c.release_sequences([2, 2]), kvcore.InvalidArgumentError,
     "release_sequences: sequence 2 appears twice in seqs"),
    ("release: strided", lambda c: c.release_sequences(np.arange(4, dtype=I32)[::2]), kvcore.InvalidArgumentError,
     "release_sequences: seqs is not contiguous"),
    ("fork: src out of range", lambda c: c.fork_many(4, [3]), kvcore.InvalidArgumentError,
     "fork_many: src = 4: must be in [0, max_seqs = 4)"),
    ("fork: src inactive", lambda c: c.fork_many(3, [2]), kvcore.InvalidStateError,
     "fork_many: src = 3 is not active (add_sequence or fork it first)"),
    ("fork: upto past length", lambda c: c.fork_many(0, [3], upto=7), kvcore.InvalidArgumentError,
     "fork_many: upto = 7: must be in [0, length = 6] of src 0"),
    ("fork: dst is src", lambda c: c.fork_many(0, [3, 0]), kvcore.InvalidArgumentError,
     "fork_many: dsts[1] = 0 is src: a sequence cannot fork into itself"),
    ("fork: dst repeated", lambda c: c.fork_many(0, np.array([3, 3], I32)), kvcore.InvalidArgumentError,
     "fork_many: sequence 3 appears twice in dsts"),
    ("fork: dst out of range", lambda c: c.fork_many(0, [3, 9]), kvcore.InvalidArgumentError,
     "fork_many: dsts[1] = 9: must be in [0, max_seqs = 4)"),
    ("fork: dst not empty", lambda c: c.fork_many(0, [3, 1]), kvcore.InvalidStateError,
     "fork_many: dst 1 holds 5 positions; it must be empty"),
    ("fork: dsts dtype", lambda c: c.fork_many(0, np.array([3], np.uint8)), kvcore.InvalidArgumentError,
     "fork_many: dsts.dtype = uint8: must be int32 or int64"),
    ("needed: lengths differ", lambda c: c.blocks_needed([0, 1], [1]), kvcore.InvalidArgumentError,
     "blocks_needed: seq (2 entries) and T (1): must be arrays of one length"),
    ("needed: int and array", lambda c: c.blocks_needed(0, [1]), kvcore.InvalidArgumentError,
     "blocks_needed: seq must be a 1-D int32 or int64 array"),
    ("needed: entry inactive", lambda c: c.blocks_needed([0, 3], [1, 1]), kvcore.InvalidStateError,
     "entry 1: blocks_needed: sequence 3 is not active"),
    ("needed: entry T", lambda c: c.blocks_needed([0, 1, 2], [1, 1, 5]), kvcore.InvalidArgumentError,
     "entry 2: blocks_needed(2, T = 5): must be in [1, max_step = 4]"),
    ("needed: entry seq", lambda c: c.blocks_needed(np.array([7], I32), [1]), kvcore.InvalidArgumentError,
     "entry 0: blocks_needed: sequence 7 must be in [0, max_seqs = 4)"),
    ("needed: seq dtype", lambda c: c.blocks_needed(np.array([0], np.uint8), [1]), kvcore.InvalidArgumentError,
     "blocks_needed: seq.dtype = uint8: must be int32 or int64"),
]


@pytest.mark.parametrize("name, call, cls, text", MANY, ids=[m[0] for m in MANY])
def test_a_refused_many_sequence_verb_changes_nothing(
    rig: Rig, name: str, call: Callable[[kvcore.BatchCache], object], cls: type[BaseException], text: str
) -> None:
    refused(rig, lambda: call(rig.cache), cls, text)


def test_blocks_needed_of_arrays_is_each_entry_counted_alone() -> None:
    # Sequence 0 at length 6; 1 a fork of it at 5, sharing its blocks; 2 active and empty.
    c = made()
    seqs = [s for s in (0, 1, 2) for _ in range(1, 5)]
    ts = [t for _ in (0, 1, 2) for t in range(1, 5)]
    before = state(c)
    need = c.blocks_needed(np.array(seqs, I64), np.array(ts, I32))
    assert need.dtype == I32 and need.shape == (len(seqs), c.n_groups)
    assert need.tolist() == [c.blocks_needed(s, t) for s, t in zip(seqs, ts)]
    # Sequence 1's one token at position 5 writes no new block, only the private copy of the
    # block [4, 6) it shares with 0, in each group.
    assert need[seqs.index(1)].tolist() == [1] * c.n_groups
    assert c.blocks_needed(seqs, ts).tolist() == need.tolist()  # lists too
    assert c.blocks_needed(np.array([], I32), []).shape == (0, c.n_groups)
    assert state(c) == before


def test_fork_many_refuses_a_source_whose_ring_released_what_upto_needs() -> None:
    c = kvcore.BatchCache(config())
    c.add_sequence(0)
    for _ in range(3):
        c.step([(0, 4)]).commit()  # length 12: the ring (window 3) released early blocks
    assert not c.can_rewind(0, 4)
    c.add_sequence(2)
    before = state(c)
    with pytest.raises(kvcore.InvalidStateError) as info:
        c.fork_many(0, [1, 2], upto=4)
    assert str(info.value) == "fork_many: src 0 no longer holds what a query at 4 needs (a ring group released it)"
    assert state(c) == before


class _Int(int):
    """An int subclass: not an exact int, read through __index__ like any other."""


@pytest.mark.parametrize(
    "tokens",
    [
        list(range(100, 700)),                            # exact ints, more than the inline storage (256)
        tuple(range(100, 700)),                           # a tuple the same
        [100, True, 102] + list(range(103, 700)),         # a bool among them: an int in Python
        [_Int(100)] + list(range(101, 700)),              # an int subclass
        np.arange(100, 700, dtype=np.int64).tolist(),     # what tolist() gives
    ],
    ids=["list", "tuple", "bool", "subclass", "tolist"],
)
def test_a_prompt_as_a_list_adopts_what_the_array_adopts(tokens: Any) -> None:
    """adopt_prefix and begin_step read a list of ints (the exact-int fast path
    or item by item) exactly as the same ids as an int32 array."""
    hits = []
    for form in (np.array([int(t) for t in tokens], I32), tokens):
        c = kvcore.BatchCache(kvcore.CacheConfig(1024, [kvcore.LayerConfig(kvcore.Flat(), 1, 2)], max_step=4,
                                                 batch=kvcore.BatchLimits(block_size=4, max_seqs=2)))
        c.add_sequence(0)
        ids = [int(t) for t in tokens]
        for at in range(0, len(ids), 4):
            c.step([(0, len(ids[at:at + 4]), ids[at:at + 4])]).commit()
        c.add_sequence(1)
        hit = c.adopt_prefix(1, form)
        T = min(4, len(ids) - hit)  # the first step after the hit, its ids a slice of the same form
        step = c.begin_step(np.array([1], I32), T, form[hit:hit + T])
        hits.append((hit, plan_of(step)))
        step.commit()
    assert hits[0] == hits[1]


@pytest.mark.parametrize(
    "bad, text",
    [
        ([1, 2**31], "adopt_prefix: tokens[1] = 2147483648: must fit in a 32-bit signed int"),
        ([1, -2**31 - 1], "adopt_prefix: tokens[1] = -2147483649: must fit in a 32-bit signed int"),
        ([1, 2**70], "adopt_prefix: tokens[1] = 1180591620717411303424: must fit in a 32-bit signed int"),
        (list(range(300)) + [2**31], "adopt_prefix: tokens[300] = 2147483648: must fit in a 32-bit signed int"),
    ],
    ids=["int32+1", "int32-1", "beyond int64", "past the inline storage"],
)
def test_a_list_token_beyond_int32_is_named_on_the_fast_path_too(bad: list[int], text: str) -> None:
    c = kvcore.BatchCache(config())
    c.add_sequence(0)
    with pytest.raises(kvcore.InvalidArgumentError, match="^" + text.replace("[", r"\[").replace("]", r"\]")):
        c.adopt_prefix(0, bad)
    assert c.sequence(0).length == 0
    with pytest.raises(TypeError, match=r"adopt_prefix: tokens\[2\] = 1.5: must be an int, got float"):
        c.adopt_prefix(0, [1, 2, 1.5])


def test_plan_arrays_are_handed_out_again_while_nothing_changed_and_keep_the_cache_alive() -> None:
    """A decode step's arrays are the same buffers and shapes step after step:
    arrays() gives the same read-only views again (the same memory a fresh view
    would show), new ones where a pointer or shape changed; the views keep the
    cache's buffers alive after the cache object is gone, and do not keep the
    cache object itself alive."""
    import gc
    import weakref

    c = made()
    seqs = np.array([0, 2], I32)
    step = c.begin_step(seqs, 1, np.array([7, 8], I32))
    first = step.plan().arrays()
    step.commit()
    step = c.begin_step(seqs, 1, np.array([9, 10], I32))
    again = step.plan().arrays()
    assert again is first
    assert again[3].tolist() == [8, 2] and again[0].tolist() == [0, 2]
    step.commit()
    step = c.begin_step(np.array([0], I32), 1, np.array([11], I32))
    fewer = step.plan().arrays()
    assert fewer is not again and fewer[0].tolist() == [0] and fewer[3].tolist() == [9]
    assert fewer[5] is again[5]  # table_rows: same buffer, same shape
    for a in fewer[:6] + tuple(x for g in fewer[6] for x in g):
        assert not a.flags.writeable
        with pytest.raises(ValueError):
            a.setflags(write=True)
    step.commit()
    tables = fewer[6][0][2]
    expected = tables.tolist()
    alive = weakref.ref(c)
    del c, step, first, again, fewer
    gc.collect()
    assert alive() is None
    assert tables.tolist() == expected  # the buffers outlive the cache object
