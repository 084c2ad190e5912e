"""atheris fuzz target over kvcore's Python entry points (issue 33; docs/robustness.md).

Each input drives a small BatchCache + PagedKVPool and a SequenceCache + KVPool
through a sequence of verbs whose array arguments come in every shape Python
allows: lists, tuples, numpy arrays of any dtype, strided, negative-stride,
stride-0 and Fortran views, ctypes arrays, memoryviews, read-only buffers,
DLPack producers and objects whose __index__ changes other arguments. A
refusal (a KVCacheError, TypeError, ValueError, BufferError) is fine; a crash,
a sanitizer report or a broken invariant fails: after every call the caches'
own accounting must still add up and every array they share must stay
read-only.

    python tests/fuzz/python_entry_fuzzer.py -max_total_time=20

(scripts/test.sh --fuzz runs it against the ASan build when there is one.)
"""

from __future__ import annotations

import ctypes
import sys
from typing import Any, Callable

import atheris

with atheris.instrument_imports():
    import numpy as np

    import kvcore

EXPECTED = (kvcore.KVCacheError, TypeError, ValueError, BufferError, OverflowError, IndexError)


class Shapes:
    """Turns fuzz bytes into hostile integer-array arguments."""

    def __init__(self, fdp: atheris.FuzzedDataProvider, victims: list[np.ndarray]) -> None:
        self.fdp = fdp
        self.victims = victims  # arrays an __index__ or DLPack producer may rewrite

    def ints(self, n: int, lo: int = -2, hi: int = 20) -> list[int]:
        return [self.fdp.ConsumeIntInRange(lo, hi) for _ in range(n)]

    def spoil(self) -> None:
        for v in self.victims:
            if v.flags.writeable and v.size:
                v.reshape(-1)[self.fdp.ConsumeIntInRange(0, v.size - 1)] = self.fdp.ConsumeIntInRange(-2**31, 2**31 - 1)

    @atheris.instrument_func
    def array(self, values: list[int]) -> Any:
        kind = self.fdp.ConsumeIntInRange(0, 14)
        fuzz = self
        if kind == 0:
            return values
        if kind == 1:
            return tuple(values)
        if kind == 2:
            a = np.array(values, np.int32)
            self.victims.append(a)
            return a
        if kind == 3:
            return np.array(values, np.int64)[::-1].copy()[::-1]  # negative stride
        if kind == 4:
            return np.repeat(np.array(values or [0], np.int64), 2)[::2]  # strided
        if kind == 5:
            return np.lib.stride_tricks.as_strided(np.array(values[:1] or [0], np.int32), (len(values),), (0,))
        if kind == 6:
            return (ctypes.c_int32 * len(values))(*[v & 0x7FFFFFFF for v in values])
        if kind == 7:
            return memoryview(np.array(values, np.int64))
        if kind == 8:
            dtype = [np.float64, np.bool_, np.uint64, np.int16, np.uint8, np.str_][self.fdp.ConsumeIntInRange(0, 5)]
            return np.array(values, np.int64).astype(dtype) if dtype is not np.str_ else np.array([str(v) for v in values])
        if kind == 9:
            a = np.array(values, np.int32)
            a.setflags(write=False)
            return a
        if kind == 10:

            class Evil:
                def __init__(self, v: int) -> None:
                    self.v = v

                def __index__(self) -> int:
                    fuzz.spoil()
                    return self.v

            return [Evil(v) for v in values]
        if kind == 11:
            inner = np.array(values, np.int64)

            class Producer:
                def __dlpack__(self, **kw: Any) -> Any:
                    fuzz.spoil()
                    return inner.__dlpack__(**kw)

                def __dlpack_device__(self) -> Any:
                    return inner.__dlpack_device__()

            return Producer()
        if kind == 12:
            return np.array(values, np.int64).reshape(1, -1) if values else np.zeros((1, 0), np.int64)
        if kind == 13:
            return [float(v) for v in values]
        return iter(values)


def check_frozen(a: Any) -> None:
    if isinstance(a, np.ndarray):
        try:
            a.setflags(write=True)
        except ValueError:
            return
        raise AssertionError("a shared array could be made writable")


def batch_invariants(c: kvcore.BatchCache) -> None:
    for g in range(c.n_groups):
        free, used, total = c.free_blocks(g), c.used_blocks(g), c.num_blocks(g)
        assert 0 <= free <= total and 0 <= used <= total, (g, free, used, total)
    for s in range(c.max_seqs):
        info = c.sequence(s)
        assert 0 <= info.length <= c.capacity
        if info.active:
            for g in range(c.n_groups):
                table = c.block_table(s, g)
                assert ((table >= -1) & (table < c.num_blocks(g))).all()


