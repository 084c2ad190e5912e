"""docs/design.md section 9 through the Python module: chunked, shared-K/V and
recurrent-state layers (Chunked, Shared, State), verify steps, and every
refusal of the new kinds naming its value and rule. The brute-force oracle of
every rule is tests/cpp/layer_kinds_brute_force_test.cpp; here the bindings
are held to the same rules on random steps."""

from __future__ import annotations

import random

import numpy as np
import pytest

import kvcore
from kvcore import (
    BatchCache,
    CacheConfig,
    Chunked,
    Flat,
    InvalidArgumentError,
    InvalidStateError,
    LayerConfig,
    LayerPolicy,
    PagedKVPool,
    Ring,
    SequenceCache,
    Shared,
    State,
)


def kv(policy: LayerPolicy) -> LayerConfig:
    """A layer of 2 K/V heads x 8."""
    return LayerConfig(policy, 2, 8)


def test_factories_carry_their_fields_and_compare_by_every_field() -> None:
    assert Chunked(8).kind == LayerPolicy.Kind.Chunked and Chunked(8).window == 8
    assert Shared(3).kind == LayerPolicy.Kind.Shared and Shared(3).source == 3
    assert State(4).kind == LayerPolicy.Kind.State and State(4).slots == 4
    assert [repr(p) for p in (Chunked(8), Shared(3), State(4))] == ["Chunked(chunk=8)", "Shared(source=3)", "State(slots=4)"]
    assert Shared(1) != Shared(2) and State(2) != State(3) and Chunked(4) != Ring(4)
    assert len({Shared(1), Shared(2), State(2), State(3), Chunked(4), Ring(4)}) == 6
    assert LayerConfig(State(3)).n_kv_heads == 0


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: Chunked(0), "chunk = 0: a Chunked layer needs chunk >= 1"),
        (lambda: State(0), "slots = 0: a State layer needs slots >= 1"),
        (lambda: Shared(-1), "source = -1: a Shared layer's source is a layer index >= 0"),
        (lambda: LayerConfig(State(3), 1, 4), "a State layer holds no K/V rows: needs n_kv_heads = head_dim = v_head_dim = 0 (got 1, 4, 0)"),
        (lambda: LayerConfig(Shared(0), 0, 4), "n_kv_heads = 0: must be >= 1"),
        (lambda: LayerConfig(Chunked(4)), "n_kv_heads = 0: must be >= 1"),
    ],
)
def test_bad_policies_and_layers_are_refused_by_name(make: object, message: str) -> None:
    with pytest.raises(InvalidArgumentError) as e:
        make()  # type: ignore[operator]
    assert message in str(e.value)


@pytest.mark.parametrize(
    "layers, message",
    [
        ([kv(Flat()), kv(Shared(1))], "layers[1].policy.source = 1: a Shared layer reads an earlier layer: needs 0 <= source < 1"),
        ([LayerConfig(State(2)), kv(Shared(0))], "layer 0 is kind 4; a Shared layer's source must hold K/V rows"),
        ([kv(Flat()), LayerConfig(Shared(0), 2, 4)], "needs its n_kv_heads, head_dim, v_head_dim (2, 4, 4) equal to the source's (2, 8, 8)"),
    ],
)
def test_a_shared_layers_source_is_checked_by_the_config(layers: list[LayerConfig], message: str) -> None:
    with pytest.raises(InvalidArgumentError) as e:
        CacheConfig(capacity=32, layers=layers, max_step=4)
    assert message in str(e.value)


def test_a_shared_layer_reads_its_sources_rows_and_masks_as_it() -> None:
    cache = SequenceCache(CacheConfig(capacity=64, layers=[kv(Ring(6, 1)), kv(Flat()), kv(Shared(0))], max_step=4))
    assert cache.rows(2) == 0 and cache.row_layer(2) == 0 and cache.row_layer(1) == 1
    for T in (3, 4, 4, 2, 4):
        step = cache.begin_step(T)
        source, shared = step.plan(0), step.plan(2)
        assert list(shared.write) == [] and shared.read == source.read
        for order in ("rows", "positions"):
            assert np.array_equal(step.mask(2, order=order), step.mask(0, order=order))
        cache.commit(step)


