"""The Python boundary under hostile input: negative, huge (2**31, 2**63) and
non-integer arguments, wrong numpy dtypes, non-contiguous and read-only arrays,
arrays that alias the pool, and objects used after clear(), after their step
was replaced, after their pool or cache was dropped, or after their session
ended. Each gets a clear exception (or, where the input is legal, the right
answer), never a crash, and a refused call changes nothing.

Expected outcomes come from the rules (docs/design.md section 2 and docs/errors.md),
not from running the code.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

import kvcore
import kvcore.registry
from reference import observe

Array = npt.NDArray[Any]

RING = kvcore.Ring(window=4, sinks=1)
HUGE = [2**31, 2**63, -(2**31) - 1, -(2**63) - 1, 2**70]
NOT_INTS: list[Any] = [1.0, 2.5, None, "1", b"1", np.float64(1.0), [1], 1j]


class Rig:
    """A ring + flat cache with a float32 pool, decoded past the ring's wrap
    (ring rows 1 + 4 + 3 - 1 = 7) and a step of 2 begun and written. Rows hold
    the value `position + 1000 * write` so any misplaced row shows."""

    def __init__(self) -> None:
        cfg = kvcore.CacheConfig(
            40,
            [kvcore.LayerConfig(RING, 2, 4, 3), kvcore.LayerConfig(kvcore.Flat(), 2, 4, 3)],
            max_step=3,
            initial_capacity=4,
        )
        self.cache = kvcore.SequenceCache(cfg)
        self.pool = kvcore.KVPool(self.cache, np.float32)
        self.writes = 0
        self.data: list[dict[int, float]] = [{}, {}]  # per layer: position -> value written
        for T in (3, 3, 3, 2):
            with self.cache.step(T) as step:
                self.write_step(step)
        self.step = self.cache.begin_step(2)
        self.write_step(self.step)

    def rows(self, layer: int, values: list[float], value_rows: bool = False) -> Array:
        dim = 3 if value_rows else 4
        out = np.empty((len(values), 2, dim), np.float32)
        out[:] = np.asarray(values, np.float32)[:, None, None]
        return -out if value_rows else out

    def write_step(self, step: kvcore.Step) -> None:
        self.writes += 1
        for layer in range(2):
            values = [p + 1000.0 * self.writes for p in range(step.position, step.end)]
            self.pool.update(layer, step, self.rows(layer, values), self.rows(layer, values, True), order="positions")
            for p, x in zip(range(step.position, step.end), values):
                self.data[layer][p] = x

    def check_reads(self) -> None:
        """Every layer's read of the begun step holds exactly what was written."""
        for layer in range(2):
            k, v, positions = self.pool.read(layer, self.step.plan(layer), order="positions")
            values = [self.data[layer][p] for p in positions.tolist()]
            np.testing.assert_array_equal(k, self.rows(layer, values))
            np.testing.assert_array_equal(v, self.rows(layer, values, True))

    def state(self) -> dict[str, object]:
        return {
            **observe(self.cache, self.step),
            "reserved": self.pool.reserved_bytes,
            "allocated": [self.pool.allocated_rows(l) for l in range(2)],
        }


@pytest.fixture
def rig() -> Rig:
    return Rig()


def refused(rig: Rig, call: Callable[[], object], cls: type[Exception], text: str = "") -> None:
    """`call` raises `cls` (whose message has `text`), and changes nothing."""
    before = rig.state()
    with pytest.raises(cls) as info:
        call()
    assert text in str(info.value), f"{str(info.value)!r} does not name {text!r}"
    assert rig.state() == before
    rig.check_reads()


# --- integer arguments -----------------------------------------------------------------

