"""Config objects (docs/design.md section 2, Config rules): every field's rule is
enforced on construction with a message naming the field, its value and the rule;
valid configs keep what they were given."""

from __future__ import annotations

from typing import Any

import pytest

import kvcore
from conftest import layer

FLAT = layer(kvcore.Flat())
RING = layer(kvcore.Ring(window=4, sinks=1))

# --- policies ------------------------------------------------------------------


def test_flat_and_ring_policies() -> None:
    flat, ring = kvcore.Flat(), kvcore.Ring(window=8, sinks=2)
    assert (flat.kind, flat.window, flat.sinks, flat.is_ring) == (kvcore.LayerPolicy.Kind.Flat, 0, 0, False)
    assert (ring.kind, ring.window, ring.sinks, ring.is_ring) == (kvcore.LayerPolicy.Kind.Ring, 8, 2, True)
    assert kvcore.Ring(8).sinks == 0
    assert ring == kvcore.Ring(8, 2) and ring != kvcore.Ring(8, 1) and ring != kvcore.Ring(7, 2) and ring != flat
    assert flat == kvcore.Flat() and hash(flat) == hash(kvcore.Flat())
    assert len({ring, kvcore.Ring(8, 2), flat, kvcore.Flat()}) == 2
    assert flat != "Flat()" and flat not in [None, 0]  # other types compare unequal
    assert int(kvcore.LayerPolicy.Kind.Ring) == 1 and kvcore.LayerPolicy.Kind.Flat.name == "Flat"


@pytest.mark.parametrize(
    ("kwargs", "text"),
    [
        ({"window": 0}, "window = 0: a Ring layer needs window >= 1"),
        ({"window": -3}, "window = -3"),
        ({"window": 4, "sinks": -1}, "sinks = -1: a Ring layer needs sinks >= 0"),
        ({"window": 2**31}, "window = 2147483648: must fit in a 32-bit signed int"),
        ({"window": 4, "sinks": 2**31}, "sinks = 2147483648"),
        ({"window": -(2**31) - 1}, "window = -2147483649"),
        ({"window": 2**64}, f"window = {2**64}"),
    ],
)
def test_ring_rejects_bad_fields(kwargs: dict[str, int], text: str) -> None:
    with pytest.raises(kvcore.InvalidArgumentError) as info:
        kvcore.Ring(**kwargs)
    assert text in str(info.value)


def test_ring_accepts_the_largest_int() -> None:
    assert kvcore.Ring(2**31 - 1, 2**31 - 1).window == 2**31 - 1


def test_policies_have_no_public_constructor() -> None:
    with pytest.raises(TypeError):
        kvcore.LayerPolicy()


# --- LayerConfig ---------------------------------------------------------------


def test_layer_config_fields() -> None:
    cfg = kvcore.LayerConfig(kvcore.Ring(4), n_kv_heads=2, head_dim=64)
    assert (cfg.policy, cfg.n_kv_heads, cfg.head_dim, cfg.v_head_dim, cfg.value_dim) == (kvcore.Ring(4), 2, 64, 0, 64)
    mla = kvcore.LayerConfig(kvcore.Flat(), 1, 192, v_head_dim=128)
    assert (mla.v_head_dim, mla.value_dim) == (128, 128)
    # v_head_dim 0 means head_dim: the same layer as spelling it out.
    assert cfg == kvcore.LayerConfig(kvcore.Ring(4), 2, 64, v_head_dim=64)
    assert cfg != kvcore.LayerConfig(kvcore.Ring(4), 2, 32) and cfg != kvcore.LayerConfig(kvcore.Ring(5), 2, 64)
    assert cfg != (kvcore.Ring(4), 2, 64)