def test_chunked_masks_follow_the_chunk_rule_on_random_steps() -> None:
    rng = random.Random(7)
    for _ in range(30):
        K, C = rng.randint(1, 9), rng.randint(1, 5)
        cache = SequenceCache(CacheConfig(capacity=200, layers=kv(Chunked(K)), max_step=C))
        while cache.can_extend(C):
            step = cache.begin_step(rng.randint(1, C))
            read = [r.pos + j for r in step.plan(0).read for j in range(r.len)]
            mask = step.mask(0, order="positions")
            for i in range(step.T):
                q = step.position + i
                assert [bool(m) for m in mask[i]] == [k <= q and k // K == q // K for k in read]
                assert all(k in read for k in range(q - q % K, q + 1))  # every key of its chunk is read
            cache.commit(step)


def test_a_state_layer_keeps_every_state_of_a_verify_step_and_only_the_last_otherwise() -> None:
    cache = SequenceCache(CacheConfig(capacity=64, layers=[kv(Flat()), LayerConfig(State(5))], max_step=4))
    step = cache.begin_step(4)
    assert not step.verify and list(step.plan(1).read) == [] and [tuple(r) for r in step.plan(1).write] == [(3, 1, 3)]
    cache.commit(step)
    assert [cache.can_rewind(n) for n in range(5)] == [True, False, False, False, True]
    step = cache.begin_step(3, verify=True)
    assert step.verify and [tuple(r) for r in step.plan(1).read] == [(3, 1, 3)]
    assert [tuple(r) for r in step.plan(1).write] == [(4, 1, 4), (0, 2, 5)]
    cache.commit(step, [0, 1])  # a partial commit: the state after 5 is held
    assert cache.length == 6 and cache.can_rewind(5)
    small = SequenceCache(CacheConfig(capacity=64, layers=[kv(Flat()), LayerConfig(State(3))], max_step=4))
    with pytest.raises(InvalidArgumentError, match=r"T = 3: a verify or tree step keeps the state after each of its positions, and layer 1 keeps 3 state slots: needs T <= slots - 1 = 2"):
        small.begin_step(3, verify=True)
    with pytest.raises(InvalidArgumentError, match=r"needs T <= slots - 1 = 2"):
        small.begin_tree([-1, 0, 0])
    small.begin_step(3)  # keeps only its last state
    step = cache.begin_step(3)
    with pytest.raises(InvalidStateError, match=r"layer 1 no longer holds the state after position 6"):
        step.commit([0])
    assert step.is_current  # nothing changed
    with pytest.raises(InvalidArgumentError, match=r"mask: layer 1 is a State layer"):
        step.mask(1)


def test_an_abort_that_overwrote_the_read_slot_blocks_the_next_step_until_a_rewind() -> None:
    cache = SequenceCache(CacheConfig(capacity=64, layers=LayerConfig(State(2)), max_step=4))
    cache.commit(cache.begin_step(3))
    cache.begin_step(2).abort()  # its last state went to slot 0, over the state after 2
    with pytest.raises(InvalidStateError, match=r"no longer holds the state after position 2 \(an aborted step overwrote its slot\)"):
        cache.begin_step(1)
    assert cache.length == 3 and not cache.can_rewind(3)
    cache.rewind(0)
    cache.commit(cache.begin_step(1))


def test_paged_pools_store_shared_and_state_layers() -> None:
    # KVPool stores both (test_kv_pool_kinds.py), PagedKVPool too (test_paged_pool_kinds.py).
    shared = PagedKVPool(BatchCache(CacheConfig(capacity=32, layers=[kv(Flat()), kv(Shared(0))], max_step=4)), np.float32)
    assert shared.allocated_rows(1) == 0
    # BatchCache keeps State layers in a State group (docs/batch.md); PagedKVPool stores its slots.
    hybrid = BatchCache(CacheConfig(capacity=32, layers=[kv(Flat()), LayerConfig(State(3))], max_step=4))
    pool = PagedKVPool(hybrid, np.float32, state_tensors={"h": ((2,), np.float32)})
    assert pool.state_slots(1, "h").shape == (hybrid.num_state_slots(0), 2)
    batch = BatchCache(CacheConfig(capacity=32, layers=[kv(Chunked(8)), kv(Flat()), kv(Shared(0))], max_step=4))
    assert batch.group_of(2) == batch.group_of(0) != batch.group_of(1)


def test_every_kind_is_exported_by_name() -> None:
    assert {"Chunked", "Shared", "State"} <= set(kvcore.__all__)