# Every integer parameter of the Python API, as (name in messages, call with x).
INT_PARAMETERS: dict[str, tuple[str, Callable[[Rig, Any], object]]] = {
    "begin_step.T": ("T", lambda r, x: r.cache.begin_step(x)),
    "step.T": ("T", lambda r, x: r.cache.step(x)),
    "rewind.n": ("n", lambda r, x: r.cache.rewind(x)),
    "plan.layer": ("layer", lambda r, x: r.cache.plan(x, 11, 2)),
    "plan.position": ("position", lambda r, x: r.cache.plan(0, x, 2)),
    "plan.T": ("T", lambda r, x: r.cache.plan(0, 11, x)),
    "preview.layer": ("layer", lambda r, x: r.cache.preview(x, 1)),
    "preview.T": ("T", lambda r, x: r.cache.preview(0, x)),
    "rows.layer": ("layer", lambda r, x: r.cache.rows(x)),
    "group_of.layer": ("layer", lambda r, x: r.cache.group_of(x)),
    "layer_policy.layer": ("layer", lambda r, x: r.cache.layer_policy(x)),
    "visible.layer": ("layer", lambda r, x: r.cache.visible(x, 1, 0)),
    "visible.q": ("q", lambda r, x: r.cache.visible(0, x, 0)),
    "visible.k": ("k", lambda r, x: r.cache.visible(0, 3, x)),
    "Step.plan.layer": ("layer", lambda r, x: r.step.plan(x)),
    "Step.mask.layer": ("layer", lambda r, x: r.step.mask(x, order="positions")),
    "KVPool.rows.layer": ("layer", lambda r, x: r.pool.rows(x)),
    "KVPool.allocated_rows.layer": ("layer", lambda r, x: r.pool.allocated_rows(x)),
    "KVPool.reserve.layer": ("layer", lambda r, x: r.pool.reserve(x, 1)),
    "KVPool.reserve.rows": ("rows", lambda r, x: r.pool.reserve(0, x)),
    "KVPool.write.layer": ("layer", lambda r, x: r.pool.write(x, r.step.plan(0), r.rows(0, [0, 0]), r.rows(0, [0, 0], True))),
    "KVPool.read.layer": ("layer", lambda r, x: r.pool.read(x, r.step.plan(0), order="positions")),
    "KVPool.update.layer": ("layer", lambda r, x: r.pool.update(x, r.step, r.rows(0, [0, 0]), r.rows(0, [0, 0], True), order="positions")),
    "Ring.window": ("window", lambda r, x: kvcore.Ring(x)),
    "Ring.sinks": ("sinks", lambda r, x: kvcore.Ring(4, x)),
    "LayerConfig.n_kv_heads": ("n_kv_heads", lambda r, x: kvcore.LayerConfig(RING, x, 4)),
    "LayerConfig.head_dim": ("head_dim", lambda r, x: kvcore.LayerConfig(RING, 2, x)),
    "LayerConfig.v_head_dim": ("v_head_dim", lambda r, x: kvcore.LayerConfig(RING, 2, 4, x)),
    "CacheConfig.capacity": ("capacity", lambda r, x: kvcore.CacheConfig(x, kvcore.LayerConfig(RING, 2, 4))),
    "CacheConfig.n_layers": ("n_layers", lambda r, x: kvcore.CacheConfig(8, kvcore.LayerConfig(RING, 2, 4), n_layers=x)),
    "CacheConfig.max_step": ("max_step", lambda r, x: kvcore.CacheConfig(8, kvcore.LayerConfig(RING, 2, 4), max_step=x)),
    "CacheConfig.initial_capacity": (
        "initial_capacity",
        lambda r, x: kvcore.CacheConfig(8, kvcore.LayerConfig(RING, 2, 4), initial_capacity=x),
    ),
    "Run.row": ("row", lambda r, x: kvcore.Run(x, 1, 0)),
    "Run.len": ("len", lambda r, x: kvcore.Run(0, x, 0)),
    "Run.pos": ("pos", lambda r, x: kvcore.Run(0, 1, x)),
}
# Parameters for which -1 breaks a rule (Run is a plain value; plan's position
# and T name a step, so a wrong one is InvalidState, not a bad argument).
NEGATIVE_IS_INVALID = [
    name for name in INT_PARAMETERS if not name.startswith("Run.") and name not in ("plan.position", "plan.T")
]


@pytest.mark.parametrize("value", HUGE, ids=str)
@pytest.mark.parametrize("name", list(INT_PARAMETERS))
def test_an_int_beyond_32_bits_is_an_invalid_argument_naming_it(rig: Rig, name: str, value: int) -> None:
    param, call = INT_PARAMETERS[name]
    refused(rig, lambda: call(rig, value), kvcore.InvalidArgumentError, f"{param} = {value}")


