"""kvcore's exceptions (docs/design.md section 3) and every invalid call on a cache
(docs/design.md section 5, scenario 10): the right class, a message naming the value,
and nothing changed afterwards."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import kvcore
import kvcore._core
import kvcore._errors
from reference import Lockstep, observe

BUILTIN_BASE: dict[type[kvcore.KVCacheError], type[Exception]] = {
    kvcore.InternalError: RuntimeError,
    kvcore.InvalidStateError: RuntimeError,
    kvcore.NotSupportedError: NotImplementedError,
    kvcore.InvalidArgumentError: ValueError,
    kvcore.AlreadyRegisteredError: ValueError,
    kvcore.NotFoundError: KeyError,
    kvcore.AllocationError: MemoryError,
    kvcore.CapacityError: RuntimeError,
}

# docs/design.md section 3: ExecuTorch's names and values.
DESIGN_CODES = {
    "Ok": 0x00,
    "Internal": 0x01,
    "InvalidState": 0x02,
    "NotSupported": 0x10,
    "InvalidArgument": 0x12,
    "RegistrationAlreadyRegistered": 0x16,
    "NotFound": 0x20,
    "MemoryAllocationFailed": 0x21,
    "OutOfResources": 0x25,
}


# --- the hierarchy -------------------------------------------------------------


def test_error_values_are_executorch_values_and_agree_with_cpp() -> None:
    assert {e.name: e.value for e in kvcore.Error} == DESIGN_CODES
    assert kvcore._core.error_codes() == DESIGN_CODES


@pytest.mark.parametrize("cls", list(BUILTIN_BASE), ids=lambda c: c.__name__)
def test_each_class_has_its_builtin_base_and_code(cls: type[kvcore.KVCacheError]) -> None:
    assert issubclass(cls, kvcore.KVCacheError)
    assert issubclass(cls, BUILTIN_BASE[cls])
    assert isinstance(cls.code, kvcore.Error)
    assert kvcore._errors.error_class(cls.code) is cls
    exc = cls("boom")
    assert exc.code == cls.code and str(exc) == "boom"


def test_every_error_code_but_ok_has_exactly_one_class() -> None:
    codes = sorted(cls.code for cls in BUILTIN_BASE)
    assert codes == sorted(e for e in kvcore.Error if e != kvcore.Error.Ok)
    assert kvcore._errors.error_class(0x7F) is kvcore.InternalError  # unknown codes


def test_capacity_error_is_not_a_memory_error() -> None:
    assert not issubclass(kvcore.CapacityError, MemoryError)
    assert kvcore.CapacityError.code == kvcore.Error.OutOfResources


def test_not_found_error_message_is_not_quoted() -> None:
    assert str(kvcore.NotFoundError("no cache 'x'")) == "no cache 'x'"  # KeyError would repr it


def test_errors_raised_by_cpp_carry_their_code(make_cache: Callable[..., kvcore.SequenceCache]) -> None:
    cache = make_cache(kvcore.Flat(), capacity=4, max_step=4)
    cache.step(3).commit()
    cases: list[tuple[Callable[[], object], type[kvcore.KVCacheError]]] = [
        (lambda: cache.begin_step(0), kvcore.InvalidArgumentError),
        (lambda: cache.begin_step(5), kvcore.InvalidArgumentError),
        (lambda: cache.rewind(4), kvcore.InvalidArgumentError),
        (lambda: cache.plan(0, 3, 1), kvcore.InvalidStateError),
        (lambda: cache.begin_step(2), kvcore.CapacityError),
    ]
    for call, cls in cases:
        with pytest.raises(kvcore.KVCacheError) as info:
            call()
        assert type(info.value) is cls and info.value.code == cls.code


# --- scenario 10: invalid input changes nothing ---------------------------------

# The cache: five Ring(window=4, sinks=1) layers and a Flat one, capacity 22,
# max_step 3, decoded to length 20 (ring rows 1 + 6 = 7, wrapped) with a step of 2
# begun at 20. Each entry: (call on (cache, step), exception, text the message has).
Call = Callable[[kvcore.SequenceCache, kvcore.Step], object]
INVALID: dict[str, tuple[Call, type[kvcore.KVCacheError], str]] = {
    "T=0": (lambda c, s: c.begin_step(0), kvcore.InvalidArgumentError, "T = 0"),
    "T=-1": (lambda c, s: c.begin_step(-1), kvcore.InvalidArgumentError, "T = -1"),
    "T>max_step": (lambda c, s: c.begin_step(4), kvcore.InvalidArgumentError, "max_step = 3"),
    "T=2**31": (lambda c, s: c.begin_step(2**31), kvcore.InvalidArgumentError, "T = 2147483648"),
    "T=-2**31-1": (lambda c, s: c.step(-(2**31) - 1), kvcore.InvalidArgumentError, "T = -2147483649"),
    "T=2**70": (lambda c, s: c.begin_step(2**70), kvcore.InvalidArgumentError, f"T = {2**70}"),
    "capacity": (lambda c, s: c.begin_step(3), kvcore.CapacityError, "capacity = 22"),
    "capacity-via-step": (lambda c, s: c.step(3), kvcore.CapacityError, "length 20"),
    "plan-layer=-1": (lambda c, s: c.plan(-1, 20, 2), kvcore.InvalidArgumentError, "layer = -1"),
    "plan-layer=n_layers": (lambda c, s: c.plan(6, 20, 2), kvcore.InvalidArgumentError, "layer = 6"),
    "plan-layer=2**31": (lambda c, s: c.plan(2**31, 20, 2), kvcore.InvalidArgumentError, "layer = 2147483648"),
    "plan-position-before": (lambda c, s: c.plan(0, 19, 2), kvcore.InvalidStateError, "position 19"),
    "plan-position-after": (lambda c, s: c.plan(0, 21, 2), kvcore.InvalidStateError, "position 21"),
    "plan-T-other": (lambda c, s: c.plan(5, 20, 1), kvcore.InvalidStateError, "T 1"),
    "plan-position=2**31": (lambda c, s: c.plan(0, 2**31, 2), kvcore.InvalidArgumentError, "position = 2147483648"),
    "plan-T=2**31": (lambda c, s: c.plan(0, 20, 2**31), kvcore.InvalidArgumentError, "T = 2147483648"),
    "step.plan-layer": (lambda c, s: s.plan(6), kvcore.InvalidArgumentError, "layer = 6"),
    "step.plan-layer=-2**40": (lambda c, s: s.plan(-(2**40)), kvcore.InvalidArgumentError, f"layer = {-(2**40)}"),
    "rows-layer": (lambda c, s: c.rows(6), kvcore.InvalidArgumentError, "layer = 6"),
    "rows-layer=-1": (lambda c, s: c.rows(-1), kvcore.InvalidArgumentError, "layer = -1"),
    "group_of-layer": (lambda c, s: c.group_of(6), kvcore.InvalidArgumentError, "layer = 6"),
    "layer_policy-layer": (lambda c, s: c.layer_policy(-1), kvcore.InvalidArgumentError, "layer = -1"),
    "visible-layer": (lambda c, s: c.visible(6, 1, 0), kvcore.InvalidArgumentError, "layer = 6"),
    "visible-q<0": (lambda c, s: c.visible(0, -1, 0), kvcore.InvalidArgumentError, "q = -1"),
    "visible-k<0": (lambda c, s: c.visible(0, 3, -2), kvcore.InvalidArgumentError, "k = -2"),
    "visible-q=2**31": (lambda c, s: c.visible(0, 2**31, 0), kvcore.InvalidArgumentError, "q = 2147483648"),
    "rewind-n<0": (lambda c, s: c.rewind(-1), kvcore.InvalidArgumentError, "n = -1"),
    "rewind-n>length": (lambda c, s: c.rewind(21), kvcore.InvalidArgumentError, "length = 20"),
    "rewind-n=2**31": (lambda c, s: c.rewind(2**31), kvcore.InvalidArgumentError, "n = 2147483648"),
    # The begun step wrote 20..21 over the rows of 14..15; a query at 17 needs 14..16.
    "rewind-past-held": (lambda c, s: c.rewind(17), kvcore.InvalidStateError, "needs position 14"),
    "rewind-far-past-held": (lambda c, s: c.rewind(5), kvcore.InvalidStateError, "rewind(n = 5)"),
    "commit-foreign": (lambda c, s: c.commit(_foreign_step()), kvcore.InvalidStateError, "another cache"),
}

_keep: list[Any] = []


def _foreign_step() -> kvcore.Step:
    cfg = kvcore.CacheConfig(24, kvcore.LayerConfig(kvcore.Flat(), 1, 8))
    other = kvcore.SequenceCache(cfg)
    _keep.append(other)
    return other.begin_step(2)


def scenario_10_cache() -> Lockstep:
    ring = kvcore.LayerConfig(kvcore.Ring(window=4, sinks=1), 1, 8)
    flat = kvcore.LayerConfig(kvcore.Flat(), 1, 8)
    run = Lockstep(kvcore.SequenceCache(kvcore.CacheConfig(22, [ring] * 5 + [flat], max_step=3)))
    for T in (3, 3, 3, 3, 3, 3, 1, 1):
        run.advance(T)
    run.begin(2)
    return run


@pytest.mark.parametrize("name", list(INVALID))
def test_scenario_10_invalid_input_changes_nothing(name: str) -> None:
    call, cls, text = INVALID[name]
    run = scenario_10_cache()
    cache, step = run.cache, run.step
    assert (cache.length, step.position, step.T) == (20, 20, 2)
    before = observe(cache, step)
    with pytest.raises(cls) as info:
        call(cache, step)
    assert type(info.value) is cls
    assert text in str(info.value), f"{str(info.value)!r} does not name {text!r}"
    assert observe(cache, step) == before
    run.check_plans()  # the begun step's rows and plans are untouched...
    run.commit()  # ...it still commits...
    run.rewind(cache.length - 1)
    run.advance(1)  # ...and the cache goes on exactly


def test_scenario_10_rewind_refusals_agree_with_the_reference() -> None:
    run = scenario_10_cache()
    cache = run.cache
    ns = range(-3, cache.length + 4)
    assert [cache.can_rewind(n) for n in ns] == [run.ref.can_rewind(n) for n in ns]
    # By hand: the begun step ends at 22, so the 6 ring rows hold 16..21 and the sink
    # row holds 0. rewind(n) needs [max(1, n - 3), n) besides the sink: n >= 19, or n <= 1.
    assert [n for n in ns if cache.can_rewind(n)] == [0, 1, 19, 20]


# --- stale commits ---------------------------------------------------------------


def _stale_after(action: Callable[[Lockstep], object]) -> None:
    run = scenario_10_cache()
    stale = run.step
    action(run)
    assert not stale.is_current
    before = observe(run.cache, stale)
    with pytest.raises(kvcore.InvalidStateError):
        stale.commit()
    with pytest.raises(kvcore.InvalidStateError):
        run.cache.commit(stale)
    assert observe(run.cache, stale) == before
    if not run.cache.can_extend(1):
        run.rewind(run.cache.length - 1)  # room for one more step
    run.advance(1)


def test_commit_after_rewind_is_stale() -> None:
    _stale_after(lambda run: run.rewind(19))


def test_commit_after_rewind_to_length_is_stale() -> None:
    _stale_after(lambda run: run.rewind(run.cache.length))  # rewind(L) ends the step too


def test_commit_after_clear_is_stale() -> None:
    _stale_after(lambda run: run.clear())


def test_commit_after_retry_is_stale() -> None:
    _stale_after(lambda run: run.begin(2))


def test_commit_after_retry_with_same_t_is_stale() -> None:
    # Same position and T: only the step id tells the handles apart.
    _stale_after(lambda run: run.begin(run.step.T))


def test_double_commit_is_stale() -> None:
    _stale_after(lambda run: run.commit())


def test_plan_without_a_begun_step() -> None:
    run = scenario_10_cache()
    run.commit()
    before = observe(run.cache)
    with pytest.raises(kvcore.InvalidStateError, match="no step is begun"):
        run.cache.plan(0, 22, 1)
    assert observe(run.cache) == before