@pytest.mark.parametrize(
    ("kwargs", "text"),
    [
        ({"n_kv_heads": 0}, "n_kv_heads = 0: must be >= 1"),
        ({"n_kv_heads": -1}, "n_kv_heads = -1"),
        ({"head_dim": 0}, "head_dim = 0: must be >= 1"),
        ({"head_dim": -64}, "head_dim = -64"),
        ({"v_head_dim": -1}, "v_head_dim = -1: must be >= 1 (or 0 for head_dim)"),
        ({"n_kv_heads": 2**31}, "n_kv_heads = 2147483648: must fit in a 32-bit signed int"),
        ({"head_dim": 2**40}, f"head_dim = {2**40}"),
        ({"v_head_dim": 2**31}, "v_head_dim = 2147483648"),
    ],
)
def test_layer_config_rejects_bad_fields(kwargs: dict[str, int], text: str) -> None:
    args: dict[str, Any] = {"policy": kvcore.Flat(), "n_kv_heads": 1, "head_dim": 8, **kwargs}
    with pytest.raises(kvcore.InvalidArgumentError) as info:
        kvcore.LayerConfig(**args)
    assert str(info.value).startswith(text)  # names the field as the caller wrote it


# --- CacheConfig ---------------------------------------------------------------


def test_cache_config_keeps_what_it_was_given() -> None:
    cfg = kvcore.CacheConfig(100, [RING, RING, FLAT], max_step=7, initial_capacity=16)
    assert (cfg.capacity, cfg.n_layers, cfg.max_step, cfg.initial_capacity) == (100, 3, 7, 16)
    assert cfg.layers == (RING, RING, FLAT)


def test_cache_config_broadcasts_one_layer() -> None:
    cfg = kvcore.CacheConfig(32, RING, n_layers=4)
    assert cfg.n_layers == 4 and cfg.layers == (RING,) * 4
    assert kvcore.CacheConfig(32, [RING], n_layers=4).layers == (RING,) * 4
    assert kvcore.CacheConfig(32, (RING, FLAT)).layers == (RING, FLAT)  # any sequence
    assert kvcore.CacheConfig(32, RING).n_layers == 1


@pytest.mark.parametrize(("capacity", "expected"), [(1, 1), (100, 100), (512, 512), (513, 512), (4096, 512)])
def test_cache_config_default_max_step_is_min_512_capacity(capacity: int, expected: int) -> None:
    assert kvcore.CacheConfig(capacity, FLAT).max_step == expected
    assert kvcore.SequenceCache(kvcore.CacheConfig(capacity, FLAT)).max_step == expected


def test_cache_config_limits_are_inclusive() -> None:
    cfg = kvcore.CacheConfig(2**31 - 1, [RING, FLAT], max_step=2**31 - 1)
    assert cfg.capacity == cfg.max_step == 2**31 - 1
    assert kvcore.CacheConfig(5, FLAT, max_step=5, initial_capacity=1).max_step == 5


BAD_CACHE_CONFIGS: dict[str, tuple[dict[str, Any], str]] = {
    "capacity=0": ({"capacity": 0}, "capacity = 0: must be >= 1"),
    "capacity<0": ({"capacity": -5}, "capacity = -5: must be >= 1"),
    "capacity=2**31": ({"capacity": 2**31}, "capacity = 2147483648: must fit in a 32-bit signed int"),
    "capacity=2**80": ({"capacity": 2**80}, f"capacity = {2**80}"),
    "layers-empty": ({"layers": []}, "layers is empty"),
    "layers-empty-with-n_layers": ({"layers": [], "n_layers": 2}, "layers has 0 entries: must be 1 (broadcast) or n_layers = 2"),
    "layers-vs-n_layers": ({"layers": [FLAT, FLAT, FLAT], "n_layers": 2}, "layers has 3 entries: must be 1 (broadcast) or n_layers = 2"),
    "n_layers=0": ({"n_layers": 0}, "n_layers = 0: must be >= 1"),
    "n_layers<0": ({"n_layers": -1}, "n_layers = -1: must be >= 1"),
    "n_layers=2**31": ({"n_layers": 2**31}, "n_layers = 2147483648"),
    "max_step=0": ({"max_step": 0}, "max_step = 0: must be >= 1"),
    "max_step<0": ({"max_step": -2}, "max_step = -2: must be >= 1"),
    "max_step>capacity": ({"capacity": 8, "max_step": 9}, "max_step = 9: must be <= capacity = 8"),
    "max_step=2**31": ({"max_step": 2**31}, "max_step = 2147483648"),
    "initial_capacity=0": ({"initial_capacity": 0}, "initial_capacity = 0: must be >= 1"),
    "initial_capacity=2**31": ({"initial_capacity": 2**31}, "initial_capacity = 2147483648"),
}