@pytest.mark.parametrize("name", NEGATIVE_IS_INVALID)
def test_minus_one_is_an_invalid_argument_naming_it(rig: Rig, name: str) -> None:
    param, call = INT_PARAMETERS[name]
    refused(rig, lambda: call(rig, -1), kvcore.InvalidArgumentError, f"{param} = -1")


# None is the default of CacheConfig's optional n_layers and max_step.
NOT_INT_CASES = [
    pytest.param(name, value, id=f"{name}-{value!r}")
    for name in INT_PARAMETERS
    for value in NOT_INTS
    if not (value is None and name in ("CacheConfig.n_layers", "CacheConfig.max_step"))
]


@pytest.mark.parametrize("name, value", NOT_INT_CASES)
def test_a_non_integer_is_a_type_error(rig: Rig, name: str, value: Any) -> None:
    _, call = INT_PARAMETERS[name]
    refused(rig, lambda: call(rig, value), TypeError)


@pytest.mark.parametrize("value", [*HUGE, -1, -(2**31)], ids=str)
def test_predicates_answer_false_for_any_int_and_never_raise(rig: Rig, value: int) -> None:
    before = rig.state()
    assert rig.cache.can_rewind(value) is False
    assert rig.cache.can_extend(value) is False
    assert rig.state() == before


@pytest.mark.parametrize("value", NOT_INTS, ids=repr)
def test_predicates_refuse_a_non_integer_with_a_type_error(rig: Rig, value: Any) -> None:
    refused(rig, lambda: rig.cache.can_rewind(value), TypeError)
    refused(rig, lambda: rig.cache.can_extend(value), TypeError)


def test_numpy_integers_of_every_width_are_integers(rig: Rig) -> None:
    for t in (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint64):
        assert rig.cache.rows(t(1)) == rig.cache.rows(1)
    with pytest.raises(kvcore.InvalidArgumentError, match=f"T = {2**64 - 1}"):
        rig.cache.begin_step(np.uint64(2**64 - 1))


def test_huge_config_values_are_refused_before_anything_is_allocated() -> None:
    big = kvcore.LayerConfig(kvcore.Flat(), 2**31 - 1, 2**31 - 1)
    cfg = kvcore.CacheConfig(2**31 - 1, big, max_step=1, initial_capacity=1)
    with pytest.raises(kvcore.InvalidArgumentError, match="overflow the address space"):
        kvcore.KVPool.required_bytes(cfg, np.float32)
    with pytest.raises(kvcore.InvalidArgumentError, match="overflow the address space"):
        kvcore.KVPool(kvcore.SequenceCache(cfg), np.float32)


# --- arrays --------------------------------------------------------------------------------


def k_rows(rig: Rig) -> Array:
    return np.full((2, 2, 4), 5.0, np.float32)


def v_rows(rig: Rig) -> Array:
    return np.full((2, 2, 3), 5.0, np.float32)


def rows_like(shape: tuple[int, int, int], dtype: Any = np.float32) -> Array:
    return np.full(shape, 5.0, dtype=dtype)


