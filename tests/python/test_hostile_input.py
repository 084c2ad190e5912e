"""The native extension under hostile Python input (issue 33).

Every case here either crashed the interpreter, wrote outside a buffer, or was
accepted with a wrong result before the bindings read every array argument
once, into storage the call owns (python/src/int_args.h), checked every output
buffer (python/src/record_io.h) and froze the arrays they share
(python/src/frozen_array.h). Calls that once crashed run in a child process, so
a crash fails the test instead of the run; each such child compares the cache
it drove with a twin given the legitimate call.
"""

from __future__ import annotations

import array
import ctypes
import os
import subprocess
import sys
import textwrap
from typing import Any, Callable

import numpy as np
import pytest
from needs import need

import kvcore

# Imported by every child: small caches, and `same(a, b)` comparing two BatchCaches.
PRELUDE = """
import array, ctypes, sys
import numpy as np
import kvcore

def batch(max_seqs=4, block_size=4):
    limits = kvcore.BatchLimits(block_size=block_size, max_seqs=max_seqs)
    return kvcore.BatchCache(kvcore.CacheConfig(64, kvcore.LayerConfig(kvcore.Flat(), 1, 4), max_step=16, batch=limits))

def state(c):
    infos = [(i.active, i.length, i.visible_start, tuple(i.holes)) for i in map(c.sequence, range(c.max_seqs))]
    return infos, [c.used_blocks(g) for g in range(c.n_groups)], [c.cached_blocks(g) for g in range(c.n_groups)]

def same(a, b):
    assert state(a) == state(b), (state(a), state(b))

def same_plan(p, q):
    for name in ("seq_ids", "query_starts", "first_positions", "context_lens", "positions", "chain_index"):
        assert np.array_equal(getattr(p, name), getattr(q, name)), name
    for g, h in zip(p.groups, q.groups):
        assert np.array_equal(g.slots, h.slots) and np.array_equal(g.block_tables, h.block_tables)
"""


def run_isolated(body: str) -> str:
    """Runs PRELUDE + body in a child interpreter; fails (with its output) unless it exits 0."""
    code = PRELUDE + textwrap.dedent(body)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ))
    assert done.returncode == 0, f"exit {done.returncode}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
    return done.stdout


# --- crashes: ctypes arrays (NULL strides) -------------------------------------------------------

CTYPES_CASES = {
    "add_sequences": """
        a, b = batch(), batch()
        a.add_sequences((ctypes.c_int32 * 2)(0, 1)); b.add_sequences([0, 1])
        same(a, b)
    """,
    "release_sequences": """
        a, b = batch(), batch()
        for c in (a, b): c.add_sequences([0, 1, 2])
        a.release_sequences((ctypes.c_int64 * 2)(0, 2)); b.release_sequences([0, 2])
        same(a, b)
    """,
    "fork_many": """
        a, b = batch(), batch()
        for c in (a, b):
            c.add_sequence(0); c.step([(0, 6)])
        a.fork_many(0, (ctypes.c_int32 * 2)(1, 3)); b.fork_many(0, [1, 3])
        same(a, b)
    """,
    "begin_step": """
        a, b = batch(), batch()
        for c in (a, b): c.add_sequences([0, 1])
        sa = a.begin_step((ctypes.c_int32 * 2)(0, 1), (ctypes.c_int64 * 2)(3, 2),
                          tokens=(ctypes.c_int32 * 5)(1, 2, 3, 4, 5), token_offsets=(ctypes.c_int64 * 3)(0, 3, 5))
        sb = b.begin_step(np.array([0, 1]), np.array([3, 2]), tokens=[1, 2, 3, 4, 5], token_offsets=[0, 3, 5])
        same_plan(sa.plan(), sb.plan())
        a.commit(sa); b.commit(sb)
        same(a, b)
    """,
    "begin_tree": """
        cfg = kvcore.CacheConfig(64, kvcore.LayerConfig(kvcore.Ring(4, 1), 1, 4), max_step=8)
        a, b = kvcore.SequenceCache(cfg), kvcore.SequenceCache(cfg)
        sa = a.begin_tree((ctypes.c_int32 * 4)(-1, 0, 0, 1)); sb = b.begin_tree([-1, 0, 0, 1])
        assert np.array_equal(sa.parents, sb.parents) and np.array_equal(sa.positions, sb.positions)
    """,
    "commit(accepted)": """
        cfg = kvcore.CacheConfig(64, kvcore.LayerConfig(kvcore.Ring(4, 1), 1, 4), max_step=8)
        a, b = kvcore.SequenceCache(cfg), kvcore.SequenceCache(cfg)
        sa = a.begin_tree([-1, 0, 0, 1]); sb = b.begin_tree([-1, 0, 0, 1])
        ca = sa.commit(accepted=(ctypes.c_int64 * 3)(0, 1, 3)); cb = sb.commit(accepted=[0, 1, 3])
        assert a.length == b.length == 3
        assert all(np.array_equal(x, y) for x, y in zip(ca, cb))
    """,
}


