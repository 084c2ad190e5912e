"""SequenceCache through Python: the named scenarios of docs/design.md section 5 (1-9;
10 is in test_errors.py), the Step lifecycle and the plan objects.

Expectations come from docs/design.md section 2, spelled out in each test, and from
the brute-force reference (reference.py), never from kvcore's own output.
"""

from __future__ import annotations

import pytest

import kvcore
from conftest import MakeCache
from reference import Lockstep, expand, observe


def positions(runs: tuple[kvcore.Run, ...]) -> list[int]:
    return [p for _, p in expand(runs)]


# --- docs/design.md section 5 -------------------------------------------------------


def test_scenario_1_flat_steps_of_1_5_and_max_step_read_one_run(make_cache: MakeCache) -> None:
    cache = make_cache(kvcore.Flat(), capacity=64, max_step=8)
    run = Lockstep(cache)
    for T in (1, 5, 8, 1, 8, 5):
        P = cache.length
        step = run.begin(T)
        plan = step.plan(0)
        # Flat: row(p) = p, write [P, P+T) in one run, read [0, P+T) in one run.
        assert plan.write == (kvcore.Run(row=P, len=T, pos=P),)
        assert plan.read == (kvcore.Run(row=0, len=P + T, pos=0),)
        assert plan.is_contiguous and plan.write_len == T and plan.read_len == P + T
        run.commit()
    assert cache.rows(0) == 64  # Flat rows = capacity


def test_scenario_2_ring_w4_c1_decoding_wraps_into_two_runs(make_cache: MakeCache) -> None:
    cache = make_cache(kvcore.Ring(window=4), capacity=64, max_step=1)
    assert cache.rows(0) == 4  # R = W + C - 1 = 4, no sinks
    run = Lockstep(cache)
    n_runs_seen = set()
    for P in range(21):
        plan = run.begin(1).plan(0)
        window = list(range(max(0, P - 3), P + 1))  # q - k < 4
        assert expand(plan.read) == [(p % 4, p) for p in window]
        assert plan.write == (kvcore.Run(row=P % 4, len=1, pos=P),)
        # Two runs exactly when the window's rows wrap past row 3.
        wrapped = any(b[0] != a[0] + 1 for a, b in zip(expand(plan.read), expand(plan.read)[1:]))
        assert len(plan.read) == (2 if wrapped else 1)
        n_runs_seen.add(len(plan.read))
        run.commit()
    assert n_runs_seen == {1, 2}


def test_scenario_3_ring_w4_c4_chunk_after_wrap_reads_w_minus_1_plus_t(make_cache: MakeCache) -> None:
    cache = make_cache(kvcore.Ring(window=4), capacity=64, max_step=4)
    assert cache.rows(0) == 7  # R = 4 + 4 - 1
    run = Lockstep(cache)
    for _ in range(4):
        run.advance(4)  # length 16: the ring has wrapped twice
    plan = run.begin(4).plan(0)
    # The first query (16) sees 13..16, the last (19) sees 16..19: 13..19.
    assert positions(plan.read) == list(range(13, 20))
    assert plan.read_len == 4 - 1 + 4
    assert len(plan.write) <= 2 and plan.write_len == 4
    run.commit()  # Lockstep already proved every read row holds its position (none stale)


def test_scenario_4_prompt_longer_than_window_in_max_step_chunks(make_cache: MakeCache) -> None:
    W, C = 6, 4
    cache = make_cache(kvcore.Ring(window=W), kvcore.Flat(), capacity=64, max_step=C)
    run = Lockstep(cache)
    prompt = 23  # > W: chunks of C, then the remainder
    while cache.length < prompt:
        T = min(C, prompt - cache.length)
        P = cache.length
        step = run.begin(T)
        assert positions(step.plan(0).read) == list(range(max(0, P - W + 1), P + T))
        assert positions(step.plan(1).read) == list(range(P + T))
        run.commit()
    for _ in range(5):  # then decode
        run.advance(1)
    assert cache.length == prompt + 5