# Each: (what, make(shape of a good array), message fragments with {a} = k or v
# and {shape} = the good shape). The other array of the call is always good.
SHAPE_RULE = "{a}.shape = ({bad}): must be (T, n_kv_heads, dim) = {shape}"
BAD_ARRAYS: list[tuple[str, Callable[[tuple[int, int, int]], Any], str]] = [
    ("float64", lambda s: rows_like(s, np.float64), "{a}.dtype = dtype('float64'): the pool stores dtype('float32')"),
    ("float16", lambda s: rows_like(s, np.float16), "{a}.dtype = dtype('float16')"),
    ("int32", lambda s: rows_like(s, np.int32), "{a}.dtype = dtype('int32')"),
    ("bool", lambda s: rows_like(s, np.bool_), "{a}.dtype = dtype('bool')"),
    ("object", lambda s: rows_like(s, object), "{a}.dtype = dtype('O')"),
    ("big-endian", lambda s: rows_like(s, ">f4"), "{a}.dtype = dtype('>f4')"),
    ("structured", lambda s: np.zeros(s, dtype=[("x", "<f4")]), "{a}.dtype = dtype([('x', '<f4')])"),
    ("numpy scalar", lambda s: np.float32(5.0), "{a}: must be a numpy.ndarray, got float32"),
    ("0-d", lambda s: np.array(5.0, np.float32), "{a}.shape = (): must be (T, n_kv_heads, dim) = {shape}"),
    ("2-d", lambda s: np.zeros((s[0], s[1] * s[2]), np.float32), "{a}.shape = ({s0}, {s12}): must be"),
    ("4-d", lambda s: np.zeros((*s, 1), np.float32), "{a}.shape = {shape4}: must be"),
    ("no rows", lambda s: np.zeros((0, s[1], s[2]), np.float32), "{a}.shape = (0, {s1}, {s2}): must be"),
    ("too many rows", lambda s: np.zeros((s[0] + 1, s[1], s[2]), np.float32), "{a}.shape = (3, {s1}, {s2}): must be"),
    ("wrong dim", lambda s: np.zeros((s[0], s[1], s[2] + 1), np.float32), "must be (T, n_kv_heads, dim) = {shape}"),
    ("strided", lambda s: np.zeros((s[0], s[1], 2 * s[2]), np.float32)[:, :, ::2], "{a}: must be C-contiguous"),
    ("reversed", lambda s: rows_like(s)[::-1], "{a}: must be C-contiguous"),
    ("fortran", lambda s: np.asfortranarray(rows_like(s)), "{a}: must be C-contiguous"),
    ("broadcast", lambda s: np.broadcast_to(rows_like((1, s[1], s[2])), s), "{a}: must be C-contiguous"),
    ("list", lambda s: rows_like(s).tolist(), "{a}: must be a numpy.ndarray, got list"),
    ("bytes", lambda s: rows_like(s).tobytes(), "{a}: must be a numpy.ndarray, got bytes"),
    ("memoryview", lambda s: memoryview(rows_like(s)), "{a}: must be a numpy.ndarray, got memoryview"),
    ("None", lambda s: None, "{a}: must be a numpy.ndarray, got NoneType"),
]


def bad_text(template: str, a: str, shape: tuple[int, int, int]) -> str:
    return template.format(
        a=a, shape=str(shape), shape4=str((*shape, 1)), s0=shape[0], s1=shape[1], s2=shape[2], s12=shape[1] * shape[2]
    )


@pytest.mark.parametrize("make,text", [(m, t) for _, m, t in BAD_ARRAYS], ids=[n for n, _, _ in BAD_ARRAYS])
def test_a_bad_array_is_refused_and_nothing_is_written(rig: Rig, make: Callable[..., Any], text: str) -> None:
    k_shape, v_shape = (2, 2, 4), (2, 2, 3)
    for layer in range(2):
        plan = rig.step.plan(layer)
        k_text, v_text = bad_text(text, "k", k_shape), bad_text(text, "v", v_shape)
        refused(rig, lambda: rig.pool.update(layer, rig.step, make(k_shape), v_rows(rig), order="positions"), kvcore.InvalidArgumentError, k_text)
        refused(rig, lambda: rig.pool.write(layer, plan, make(k_shape), v_rows(rig)), kvcore.InvalidArgumentError, k_text)
        refused(rig, lambda: rig.pool.update(layer, rig.step, k_rows(rig), make(v_shape), order="positions"), kvcore.InvalidArgumentError, v_text)
        refused(rig, lambda: rig.pool.write(layer, plan, k_rows(rig), make(v_shape)), kvcore.InvalidArgumentError, v_text)


def test_a_read_only_input_is_fine(rig: Rig) -> None:
    # The pool only reads its inputs: read-only arrays (a frozen buffer, a
    # numpy view flagged read-only) are legal and written exactly.
    rig.writes += 1
    for layer in range(2):
        values = [p + 1000.0 * rig.writes for p in range(rig.step.position, rig.step.end)]
        k, v = rig.rows(layer, values), rig.rows(layer, values, True)
        k.flags.writeable = False
        frozen_v = np.frombuffer(v.tobytes(), np.float32).reshape(v.shape)
        assert not frozen_v.flags.writeable
        rig.pool.write(layer, rig.step.plan(layer), k, frozen_v)
        for p, x in zip(range(rig.step.position, rig.step.end), values):
            rig.data[layer][p] = x
    rig.check_reads()