@atheris.instrument_func
def one_input(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    victims: list[np.ndarray] = []
    shapes = Shapes(fdp, victims)
    limits = kvcore.BatchLimits(block_size=fdp.ConsumeIntInRange(1, 4), max_seqs=4)
    layers = [kvcore.LayerConfig(kvcore.Flat(), 1, 2), kvcore.LayerConfig(kvcore.Ring(3, 1), 1, 2)]
    batch = kvcore.BatchCache(kvcore.CacheConfig(32, layers, max_step=4, batch=limits))
    paged = kvcore.PagedKVPool(batch, np.float32)
    seq = kvcore.SequenceCache(kvcore.CacheConfig(32, layers, max_step=4))
    pool = kvcore.KVPool(seq, np.float32)
    step = None
    tree = None
    for _ in range(fdp.ConsumeIntInRange(1, 12)):
        verb = fdp.ConsumeIntInRange(0, 10)
        n = fdp.ConsumeIntInRange(0, 5)
        call: Callable[[], Any]
        if verb == 0:
            call = lambda: batch.add_sequences(shapes.array(shapes.ints(n, -1, 4)))
        elif verb == 1:
            call = lambda: batch.release_sequences(shapes.array(shapes.ints(n, -1, 4)))
        elif verb == 2:
            call = lambda: batch.fork_many(fdp.ConsumeIntInRange(0, 3), shapes.array(shapes.ints(n, -1, 4)))
        elif verb == 3:
            T = shapes.ints(n, 0, 4)
            tokens = shapes.ints(sum(T), 0, 9)
            offsets = [0]
            for t in T:
                offsets.append(offsets[-1] + t)
            parents = [i - 1 for t in T for i in range(t)]
            kw: dict[str, Any] = {}
            if fdp.ConsumeBool():
                kw["tokens"] = shapes.array(tokens)
                if fdp.ConsumeBool():
                    kw["token_offsets"] = shapes.array(offsets)
            if fdp.ConsumeBool():
                kw["parents"] = shapes.array(parents)

            def call() -> Any:
                nonlocal step
                step = batch.begin_step(shapes.array(shapes.ints(n, -1, 4)), shapes.array(T), **kw)
                plan = step.plan()
                shared = paged.mask(step, 0)
                for a in (plan.seq_ids, plan.positions, plan.chain_index, shared):
                    check_frozen(a)
                # The plan's mask is a new, writable array (torch.from_numpy takes it as is): the same cells.
                assert np.array_equal(plan.mask(0), shared)
                return plan
        elif verb == 4 and step is not None:
            s = step
            call = lambda: batch.commit(s, accepted={fdp.ConsumeIntInRange(0, 3): shapes.array(shapes.ints(n, -1, 4))})
        elif verb == 5:
            call = lambda: batch.adopt_prefix(fdp.ConsumeIntInRange(0, 3), shapes.array(shapes.ints(n, 0, 9)))
        elif verb == 6:

            def call() -> Any:
                nonlocal tree
                tree = seq.begin_tree(shapes.array(shapes.ints(n, -1, 3)))
                for a in (tree.parents, tree.positions, tree.chain_index, tree.mask(0)):
                    check_frozen(a)
                kv = np.ones((tree.T, 1, 2), np.float32)
                for layer in range(seq.n_layers):
                    pool.update(layer, tree, kv, kv)
                return tree
        elif verb == 7 and tree is not None:
            t = tree
            call = lambda: pool.apply_copies(seq.commit(t, accepted=shapes.array(shapes.ints(n, -1, 4))))
        elif verb == 8:
            rows = [shapes.ints(2, -1, 40) for _ in range(n)]
            call = lambda: pool.apply_copies([shapes.array(sum(rows, [])), shapes.array([])])
        elif verb == 9:
            size = fdp.ConsumeIntInRange(0, 4096)
            out = [np.zeros(size, np.uint8), np.zeros(2 * size, np.uint8)[::2], np.zeros(size, np.uint8)[::-1],
                   bytearray(size), bytes(size)][fdp.ConsumeIntInRange(0, 4)]
            call = lambda: pool.export_into(out, tokens=shapes.array(shapes.ints(n, -3, 9)))
        else:
            call = lambda: pool.export_sequence(tokens=shapes.array(shapes.ints(n, -3, 9)))
        try:
            call()
        except EXPECTED:
            pass
        batch_invariants(batch)
        assert 0 <= seq.length <= seq.capacity


def main() -> None:
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