def test_scenario_5_sinks_2_window_4_reads_sinks_plus_window(make_cache: MakeCache) -> None:
    S, W, C = 2, 4, 2
    cache = make_cache(kvcore.Ring(window=W, sinks=S), capacity=64, max_step=C)
    assert cache.rows(0) == S + W + C - 1
    run = Lockstep(cache)
    max_runs = 0
    for i in range(30):
        T = 1 + i % C
        P = cache.length
        plan = run.begin(T).plan(0)
        expected = sorted(set(range(min(S, P + T))) | set(range(max(0, P - W + 1), P + T)))
        assert positions(plan.read) == expected
        assert len(plan.read) <= 3
        max_runs = max(max_runs, len(plan.read))
        # Sinks are never evicted: positions 0 and 1 always sit in rows 0 and 1.
        if P + T > S:
            assert expand(plan.read)[:S] == [(0, 0), (1, 1)]
        run.commit()
    assert max_runs == 3  # sinks + a wrapped window happened


def test_scenario_6_mixed_model_one_length_two_policy_objects(mixed_cache: kvcore.SequenceCache) -> None:
    cache = mixed_cache
    assert cache.n_layers == 6 and cache.n_groups == 2
    assert [cache.group_of(l) for l in range(6)].count(cache.group_of(5)) == 1
    assert len({cache.group_of(l) for l in range(5)}) == 1
    assert [cache.rows(l) for l in range(6)] == [1 + 4 + 3 - 1] * 5 + [64]
    run = Lockstep(cache)
    for T in (3, 3, 1, 2, 1, 1, 3):
        P = cache.length
        step = run.begin(T)
        assert all(step.plan(l) == step.plan(0) for l in range(5))  # one ring plan
        assert positions(step.plan(5).read) == list(range(P + T))  # one length
        run.commit()
    assert cache.length == 14


@pytest.mark.parametrize("back", [1, 2, 3])
def test_scenario_7_rewind_after_wrap_by_1_to_c(make_cache: MakeCache, back: int) -> None:
    S, W, C = 1, 4, 3
    cache = make_cache(kvcore.Ring(window=W, sinks=S), kvcore.Flat(), capacity=64, max_step=C)
    run = Lockstep(cache)
    for T in (3, 3, 3, 2, 1, 1, 3):
        run.advance(T)
    L = cache.length  # 16, far past the wrap (rows = 1 + 6)
    assert cache.can_rewind(L - back)
    run.rewind(L - back)
    for T in (1, 3, 1, 2):  # decoding continues with exact reads
        run.advance(T)


def test_scenario_7_rewind_by_c_plus_1_refused_and_to_sinks_accepted(make_cache: MakeCache) -> None:
    S, W, C = 2, 4, 3
    cache = make_cache(kvcore.Ring(window=W, sinks=S), kvcore.Flat(), capacity=64, max_step=C)
    run = Lockstep(cache)
    for T in (3, 1, 3, 2, 3, 1, 1, 2):
        run.advance(T)
    L = cache.length
    assert not cache.can_rewind(L - C - 1)
    before = observe(cache)
    with pytest.raises(kvcore.InvalidStateError, match=f"rewind\\(n = {L - C - 1}\\)"):
        cache.rewind(L - C - 1)
    assert observe(cache) == before
    run.advance(1)  # nothing changed: decoding goes on exactly
    for n in range(S + 1):  # n <= S: the history a query at n needs is only sinks
        assert cache.can_rewind(n)
    run.rewind(S)
    for T in (3, 3, 1):
        run.advance(T)
    run.rewind(0)
    run.advance(2)