def test_views_returned_by_the_pool_are_read_only(rig: Rig) -> None:
    k, v, positions = rig.pool.read(1, rig.step.plan(1), order="positions")  # the flat layer: one run, a view
    assert not k.flags.owndata
    for array in (k, v, positions):
        with pytest.raises(ValueError, match="read-only"):
            array[0] = 1
    with pytest.raises(ValueError):
        k.flags.writeable = True  # the pool's memory cannot be unlocked
    rig.check_reads()


def test_an_input_that_aliases_the_pool_is_copied_as_it_was(rig: Rig) -> None:
    # The flat layer's read is a view of the pool over rows [0, 13); rewriting
    # the begun step (rows 11, 12) from rows 10..11 of that same view overlaps
    # source and destination by one row. The result must be the rows as they
    # were before the write (memmove semantics), whatever the overlap.
    layer = 1
    k_view, v_view, positions = rig.pool.read(layer, rig.step.plan(layer), order="positions")
    assert positions.tolist() == list(range(13)) and not k_view.flags.owndata
    src_k, src_v = k_view[10:12], v_view[10:12]
    expected_k, expected_v = src_k.copy(), src_v.copy()
    rig.pool.write(layer, rig.step.plan(layer), src_k, src_v)
    k_after, v_after, _ = rig.pool.read(layer, rig.step.plan(layer), order="positions")
    np.testing.assert_array_equal(k_after[11:13], expected_k)
    np.testing.assert_array_equal(v_after[11:13], expected_v)


def test_an_aliasing_input_survives_the_growth_it_causes() -> None:
    # A write that grows the layer moves its rows to a new block; the input,
    # a view of the old block, stays alive (the view owns a reference) and is
    # copied from intact.
    cfg = kvcore.CacheConfig(64, kvcore.LayerConfig(kvcore.Flat(), 1, 2), max_step=2, initial_capacity=2)
    cache = kvcore.SequenceCache(cfg)
    pool = kvcore.KVPool(cache, np.float32)
    with cache.step(2) as step:
        k, v, _ = pool.update(0, step, np.full((2, 1, 2), 7.0, np.float32), np.full((2, 1, 2), 8.0, np.float32), order="positions")
    assert pool.allocated_rows(0) == 2
    with cache.step(2) as step:
        pool.write(0, step.plan(0), k, v)  # grows to 4 rows while copying from the old block
        k2, v2, positions = pool.read(0, step.plan(0), order="positions")
    assert pool.allocated_rows(0) == 4 and positions.tolist() == [0, 1, 2, 3]
    np.testing.assert_array_equal(k2, np.full((4, 1, 2), 7.0, np.float32))
    np.testing.assert_array_equal(v2, np.full((4, 1, 2), 8.0, np.float32))


def test_a_plan_that_is_not_a_plan_is_a_type_error(rig: Rig) -> None:
    for plan in (None, (0, 2, 11), [kvcore.Run(0, 2, 11)], rig.step):
        refused(rig, lambda: rig.pool.write(0, plan, k_rows(rig), v_rows(rig)), TypeError)
        refused(rig, lambda: rig.pool.read(0, plan, order="positions"), TypeError)
    refused(rig, lambda: rig.pool.update(0, None, k_rows(rig), v_rows(rig), order="positions"), TypeError)
    refused(rig, lambda: kvcore.KVPool(None), kvcore.InvalidArgumentError, "cache: must not be None")
    refused(rig, lambda: kvcore.KVPool(rig.cache.config), TypeError)


# --- objects after their moment ----------------------------------------------------------------