@pytest.mark.parametrize("verb", sorted(CTYPES_CASES))
def test_a_ctypes_array_is_read_like_a_list(verb: str) -> None:
    run_isolated(CTYPES_CASES[verb])


def test_a_ctypes_array_of_another_integer_kind_is_refused_by_name() -> None:
    c = kvcore.BatchCache(kvcore.CacheConfig(64, kvcore.LayerConfig(kvcore.Flat(), 1, 4),
                                             batch=kvcore.BatchLimits(block_size=4, max_seqs=4)))
    with pytest.raises(kvcore.InvalidArgumentError, match=r"add_sequences: seqs.dtype = format '<h': must be int32 or int64"):
        c.add_sequences((ctypes.c_int16 * 2)(0, 1))
    with pytest.raises(kvcore.InvalidArgumentError, match=r"add_sequences: seqs.dtype = format '<d': must be int32 or int64"):
        c.add_sequences((ctypes.c_double * 2)(0, 1))
    assert not c.sequence(0).active


# --- crashes: values changed by Python code between validation and use ---------------------------

def test_offsets_an_index_changes_after_validation_are_not_trusted() -> None:
    # Evil.__index__ (a parent) rewrote token_offsets after they were validated;
    # the second read was trusted and pointed 2**40 ints before the tokens.
    run_isolated("""
        a, b = batch(), batch()
        for c in (a, b): c.add_sequences([0, 1])
        offs = np.array([0, 2, 4], np.int64)
        class Evil:
            def __index__(self):
                offs[1] = -2**40
                return -1
        seqs, tokens = np.array([0, 1]), np.array([7, 8, 9, 10], np.int32)
        sa = a.begin_step(seqs, 2, tokens=tokens, token_offsets=offs, parents=[-1, 0, Evil(), 0])
        sb = b.begin_step(seqs, 2, tokens=tokens, token_offsets=[0, 2, 4], parents=[-1, 0, -1, 0])
        same_plan(sa.plan(), sb.plan())
        a.commit(sa); b.commit(sb)
        same(a, b)
    """)


def test_a_dlpack_producer_cannot_change_validated_offsets() -> None:
    # The same through a DLPack producer whose export runs Python code (as one
    # that releases the GIL lets another thread do).
    run_isolated("""
        a, b = batch(), batch()
        for c in (a, b): c.add_sequences([0, 1])
        offs = np.array([0, 2, 4], np.int64)
        class Producer:
            def __init__(self, arr): self.arr = arr
            def __dlpack__(self, **kw):
                offs[1] = -2**40
                return self.arr.__dlpack__(**kw)
            def __dlpack_device__(self): return self.arr.__dlpack_device__()
        seqs, tokens = np.array([0, 1]), np.array([7, 8, 9, 10], np.int32)
        sa = a.begin_step(seqs, 2, tokens=tokens, token_offsets=offs, parents=Producer(np.array([-1, 0, -1, 0])))
        sb = b.begin_step(seqs, 2, tokens=tokens, token_offsets=[0, 2, 4], parents=[-1, 0, -1, 0])
        same_plan(sa.plan(), sb.plan())
    """)


def test_token_ids_freed_by_an_index_are_never_read() -> None:
    # A parent's __index__ emptied the array.array of tokens: the prefix cache
    # named blocks from freed memory, and the prompt later hit 8 positions of 16.
    run_isolated("""
        c = batch(block_size=8)
        c.add_sequences([0, 1])
        prompt = list(range(100, 116))
        tokens = array.array('i', prompt + [5, 6])
        class Evil:
            def __index__(self):
                del tokens[:]
                return 0
        parents = list(range(-1, 15)) + [-1, Evil()]
        step = c.begin_step(np.array([0, 1]), np.array([16, 2]), tokens=tokens, parents=parents)
        c.commit(step)
        c.release_sequences([0, 1])
        c.add_sequence(2)
        assert c.adopt_prefix(2, prompt + [1]) == 16
    """)