def test_the_rewind_margin_counts_from_the_longest_length_committed(make_cache: MakeCache) -> None:
    # docs/design.md section 2: n >= Lmax - C is always allowed. "At most C below the
    # length the last commit left" was false after a rewind and a shorter commit.
    W, C = 4, 2
    cache = make_cache(kvcore.Ring(window=W), capacity=64, max_step=C)
    run = Lockstep(cache)
    for T in (2, 2, 2, 2, 2):
        run.advance(T)
    Lmax = cache.length  # 10
    run.rewind(Lmax - C)
    run.advance(1)  # length 9: the last commit left 9, but Lmax is still 10
    assert cache.length - C == Lmax - C - 1
    assert not cache.can_rewind(cache.length - C)  # 7: its history (position 4) was overwritten
    assert cache.can_rewind(Lmax - C)
    run.rewind(Lmax - C)
    run.advance(2)


def test_scenario_8_uncommitted_step_then_retry_reads_exactly(make_cache: MakeCache) -> None:
    W, C = 4, 4
    cache = make_cache(kvcore.Ring(window=W), kvcore.Flat(), capacity=64, max_step=C)
    run = Lockstep(cache)
    for _ in range(5):
        run.advance(3)  # length 15, wrapped
    first = run.begin(4)  # its rows now count as overwritten
    retry = run.begin(2)  # the retry path: same position, replaces the begun step
    assert retry.position == first.position == 15
    assert not first.is_current and retry.is_current
    with pytest.raises(kvcore.InvalidStateError):
        first.commit()
    run.check_plans()
    run.commit()
    run.begin(4)
    run.begin(4)  # retry with the same T
    run.commit()
    run.advance(1)


def test_scenario_9_uncommitted_step_then_rewind_into_overwritten_rows_refused(make_cache: MakeCache) -> None:
    W, C = 4, 4
    cache = make_cache(kvcore.Ring(window=W), capacity=64, max_step=C)
    run = Lockstep(cache)
    for _ in range(20):
        run.advance(1)
    # R = 7: after writing up to 19 the rows hold 13..19, so rewind(19) (needs 16..18) is fine.
    assert cache.can_rewind(19)
    step = run.begin(4)  # writes 20..23 over the rows of 13..16
    assert not cache.can_rewind(19)  # 16 is gone
    before = observe(cache, step)
    with pytest.raises(kvcore.InvalidStateError, match="needs position 16"):
        cache.rewind(19)
    assert observe(cache, step) == before
    assert step.is_current
    run.commit()  # the begun step survives the refused rewind
    run.advance(2)


# --- Step lifecycle ------------------------------------------------------------


def test_step_context_manager_commits_on_normal_exit(mixed_cache: kvcore.SequenceCache) -> None:
    cache = mixed_cache
    with cache.step(3) as step:
        assert step.is_current and cache.length == 0
        assert (step.position, step.T, step.end) == (0, 3, 3)
    assert cache.length == 3 and not step.is_current and cache.active_step is None


def test_step_context_manager_does_not_commit_after_an_exception(mixed_cache: kvcore.SequenceCache) -> None:
    cache = mixed_cache
    cache.step(2).commit()

    class BackendFailed(Exception):
        pass

    with pytest.raises(BackendFailed):
        with cache.step(3) as step:
            raise BackendFailed
    assert cache.length == 2
    assert step.is_current  # still begun: the caller may retry or commit it
    with cache.step(3) as retry:
        assert retry.position == 2
    assert cache.length == 5 and not step.is_current


def test_step_context_manager_exit_after_clear_is_a_stale_commit(mixed_cache: kvcore.SequenceCache) -> None:
    cache = mixed_cache
    cache.step(3).commit()
    with pytest.raises(kvcore.InvalidStateError):
        with cache.step(1):
            cache.clear()
    assert cache.length == 0


def test_step_commit_and_cache_commit_are_the_same(mixed_cache: kvcore.SequenceCache) -> None:
    cache = mixed_cache
    a = cache.begin_step(2)
    cache.commit(a)
    b = cache.begin_step(1)
    b.commit()
    assert cache.length == 3
    with pytest.raises(kvcore.InvalidStateError):
        cache.commit(b)  # double commit