def test_step_plans_and_views_after_clear(rig: Rig) -> None:
    step, plans = rig.step, [rig.step.plan(l) for l in range(2)]
    k_view, _, positions = rig.pool.read(1, plans[1], order="positions")
    rig.cache.clear()
    assert not step.is_current and rig.cache.active_step is None and rig.cache.length == 0
    k, v = k_rows(rig), v_rows(rig)
    for call in (
        step.commit,
        lambda: rig.cache.commit(step),
        lambda: step.plan(0),
        lambda: step.mask(0, order="positions"),
        lambda: rig.pool.update(0, step, k, v, order="positions"),
        lambda: rig.pool.write(0, plans[0], k, v),
        lambda: rig.pool.read(1, plans[1], order="positions"),
    ):
        with pytest.raises(kvcore.InvalidStateError):
            call()
    # The old view still reads the pool's memory: the rows as they are now.
    assert positions.tolist() == list(range(13))
    assert float(k_view[0, 0, 0]) == rig.data[1][0]
    with rig.cache.step(2) as fresh:  # the cache starts over; position 0 is rewritten
        got, _, _ = rig.pool.update(1, fresh, np.full((2, 2, 4), -5.0, np.float32), np.zeros((2, 2, 3), np.float32), order="positions")
        rig.pool.update(0, fresh, np.zeros((2, 2, 4), np.float32), np.zeros((2, 2, 3), np.float32), order="positions")
    assert float(k_view[0, 0, 0]) == -5.0 and got.tolist() == k_view[:2].tolist()


def test_step_and_plans_after_the_step_was_replaced_or_rewound(rig: Rig) -> None:
    old, plan = rig.step, rig.step.plan(0)
    retry = rig.cache.begin_step(1)  # replaces the begun step (the retry path)
    with pytest.raises(kvcore.InvalidStateError):
        old.commit()
    with pytest.raises(kvcore.InvalidStateError, match="not layer 0's plan"):
        rig.pool.write(0, plan, k_rows(rig), v_rows(rig))
    rig.cache.rewind(rig.cache.length)  # ends the retry too
    with pytest.raises(kvcore.InvalidStateError):
        retry.commit()
    with pytest.raises(kvcore.InvalidStateError, match="no step is begun"):
        rig.pool.read(0, plan, order="positions")
    with pytest.raises(kvcore.InvalidStateError):
        rig.pool.update(0, retry, np.zeros((1, 2, 4), np.float32), np.zeros((1, 2, 3), np.float32), order="positions")


def test_views_outlive_their_pool_and_cache() -> None:
    rig = Rig()
    k_view, v_view, positions = rig.pool.read(1, rig.step.plan(1), order="positions")
    expected = k_view.copy(), v_view.copy(), positions.copy()
    del rig  # the only reference to the cache, the pool and the step
    gc.collect()
    churn = [np.full(1 << 12, 3.0) for _ in range(64)]  # would reuse freed memory
    np.testing.assert_array_equal(k_view, expected[0])
    np.testing.assert_array_equal(v_view, expected[1])
    np.testing.assert_array_equal(positions, expected[2])
    del churn


def test_a_cache_after_its_session_ended(rig: Rig) -> None:
    with kvcore.registry.Session.adopt(rig.cache, prefix="boundary") as session:
        key = session.key
        found = kvcore.registry.find(key)
    # The session ended: its key is gone, the session refuses to name one, and
    # the cache itself (held by the caller) works on.
    assert not session.active and not kvcore.registry.contains(key)
    with pytest.raises(kvcore.InvalidStateError, match="not active"):
        session.key
    with pytest.raises(kvcore.NotFoundError):
        kvcore.registry.find(key)
    with pytest.raises(kvcore.NotFoundError):
        kvcore.registry.erase(key)
    assert kvcore.registry.get(key) is None
    assert found is rig.cache
    rig.step.commit()
    with rig.cache.step(1) as step:
        rig.write_step(step)
    assert rig.cache.length == 14


def test_a_step_begun_in_a_session_commits_after_it_ended() -> None:
    cfg = kvcore.CacheConfig(16, kvcore.LayerConfig(RING, 1, 2), max_step=2)
    with kvcore.registry.Session("cpu", "sequence", cfg) as session:
        cache = kvcore.registry.find(session.key)
        assert isinstance(cache, kvcore.SequenceCache)
        step = cache.begin_step(2)
    del session
    gc.collect()
    step.commit()
    assert cache.length == 2


