"""Regression (found by the boundary work, issue 7): `Class.__new__(Class)`
makes a kvcore object without its C++ half, and pybind11 used to allocate an
uninitialized one on first use, so `kvcore.SequenceCache.__new__(
kvcore.SequenceCache).begin_step(1)` ran on garbage memory (wrong answers or a
crash). Now every use raises TypeError ("never initialized"), or, where a binding takes
the object's shared_ptr holder, pybind11's RuntimeError ("Unable to cast from
non-held to held instance").

The probe runs in a child interpreter so that a regression fails this test
instead of killing the test session.
"""

from __future__ import annotations

import textwrap

from blank_probe import assert_blank_objects_refuse_every_use

SETUP = textwrap.dedent(
    """
    import numpy as np
    import kvcore, kvcore._core

    def fresh():
        cfg = kvcore.CacheConfig(8, kvcore.LayerConfig(kvcore.Ring(2), 1, 2), max_step=2)
        cache = kvcore.SequenceCache(cfg)
        step = cache.begin_step(1)
        live = {
            "SequenceCache": cache, "Step": step, "KVPool": kvcore.KVPool(cache, np.float32),
            "CacheConfig": cfg, "LayerConfig": cfg.layers[0], "LayerPolicy": kvcore.Ring(2),
            "Run": kvcore.Run(0, 1, 0), "SeqStepPlan": step.plan(0), "CacheBase": cache,
        }
        return live, cache, step

    # Every public method and property of every class, called with the
    # arguments that work on a live object of that class.
    calls = {
        "SequenceCache": ["length", "capacity", "max_step", "n_layers", "n_groups", "config", "active_step",
                          "rows(0)", "group_of(0)", "layer_policy(0)", "can_extend(1)", "can_rewind(0)",
                          "begin_step(1)", "step(1)", "plan(0, 0, 1)", "rewind(0)", "clear()", "visible(0, 1, 0)",
                          "commit(step)", "__repr__()"],
        "Step": ["position", "T", "end", "is_current", "plan(0)", "mask(0)", "commit()", "__repr__()"],
        "KVPool": ["cache", "dtype", "n_layers", "nbytes", "reserved_bytes", "rows(0)", "allocated_rows(0)",
                   "reserve(0, 1)", "read(0, step.plan(0))", "__repr__()"],
        "CacheConfig": ["capacity", "n_layers", "max_step", "initial_capacity", "layers", "__repr__()"],
        "LayerConfig": ["policy", "n_kv_heads", "head_dim", "v_head_dim", "value_dim", "__repr__()"],
        "LayerPolicy": ["kind", "window", "sinks", "is_ring", "__repr__()", "__hash__()"],
        "Run": ["row", "len", "pos", "__repr__()", "__hash__()", "__iter__()"],
        "SeqStepPlan": ["write", "read", "write_len", "read_len", "is_contiguous", "__repr__()"],
        "CacheBase": [],
    }
    uses = ["kvcore.SequenceCache(blank)", "cache.commit(blank)", "kvcore.KVPool(blank)",
                    "kvcore.LayerConfig(blank, 1, 2)", "live['KVPool'].read(0, blank)"]
    """
)


def test_objects_made_by_new_without_init_refuse_every_use() -> None:
    assert_blank_objects_refuse_every_use(SETUP)


def test_a_builder_returning_an_uninitialized_cache_is_internal() -> None:
    import kvcore

    def blank_builder(cfg: kvcore.CacheConfig) -> kvcore.CacheBase:
        return kvcore.SequenceCache.__new__(kvcore.SequenceCache)

    kvcore.register_builder("py", "blank", blank_builder)
    try:
        cfg = kvcore.CacheConfig(8, kvcore.LayerConfig(kvcore.Ring(2), 1, 2))
        try:
            kvcore.build("py", "blank", cfg)
        except kvcore.InternalError as e:
            assert "builder ('py', 'blank') failed: Unable to cast from non-held to held" in str(e)
        else:
            raise AssertionError("a never-initialized cache was accepted")
    finally:
        kvcore.unregister_builder("py", "blank")