def test_active_step_is_the_begun_step(mixed_cache: kvcore.SequenceCache) -> None:
    cache = mixed_cache
    assert cache.active_step is None
    step = cache.begin_step(2)
    active = cache.active_step
    assert active is not None and (active.position, active.T, active.is_current) == (0, 2, True)
    active.commit()  # a handle from active_step commits the same step
    assert cache.length == 2 and not step.is_current and cache.active_step is None


def test_step_of_another_cache_cannot_be_committed(make_cache: MakeCache) -> None:
    # Twin caches in the same state: their steps agree on position, T and id, so
    # only the owning cache tells them apart.
    a = make_cache(kvcore.Ring(window=4), kvcore.Flat(), capacity=16, max_step=2)
    b = make_cache(kvcore.Ring(window=4), kvcore.Flat(), capacity=16, max_step=2)
    step_a, step_b = a.begin_step(2), b.begin_step(2)
    before_a, before_b = observe(a, step_a), observe(b, step_b)
    with pytest.raises(kvcore.InvalidStateError, match="another cache"):
        a.commit(step_b)
    assert observe(a, step_a) == before_a and observe(b, step_b) == before_b
    a.commit(step_a)
    b.commit(step_b)
    assert a.length == b.length == 2


def test_step_keeps_its_cache_alive(make_cache: MakeCache) -> None:
    step = make_cache(kvcore.Flat(), capacity=8).begin_step(3)  # the cache has no other reference
    assert step.is_current and step.plan(0).write == (kvcore.Run(0, 3, 0),)
    step.commit()
    assert not step.is_current


# --- queries -------------------------------------------------------------------


def test_plan_is_pure(mixed_cache: kvcore.SequenceCache) -> None:
    cache = mixed_cache
    for _ in range(5):
        cache.step(3).commit()
    step = cache.begin_step(3)
    first = [step.plan(l) for l in range(cache.n_layers)]
    assert [cache.plan(l, step.position, step.T) for l in range(cache.n_layers)] == first
    assert [step.plan(l) for l in range(cache.n_layers)] == first


def test_preview_is_the_next_steps_plan_and_begins_nothing(mixed_cache: kvcore.SequenceCache) -> None:
    cache = mixed_cache
    for T in [3, 1, 2, 3, 3, 1, 3, 2, 3, 3, 3]:  # well past the ring's 7 rows
        cache.begin_step(1)  # an uncommitted step is replaced by the next; preview leaves it be
        before = (cache.length, cache.active_step.position, [cache.can_rewind(n) for n in range(cache.length + 1)])
        previews = [cache.preview(layer, T) for layer in range(cache.n_layers)]
        assert (cache.length, cache.active_step.position, [cache.can_rewind(n) for n in range(cache.length + 1)]) == before
        with cache.step(T) as step:
            assert [step.plan(layer) for layer in range(cache.n_layers)] == previews


def test_preview_refuses_as_begin_step_does_and_changes_nothing(mixed_cache: kvcore.SequenceCache) -> None:
    cache = mixed_cache
    for _ in range(20):
        cache.step(3).commit()
    cache.step(2).commit()  # length 62 of 64
    for layer, T, error in [(0, 0, kvcore.InvalidArgumentError), (0, 4, kvcore.InvalidArgumentError),
                            (0, 3, kvcore.CapacityError), (6, 1, kvcore.InvalidArgumentError),
                            (-1, 1, kvcore.InvalidArgumentError)]:
        with pytest.raises(error):
            cache.preview(layer, T)
        assert cache.length == 62 and cache.active_step is None


def test_visible_follows_the_design_rule(make_cache: MakeCache) -> None:
    S, W = 2, 3
    cache = make_cache(kvcore.Ring(window=W, sinks=S), kvcore.Flat(), capacity=32, max_step=2)
    for q in range(12):
        for k in range(12):
            assert cache.visible(1, q, k) == (k <= q)
            assert cache.visible(0, q, k) == (k <= q and (q - k < W or k < S))