@pytest.mark.parametrize("container", ["list", "torch"])
def test_token_ids_are_copied_before_other_arguments_run_code(container: str) -> None:
    if container == "torch":
        need("torch")
    run_isolated(f"""
        c = batch(block_size=8)
        c.add_sequences([0, 1])
        prompt = list(range(100, 116))
        if {container!r} == "torch":
            import torch
            tokens = torch.tensor(prompt + [5, 6], dtype=torch.int32)
            def spoil(): tokens.set_()
        else:
            tokens = prompt + [5, 6]
            def spoil(): tokens[:] = [0] * 18
        class Evil:
            def __index__(self):
                spoil()
                return 0
        step = c.begin_step(np.array([0, 1]), np.array([16, 2]), tokens=tokens,
                            parents=list(range(-1, 15)) + [-1, Evil()])
        c.commit(step)
        c.release_sequences([0, 1])
        c.add_sequence(2)
        assert c.adopt_prefix(2, prompt + [1]) == 16
    """)


# --- crashes: output buffers -------------------------------------------------------------------

def _exporting_pool() -> tuple[kvcore.KVPool, int]:
    cache = kvcore.SequenceCache(kvcore.CacheConfig(32, kvcore.LayerConfig(kvcore.Flat(), 1, 4), max_step=4))
    pool = kvcore.KVPool(cache, np.float32)
    with cache.step(3) as step:
        pool.update(0, step, np.ones((3, 1, 4), np.float32), np.ones((3, 1, 4), np.float32))
    return pool, pool.export_size()