@pytest.mark.parametrize("name", list(BAD_CACHE_CONFIGS))
def test_cache_config_rejects_bad_fields(name: str) -> None:
    overrides, text = BAD_CACHE_CONFIGS[name]
    args: dict[str, Any] = {"capacity": 16, "layers": [RING, FLAT], **overrides}
    with pytest.raises(kvcore.InvalidArgumentError) as info:
        kvcore.CacheConfig(**args)
    assert str(info.value).startswith(text), str(info.value)


@pytest.mark.parametrize(
    "args",
    [
        {"capacity": 8, "layers": [1, 2]},
        {"capacity": 8, "layers": "FLAT"},
        {"capacity": 8, "layers": kvcore.Flat()},  # a policy is not a layer
        {"capacity": 8.0, "layers": FLAT},
        {"capacity": 8, "layers": FLAT, "n_layers": "2"},
        {"capacity": 8, "layers": FLAT, "max_step": 1.5},
    ],
)
def test_cache_config_rejects_wrong_types_with_type_error(args: dict[str, Any]) -> None:
    with pytest.raises(TypeError):
        kvcore.CacheConfig(**args)


def test_sequence_cache_needs_a_cache_config() -> None:
    with pytest.raises(TypeError):
        kvcore.SequenceCache(RING)  # type: ignore[arg-type]


def test_sequence_cache_keeps_its_config() -> None:
    cfg = kvcore.CacheConfig(40, [RING, FLAT, RING], max_step=3)
    cache = kvcore.SequenceCache(cfg)
    assert (cache.capacity, cache.max_step, cache.n_layers, cache.length) == (40, 3, 3, 0)
    assert repr(cache.config) == repr(cfg)
    assert [cache.layer_policy(l) for l in range(3)] == [RING.policy, FLAT.policy, RING.policy]


def test_identical_policies_share_one_policy_object() -> None:
    # Same policy, different row shapes: still one policy object.
    wide = kvcore.LayerConfig(kvcore.Ring(window=4, sinks=1), n_kv_heads=8, head_dim=128)
    layers = [RING, FLAT, wide, layer(kvcore.Ring(4)), FLAT, layer(kvcore.Ring(5, 1))]
    cache = kvcore.SequenceCache(kvcore.CacheConfig(64, layers, max_step=4))
    index = [cache.group_of(l) for l in range(6)]
    assert cache.n_groups == 4
    assert index[0] == index[2] and index[1] == index[4]
    assert len({index[0], index[1], index[3], index[5]}) == 4
    assert kvcore.SequenceCache(kvcore.CacheConfig(64, RING, n_layers=30)).n_groups == 1


@pytest.mark.parametrize(
    ("window", "sinks", "max_step", "capacity", "rows"),
    [
        (4, 0, 1, 64, 4),  # R = W + C - 1
        (4, 2, 3, 64, 2 + 6),  # S + R
        (4, 2, 3, 8, 8),  # S + R >= capacity: never wraps, rows = capacity
        (4, 2, 3, 9, 8),
        (2**31 - 1, 2**31 - 1, 2**31 - 1, 2**31 - 1, 2**31 - 1),  # sums without int overflow
    ],
)
def test_ring_rows_follow_the_design(window: int, sinks: int, max_step: int, capacity: int, rows: int) -> None:
    cfg = kvcore.CacheConfig(capacity, [layer(kvcore.Ring(window, sinks)), FLAT], max_step=max_step)
    cache = kvcore.SequenceCache(cfg)
    assert cache.rows(0) == min(capacity, sinks + window + max_step - 1) == rows
    assert cache.rows(1) == capacity


def test_a_huge_int_is_shortened_and_the_rule_survives() -> None:
    # A 302-digit value must not push the rule out of the message.
    with pytest.raises(kvcore.InvalidArgumentError) as info:
        kvcore.Ring(window=2**1000)
    message = str(info.value)
    assert message.startswith("window = 10715086071862673209...(302 digits)")
    assert message.endswith("must fit in a 32-bit signed int")