def test_can_extend(make_cache: MakeCache) -> None:
    cache = make_cache(kvcore.Flat(), capacity=10, max_step=4)
    cache.step(4).commit()
    assert [cache.can_extend(n) for n in range(-2, 9)] == [n >= 0 and 4 + n <= 10 for n in range(-2, 9)]
    assert cache.can_extend()  # n defaults to 1
    assert not cache.can_extend(2**40) and not cache.can_extend(-(2**70))


def test_clear_ends_the_step_and_allows_a_fresh_start(mixed_cache: kvcore.SequenceCache) -> None:
    cache = mixed_cache
    run = Lockstep(cache)
    for _ in range(8):
        run.advance(3)
    step = run.begin(2)
    run.clear()
    assert cache.length == 0 and cache.active_step is None and not step.is_current
    assert cache.can_rewind(0) and not cache.can_rewind(1)
    for T in (3, 1, 3):
        run.advance(T)


def test_numpy_integers_are_accepted(make_cache: MakeCache) -> None:
    import numpy as np  # a hard dependency of kvcore

    cache = make_cache(kvcore.Ring(window=np.int32(4)), capacity=np.int64(16))
    step = cache.begin_step(np.int64(2))
    assert cache.plan(np.int8(0), np.int64(0), np.int16(2)) == step.plan(np.uint8(0))


# --- plan objects and reprs ----------------------------------------------------


def test_run_value_semantics() -> None:
    run = kvcore.Run(row=3, len=2, pos=10)
    assert (run.row, run.len, run.pos) == (3, 2, 10)
    assert tuple(run) == (3, 2, 10)
    assert run == kvcore.Run(3, 2, 10) and run != kvcore.Run(3, 2, 11)
    assert hash(run) == hash(kvcore.Run(3, 2, 10))
    assert run != (3, 2, 10)  # another type compares unequal instead of raising
    assert len({run, kvcore.Run(3, 2, 10), kvcore.Run(0, 1, 0)}) == 2


def test_plan_lengths_and_contiguity(make_cache: MakeCache) -> None:
    cache = make_cache(kvcore.Ring(window=3), capacity=32, max_step=2)
    for _ in range(4):
        cache.step(2).commit()
    plan = cache.begin_step(2).plan(0)
    assert plan.write_len == sum(r.len for r in plan.write) == 2
    assert plan.read_len == sum(r.len for r in plan.read) == 3 - 1 + 2
    assert plan.is_contiguous == (len(plan.write) == 1 and len(plan.read) == 1)
    assert plan != 1 and plan == cache.plan(0, 8, 2)
    with pytest.raises(TypeError):
        hash(plan)  # mutable-looking value with __eq__: unhashable


def test_reprs_are_readable(mixed_cache: kvcore.SequenceCache) -> None:
    cache = mixed_cache
    ns = vars(kvcore)
    for value in (kvcore.Run(1, 2, 3), kvcore.Flat(), kvcore.Ring(4, 1), kvcore.Ring(window=8),
                  kvcore.LayerConfig(kvcore.Ring(4), 2, 64, v_head_dim=32), cache.config):
        assert repr(eval(repr(value), ns)) == repr(value)  # reads as the call that makes it
    cache.step(3).commit()
    step = cache.begin_step(2)
    assert repr(step) == "Step(position=3, T=2)"
    assert repr(cache).startswith("SequenceCache(") and "length=3" in repr(cache) and "capacity=64" in repr(cache)
    plan = step.plan(5)
    assert repr(plan) == f"SeqStepPlan(write=[{repr(plan.write[0])}], read=[{repr(plan.read[0])}])"
    assert repr(kvcore.Run(1, 2, 3)) == "Run(row=1, len=2, pos=3)"