BAD_OUTPUTS: dict[str, Callable[[int], Any]] = {
    "negative stride": lambda n: np.zeros(n + 9, np.uint8)[::-1],
    "stride 0": lambda n: np.lib.stride_tricks.as_strided(np.zeros(8, np.uint8), (n + 9,), (0,)),
    "strided": lambda n: np.zeros(2 * n + 16, np.uint8)[::2],
    "Fortran-ordered": lambda n: np.zeros((8, n // 8 + 2), np.uint8, order="F"),
}


@pytest.mark.parametrize("kind", sorted(BAD_OUTPUTS))
@pytest.mark.parametrize("call", ["export_into", "seal_record"])
def test_output_buffers_that_are_not_c_contiguous_are_refused(call: str, kind: str) -> None:
    # A negative-stride view got the record's bytes before its start (outside
    # the buffer), a strided or Fortran-ordered one got them in the wrong places.
    run_isolated(f"""
        cache = kvcore.SequenceCache(kvcore.CacheConfig(32, kvcore.LayerConfig(kvcore.Flat(), 1, 4), max_step=4))
        pool = kvcore.KVPool(cache, np.float32)
        n = pool.export_size()
        make = {{
            "negative stride": lambda: np.zeros(n + 9, np.uint8)[::-1],
            "stride 0": lambda: np.lib.stride_tricks.as_strided(np.zeros(8, np.uint8), (n + 9,), (0,)),
            "strided": lambda: np.zeros(2 * n + 16, np.uint8)[::2],
            "Fortran-ordered": lambda: np.zeros((8, n // 8 + 2), np.uint8, order="F"),
        }}[{kind!r}]
        out = make()
        before = np.array(out.base if out.base is not None else out, copy=True)
        try:
            pool.export_into(out) if {call!r} == "export_into" else kvcore._core.seal_record(out)
        except kvcore.InvalidArgumentError as e:
            assert "out: is not C-contiguous" in str(e), e
        else:
            raise AssertionError("accepted")
        assert np.array_equal(before, out.base if out.base is not None else out)
    """)


def test_output_buffers_must_be_writable_and_c_contiguous() -> None:
    pool, n = _exporting_pool()
    read_only = np.zeros(n, np.uint8)
    read_only.setflags(write=False)
    with pytest.raises(kvcore.InvalidArgumentError, match="export_into: out: is read-only: must be writable"):
        pool.export_into(read_only)
    with pytest.raises(kvcore.InvalidArgumentError, match="seal_record: out: is read-only: must be writable"):
        kvcore._core.seal_record(bytes(n))
    with pytest.raises(kvcore.InvalidArgumentError, match="export_into: out: is not C-contiguous"):
        pool.export_into(np.zeros(2 * n, np.uint8)[::2])
    # A C-contiguous 2-D buffer and a bytearray are fine: their bytes are in order.
    out = np.zeros((2, n), np.uint8)
    assert pool.export_into(out) == n
    assert out.tobytes()[:n] == pool.export_sequence()
    raw = bytearray(n)
    pool.export_into(raw)
    assert bytes(raw) == pool.export_sequence()


# --- accepted with wrong results: silent casts -------------------------------------------------

@pytest.mark.parametrize(
    ("tokens", "error", "text"),
    [
        ([1.5], TypeError, r"export_sequence: tokens\[0\] = 1.5: must be an int, got float"),
        (np.array([1.5]), kvcore.InvalidArgumentError, "export_sequence: tokens.dtype = float64: must be int32 or int64"),
        (np.array([2**63], np.uint64), kvcore.InvalidArgumentError, "export_sequence: tokens.dtype = uint64: must be int32 or int64"),
        (np.array([True]), kvcore.InvalidArgumentError, "export_sequence: tokens.dtype = bool: must be int32 or int64"),
        (np.array(["1"]), kvcore.InvalidArgumentError, "export_sequence: tokens.dtype = <U1: must be int32 or int64"),
        ([2**40], kvcore.InvalidArgumentError, r"export_sequence: tokens\[0\] = 1099511627776: must fit in a 32-bit signed int"),
    ],
    ids=["float", "float array", "uint64 2**63", "bool array", "str array", "beyond 32 bits"],
)
def test_token_ids_are_never_cast(tokens: Any, error: type[BaseException], text: str) -> None:
    # 1.5 became 1 and a uint64 2**63 became 0 in the record's token ids.
    pool, _ = _exporting_pool()
    with pytest.raises(error, match=text):
        pool.export_sequence(tokens=tokens)
    with pytest.raises(error, match=text.replace("export_sequence", "export_into")):
        pool.export_into(np.zeros(4096, np.uint8), tokens=tokens)


def _tree_pool() -> tuple[kvcore.SequenceCache, kvcore.KVPool, kvcore.Step]:
    cache = kvcore.SequenceCache(kvcore.CacheConfig(32, [kvcore.LayerConfig(kvcore.Flat(), 1, 2)] * 2, max_step=8))
    pool = kvcore.KVPool(cache, np.float32)
    with cache.step(3) as step:
        for layer in range(2):
            pool.update(layer, step, np.zeros((3, 1, 2), np.float32), np.zeros((3, 1, 2), np.float32))
    tree = cache.begin_tree([-1, 0, 0, 2])
    rng = np.random.default_rng(0)
    for layer in range(2):
        kv = rng.standard_normal((4, 1, 2)).astype(np.float32)
        pool.update(layer, tree, kv, kv + 1)
    return cache, pool, tree


def _rows(pool: kvcore.KVPool, cache: kvcore.SequenceCache) -> bytes:
    """Every row the cache's sequence holds, as its record carries them."""
    return pool.export_sequence()


@pytest.mark.parametrize(
    "bad",
    [np.array([[True, False]]), np.array([["3", "4"]]), np.array([[3.0, 4.0]]), [[3, 4.5]], [[3, 4, 5]], [3]],
    ids=["bool", "str", "float", "float item", "3 columns", "flat list"],
)
def test_row_copies_are_never_cast(bad: Any) -> None:
    # bool, string and float arrays were cast (True -> row 1) and copied.
    cache, pool, tree = _tree_pool()
    copies = tree.commit(accepted=[0, 2, 3])
    before = _rows(pool, cache)
    with pytest.raises((kvcore.InvalidArgumentError, TypeError)):
        pool.apply_copies([bad, copies[1]])
    assert _rows(pool, cache) == before
    pool.apply_copies(copies)  # the real ones still apply

    batch = kvcore.BatchCache(kvcore.CacheConfig(64, kvcore.LayerConfig(kvcore.Flat(), 1, 2),
                                                 batch=kvcore.BatchLimits(block_size=4, max_seqs=2)))
    paged = kvcore.PagedKVPool(batch, np.float32)
    batch.add_sequence(0)
    step = batch.begin_step([(0, 3, None, [-1, 0, 0])])
    paged.update(0, step, np.ones((3, 1, 2), np.float32), np.ones((3, 1, 2), np.float32))
    real = batch.commit(step, accepted={0: [0, 2]})
    with pytest.raises((kvcore.InvalidArgumentError, TypeError)):
        paged.apply_copies((bad,))
    paged.apply_copies(real)


def test_a_list_row_of_row_copies_names_its_rule() -> None:
    batch = kvcore.BatchCache(kvcore.CacheConfig(64, kvcore.LayerConfig(kvcore.Flat(), 1, 2),
                                                 batch=kvcore.BatchLimits(block_size=4, max_seqs=2)))
    paged = kvcore.PagedKVPool(batch, np.float32)
    with pytest.raises(kvcore.InvalidArgumentError, match=r"apply_copies: copies\[0\]\[1\] must be a list of 2 ints"):
        paged.apply_copies(([[0, 1], [2]],))


def test_apply_copies_refuses_rows_the_tree_step_never_wrote() -> None:
    # Its docstring promised InvalidStateError; a forged copy overwrote a committed row.
    cache, pool, tree = _tree_pool()
    copies = tree.commit(accepted=[0, 2, 3])
    before = _rows(pool, cache)
    forged = np.array([[3, 0]], np.int32)  # row 0 holds position 0, committed long ago
    with pytest.raises(kvcore.InvalidStateError, match=r"apply_copies: copies\[0\]\[0\] names row 0, which the layer's last tree step did not write"):
        pool.apply_copies([forged, copies[1]])
    assert _rows(pool, cache) == before
    pool.apply_copies(copies)
    after = _rows(pool, cache)
    with pytest.raises(kvcore.InvalidStateError, match="no tree step was written since the last copies"):
        pool.apply_copies(copies)  # once: they were applied
    assert _rows(pool, cache) == after
    fresh = kvcore.KVPool(kvcore.SequenceCache(cache.config), np.float32)
    with pytest.raises(kvcore.InvalidStateError, match="did not write"):
        fresh.apply_copies([np.array([[1, 0]], np.int32)] * 2)


# --- accepted with wrong results: arrays the API shares ----------------------------------------

def _frozen_for_good(a: np.ndarray) -> None:
    """Neither `a` nor any array it is a view of can be made writable."""
    chain = [a]
    while isinstance(chain[-1].base, np.ndarray):
        chain.append(chain[-1].base)
    for x in chain:
        with pytest.raises(ValueError):
            x.setflags(write=True)


def test_the_arrays_a_step_shares_stay_read_only() -> None:
    cache = kvcore.SequenceCache(kvcore.CacheConfig(32, [kvcore.LayerConfig(kvcore.Ring(4, 1), 1, 2)], max_step=8))
    pool = kvcore.KVPool(cache, np.float32)
    step = cache.begin_tree([-1, 0, 0, 1])
    shared = {
        "mask": step.mask(0), "mask positions": step.mask(0, order="positions"), "parents": step.parents,
        "positions": step.positions, "chain_index": step.chain_index, "tree_mask_packed": step.tree_mask_packed,
        "tree_rows": step.tree_rows(0), "dense_tree_mask": step.dense_tree_mask(0),
    }
    kv = np.ones((4, 1, 2), np.float32)
    shared["update positions"] = pool.update(0, step, kv, kv)[2]
    shared["commit copies"] = step.commit(accepted=[0, 1, 3])[0]
    with cache.step(2) as chain:
        shared["chain mask"] = chain.mask(0)
        shared["read positions"] = pool.update(0, chain, kv[:2], kv[:2], order="positions")[2]
    for name, a in shared.items():
        assert isinstance(a, np.ndarray), name
        _frozen_for_good(a)


def test_the_arrays_a_batch_step_shares_stay_read_only() -> None:
    batch = kvcore.BatchCache(kvcore.CacheConfig(64, kvcore.LayerConfig(kvcore.Flat(), 1, 2),
                                                 batch=kvcore.BatchLimits(block_size=4, max_seqs=2)))
    paged = kvcore.PagedKVPool(batch, np.float32)
    batch.add_sequence(0)
    step = batch.begin_step([(0, 3, None, [-1, 0, 0])])
    plan = step.plan()
    group = plan.groups[0]
    shared = {"PagedKVPool.mask": paged.mask(step, 0), "seq_ids": plan.seq_ids,
              "positions": plan.positions, "chain_index": plan.chain_index, "tree_masks": plan.tree_masks,
              "slots": group.slots, "block_tables": group.block_tables}
    for name, a in shared.items():
        _frozen_for_good(a)
    before = paged.mask(step, 0).copy()
    with pytest.raises(ValueError):
        paged.mask(step, 0)[0, 0] = not before[0, 0]
    assert np.array_equal(paged.mask(step, 0), before)


def test_a_memoryview_and_an_array_array_are_read() -> None:
    c = kvcore.BatchCache(kvcore.CacheConfig(64, kvcore.LayerConfig(kvcore.Flat(), 1, 4),
                                             batch=kvcore.BatchLimits(block_size=4, max_seqs=4)))
    c.add_sequences(memoryview(array.array("q", [0, 1])))
    c.release_sequences(array.array("i", [1]))
    assert c.sequence(0).active and not c.sequence(1).active
    ro = np.array([2, 3], np.int32)
    ro.setflags(write=False)
    c.add_sequences(ro)  # inputs may be read-only
    assert c.sequence(3).active


def test_buffers_changed_or_freed_after_the_call_change_no_result() -> None:
    # Nothing the caches keep or return aliases a caller's buffer: a prompt
    # overwritten and freed between begin_step and commit still names its blocks,
    # and parents rewritten after begin_tree leave the tree as it was.
    run_isolated("""
        import gc
        c = batch(block_size=8)
        c.add_sequence(0)
        prompt = list(range(100, 116))
        tokens = np.array(prompt, np.int32)
        step = c.begin_step(np.array([0]), 16, tokens=tokens)
        tokens[:] = 0
        del tokens
        gc.collect()
        c.commit(step)
        c.release_sequence(0)
        c.add_sequence(1)
        assert c.adopt_prefix(1, prompt + [1]) == 16

        cfg = kvcore.CacheConfig(64, kvcore.LayerConfig(kvcore.Ring(4, 1), 1, 4), max_step=8)
        seq = kvcore.SequenceCache(cfg)
        parents = np.array([-1, 0, 0, 1], np.int32)
        tree = seq.begin_tree(parents)
        held = tree.parents
        parents[:] = [-1, 0, 1, 2]
        del parents
        gc.collect()
        assert held.tolist() == tree.parents.tolist() == [-1, 0, 0, 1]
    """)


def test_sets_and_dicts_are_refused_as_integer_arrays() -> None:
    # Read in hash order, a set of token ids would name a prompt no one wrote.
    c = kvcore.BatchCache(kvcore.CacheConfig(64, kvcore.LayerConfig(kvcore.Flat(), 1, 4),
                                             batch=kvcore.BatchLimits(block_size=4, max_seqs=4)))
    c.add_sequence(0)
    with pytest.raises(kvcore.InvalidArgumentError, match="adopt_prefix: tokens must be a 1-D int32 or int64 array"):
        c.adopt_prefix(0, {3, 1, 2})
    with pytest.raises(kvcore.InvalidArgumentError, match="add_sequences: seqs must be a 1-D int32 or int64 array"):
        c.add_sequences({1: None})
    assert c.adopt_prefix(0, (t for t in (3, 1, 2))) == 0  # an ordered iterable is read
    assert not c.sequence(1).active


def test_an_abandoned_tree_step_leaves_no_rows_to_copy() -> None:
    # Its write runs outlived it on a layer the next step did not write.
    cache, pool, tree = _tree_pool()
    pool.apply_copies(tree.commit(accepted=[0, 2, 3]))
    abandoned = cache.begin_tree([-1, 0, 0])  # rows 6, 7, 8
    for layer in range(2):
        pool.update(layer, abandoned, np.ones((3, 1, 2), np.float32), np.ones((3, 1, 2), np.float32))
    chain = cache.begin_step(1)  # a new step replaces the abandoned tree and writes layer 0 only
    pool.update(0, chain, np.ones((1, 1, 2), np.float32), np.ones((1, 1, 2), np.float32))
    cache.commit(chain)
    before = _rows(pool, cache)
    with pytest.raises(kvcore.InvalidStateError, match="did not write"):
        pool.apply_copies([np.zeros((0, 2), np.int32), np.array([[7, 6]], np.int32)])  # the abandoned tree's rows
    assert _rows(pool, cache) == before