def test_kvcore_objects_copy_independently_but_do_not_pickle(rig: Rig) -> None:
    import copy
    import pickle

    objects = [rig.cache, rig.pool, rig.step, rig.cache.config, rig.cache.config.layers[0], RING, rig.step.plan(0)]
    for obj in objects:
        refused(rig, lambda: pickle.dumps(obj), TypeError, "pickle")
    # Values copy as values; a cache, its pool and its step copy into one independent world.
    for value in (rig.cache.config, rig.cache.config.layers[0], RING, rig.step.plan(0)):
        assert repr(copy.copy(value)) == repr(value) == repr(copy.deepcopy(value))
    world = copy.deepcopy({"cache": rig.cache, "pool": rig.pool, "step": rig.step})
    cache, pool, step = world["cache"], world["pool"], world["step"]
    assert cache is not rig.cache and pool.cache is cache and step.is_current
    assert cache.length == rig.cache.length and pool.reserved_bytes == rig.pool.reserved_bytes
    before = observe(rig.cache, rig.step)
    step.commit()
    assert cache.length == rig.cache.length + step.T and observe(rig.cache, rig.step) == before
    assert copy.copy(rig.cache).length == rig.cache.length


def test_registry_calls_refuse_none_and_empty_names() -> None:
    from kvcore import _core

    before = kvcore.registry.keys()
    with pytest.raises(kvcore.InvalidArgumentError, match="install_unique: cache is None"):
        _core.registry_install_unique("boundary", None)
    with pytest.raises(kvcore.InvalidArgumentError, match="install: cache is None"):
        kvcore.registry.install("boundary-none", None)  # type: ignore[arg-type]
    for call in (
        lambda: kvcore.registry.install(None, RING),  # type: ignore[arg-type]
        lambda: kvcore.registry.find(None),  # type: ignore[arg-type]
        lambda: kvcore.registry.erase(3),  # type: ignore[arg-type]
        lambda: kvcore.registry.install("boundary-policy", RING),  # type: ignore[arg-type]
    ):
        with pytest.raises(TypeError):
            call()
    assert kvcore.registry.keys() == before


def test_a_wrapped_write_from_a_view_of_its_own_rows() -> None:
    # Ring W=3, C=4: R = 6 ring rows. A step of 4 at position 3 writes rows 3, 4, 5
    # and then row 0 (two runs). Its input is a view of the same layer's rows.
    cfg = kvcore.CacheConfig(32, kvcore.LayerConfig(kvcore.Ring(3), 1, 2), max_step=4)
    cache = kvcore.SequenceCache(cfg)
    pool = kvcore.KVPool(cache, np.float32)

    def rows(values: list[float]) -> Array:
        return np.repeat(np.asarray(values, np.float32)[:, None, None], 2, axis=2)

    with cache.step(1) as step:
        pool.update(0, step, rows([10]), -rows([10]), order="positions")
    with cache.step(4) as step:  # reads positions 0..4: one run, a view of rows 0..4
        k5, v5, positions = pool.update(0, step, rows([11, 12, 13, 14]), -rows([11, 12, 13, 14]), order="positions")
    assert positions.tolist() == [0, 1, 2, 3, 4] and not k5.flags.owndata
    cache.rewind(3)
    step = cache.begin_step(4)
    plan = step.plan(0)
    assert [tuple(r) for r in plan.write] == [(3, 3, 3), (0, 1, 6)]
    # Rows 0..3 as input: the first run overwrites row 3 (the second run's input)
    # and the second overwrites row 0 (the first run's input). No order works.
    before = k5.copy(), v5.copy()
    with pytest.raises(kvcore.InvalidArgumentError, match="overlap rows both runs write before reading them"):
        pool.write(0, plan, k5[0:4], v5[0:4])
    np.testing.assert_array_equal(k5, before[0])
    np.testing.assert_array_equal(v5, before[1])
    # Rows 1..4 as input: copying the second run first keeps it intact.
    pool.write(0, plan, k5[1:5], v5[1:5])
    k, v, positions = pool.read(0, plan, order="positions")
    assert positions.tolist() == [1, 2, 3, 4, 5, 6]
    np.testing.assert_array_equal(k, rows([11, 12, 11, 12, 13, 14]))
    np.testing.assert_array_equal(v, -rows([11, 12, 11, 12, 13, 14]))
