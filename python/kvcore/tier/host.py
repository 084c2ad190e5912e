"""``HostTier``: a bounded host-memory store beneath a ``BatchCache``, per block for flat models
and per record for the others (docs/tier.md)."""

from __future__ import annotations

import builtins
import time
import weakref
from typing import Any, Optional, Union, cast

import numpy as np
import numpy.typing as npt

from kvcore._core import BatchCache, block_keys
from kvcore._errors import CapacityError, InvalidArgumentError, InvalidStateError
from kvcore.state import RecordInfo, record_data
from kvcore.tier.blocks import BlockLayout
from kvcore.tier.facts import RecordFacts, Restored, prefix_facts
from kvcore.tier.keys import Namespace, Tokens, namespace_id, token_ids
from kvcore.tier.segments import Segments

#: (mode, namespace, block size, layout, key lo, key hi): mode _BLOCK (layout: a BlockLayout's
#: index) or _RECORD (layout -1, the key that of the record's last full block).
_Key = tuple[int, int, int, int, int, int]
_BLOCK, _RECORD = 0, 1


class _Block:
    """One held full block of a flat model: its token ids and rows (BlockLayout.split)."""

    __slots__ = ("data", "parent")

    def __init__(self, data: builtins.bytes, parent: Optional[tuple[int, int]]) -> None:
        self.data = data
        self.parent = parent  # the key of the block before it (None: a first block)

    @property
    def nbytes(self) -> int:
        return len(self.data)


class _Record(RecordFacts):
    """One held record of a model that is not flat (a ring, chunked or State layer)."""

    __slots__ = ("record", "last_used")

    def __init__(self, record: builtins.bytes, facts: RecordFacts) -> None:
        super().__init__(facts.namespace, facts.block_size, facts.keys, facts.length, facts.flat, facts.state)
        self.record = record
        self.last_used = 0

    @property
    def nbytes(self) -> int:
        return len(self.record)


def _cache_of(cache: Any, pool: Any, what: str) -> BatchCache:
    """Checks that `cache` is a BatchCache and `pool` its byte layer with records."""
    if not isinstance(cache, BatchCache):
        raise InvalidArgumentError(f"{what}: cache must be a kvcore.BatchCache, not {type(cache).__name__}")
    if getattr(pool, "cache", None) is not cache:
        raise InvalidArgumentError(f"{what}: pool ({type(pool).__name__}) is not the byte layer of this cache (pool.cache)")
    for method in ("export_sequence", "import_sequence"):
        if not callable(getattr(pool, method, None)):
            raise InvalidArgumentError(f"{what}: pool ({type(pool).__name__}) has no {method}: not a kvcore byte layer")
    return cast(BatchCache, cache)


def _flat(cache: BatchCache) -> bool:
    """Is every layer of `cache` Flat, or Shared with a Flat source (the tier holds it per block)?"""
    kinds = [cache.layer_config(i).policy for i in range(cache.n_layers)]
    return all(p.kind.name == "Flat" or (p.kind.name == "Shared" and kinds[p.source].kind.name == "Flat") for p in kinds)


class HostTier:
    """A bounded host store of a cache's prefixes: a flat model's **full blocks**, each held once,
    keyed by (namespace, block size, block key); another model's **records**, keyed by
    (namespace, block size, key of the record's last full block). Evicts least recently used
    first by a segmented LRU (``kvcore.tier.segments``: what was stored and not used since goes
    before what was used again, which may take up to `protected` of the capacity), never a
    block before a held block that extends it (what it holds of a prefix is always its first
    blocks).

    ``capacity_bytes``: the most bytes it holds (an int >= 0): a block's token ids and rows, a
    record's bytes. ``protected``: the fraction of them entries used again may keep (a number in
    [0, 1]; 0 is one plain LRU order). ``spill`` stores a sequence, ``put`` a record from elsewhere (validated),
    ``restore`` brings the longest prefix of a prompt it holds back into a device cache,
    ``longest`` answers without side effects. Counters: ``bytes`` (held now), ``hits`` and
    ``misses`` (restores that did / did not lengthen the device's hit), ``evictions`` (blocks
    and records dropped for room), ``bytes_restored``. InvalidArgumentError: capacity_bytes not
    an int >= 0.
    """

    def __init__(self, capacity_bytes: int, *, protected: float = 0.8) -> None:
        if isinstance(capacity_bytes, bool) or not isinstance(capacity_bytes, int) or capacity_bytes < 0:
            raise InvalidArgumentError(f"HostTier: capacity_bytes = {capacity_bytes!r}: must be an int >= 0")
        if isinstance(protected, bool) or not isinstance(protected, (int, float)) or not 0.0 <= protected <= 1.0:
            raise InvalidArgumentError(f"HostTier: protected = {protected!r}: must be a number in [0, 1]")
        self._capacity = capacity_bytes
        # A segmented LRU (segments.py). A block is always older than its parent in its segment,
        # and a protected block's parent is protected (every touch of a block touches the blocks
        # before it afterwards), so the next evicted is never a block a held block extends:
        # every held prefix stays whole.
        self._lru: Segments[_Key, Union[_Block, _Record]] = Segments(int(capacity_bytes * protected))
        self._layouts: list[BlockLayout] = []
        self._layout_ids: dict[builtins.bytes, int] = {}
        self._in_use: dict[tuple[int, int], dict[int, int]] = {}  # (ns, block) -> layout -> blocks held
        self._by_block: dict[tuple[int, int, int, int], set[_Key]] = {}  # a block's key -> records holding it
        self._pool_layout: Optional[tuple[Any, int]] = None  # (weak ref to the last pool spilled, its layout)
        self._bytes = 0
        self._blocks = 0
        self._clock = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self.bytes_restored = 0

    # --- what it holds ---------------------------------------------------------------------

    @property
    def capacity_bytes(self) -> int:
        """The most bytes the tier holds."""
        return self._capacity

    @property
    def bytes(self) -> int:
        """Bytes held now: each block's token ids and rows, each record's size (the tier's index
        is not counted)."""
        return self._bytes

    @property
    def blocks(self) -> int:
        """Full blocks of flat models held now."""
        return self._blocks

    @property
    def records(self) -> int:
        """Records of other models (ring, chunked, State layers) held now."""
        return len(self._lru) - self._blocks

    def __len__(self) -> int:
        """Entries held now: blocks and records."""
        return len(self._lru)

    def clear(self) -> None:
        """Forgets everything held (not counted as evictions); counters stay."""
        self._lru.clear()
        self._in_use.clear()
        self._by_block.clear()
        self._bytes = self._blocks = 0

    def block_keys_held(self) -> frozenset[tuple[int, int, int, int]]:
        """(namespace, block size, key lo, key hi) of every full block held, as a block or in a
        record: what a router may count as this tier's. A ring's or State layer's record serves
        fewer prefixes than it carries blocks (``longest`` is exact); no side effect."""
        held = {(k[1], k[2], k[4], k[5]) for k in self._lru if k[0] == _BLOCK}
        return frozenset(held.union(self._by_block))

    def longest(self, tokens: Tokens, block_size: int, namespace: Namespace = None, *, keep: bool = False) -> int:
        """The longest prefix of `tokens` (positions, a multiple of block_size) the tier holds in
        `namespace` and can give an ``adopt_prefix`` of `tokens` (at most len(tokens) - 1 tokens)
        after ``restore(..., keep=keep)``, 0 if none. No side effect (no recency moves).
        InvalidArgumentError: bad tokens, block_size < 1, a bad namespace."""
        ns = namespace_id(namespace)
        ids = token_ids(tokens, "longest")
        block = self._block_size(block_size)
        keys = self._prompt_keys(ids, block, ns)
        return max(self._held_run(keys, block, ns, 0)[1], self._find(keys, block, ns, 0, keep)[1]) * block

    # --- in ------------------------------------------------------------------------------------

    def spill(self, cache: BatchCache, pool: Any, seq: int, tokens: Tokens) -> int:
        """Exports active sequence `seq` of `cache` (its byte layer `pool`: a ``PagedKVPool`` or
        ``TorchPagedKVPool``) with its token ids `tokens` (every position's, len == its length)
        and stores it in the sequence's prefix namespace. A flat model's full blocks are stored
        each once: those the tier holds already only have their recency moved, and when they do
        not all fit in capacity_bytes the first ones that fit are stored. Another model's record
        is stored whole, unless held already. Call it before ``release_sequence``; the sequence
        is not changed. Returns the bytes stored (0: held already).

        InvalidArgumentError: not a BatchCache and its pool, bad tokens or not one per position.
        InvalidStateError: seq not active, a step is begun, positions removed (it keys nothing),
        shorter than one block, or a model with State layers at a length that is not a multiple
        of block_size (its state is named only at a block boundary). CapacityError: a record
        larger than capacity_bytes, or a flat sequence whose first block does not fit. Nothing
        changes on an error."""
        cache = _cache_of(cache, pool, "spill")
        if isinstance(seq, bool) or not isinstance(seq, int) or not 0 <= seq < cache.max_seqs:
            raise InvalidArgumentError(f"spill: seq = {seq!r}: must be an int in [0, {cache.max_seqs})")
        if not cache.sequence(seq).active:
            raise InvalidStateError(f"spill: sequence {seq} is not active")
        ids = token_ids(tokens, "spill")
        length, block = cache.length(seq), cache.block_size
        if len(ids) != length:
            raise InvalidArgumentError(
                f"spill: {len(ids)} tokens for sequence {seq} of length {length}: give every position's id"
            )
        if length < block:
            raise InvalidStateError(
                f"spill: sequence {seq} has length {length} < block_size {block}: no full block to key"
            )
        ns = cache.prefix_namespace(seq)
        keys = [(int(lo), int(hi)) for lo, hi in block_keys(ids[: length // block * block], block, ns)]
        flat = _flat(cache)
        if not flat and (_RECORD, ns, block, -1) + keys[-1] in self._lru:
            self._touch_record((_RECORD, ns, block, -1) + keys[-1])
            return 0
        last = self._pool_layout
        if flat and last is not None and last[0]() is pool and self._held_in(keys, block, ns, last[1]) == len(keys):
            self._touch_run(keys, block, ns, last[1], len(keys))  # every block held: nothing to export
            return 0
        record = pool.export_sequence(seq, ids)
        stored, layout = self._insert(record, ns, block, "spill", trusted=True)
        if layout >= 0:
            try:
                self._pool_layout = (weakref.ref(pool), layout)
            except TypeError:  # a byte layer without weak references: no shortcut
                self._pool_layout = None
        return stored

    def put(self, record: Any, *, namespace: Namespace, block_size: int) -> int:
        """Stores `record` (bytes-like or a path: from another process, a file, a store) as a
        prefix of namespace `namespace` in blocks of `block_size`. It is checked completely as an
        import checks it (``RecordInfo.of``: sizes, checksum, every field) before any of it is
        stored, and must carry every position's token id with nothing removed and at least one
        full block. A flat model's blocks are stored as ``spill`` stores them; another model's
        record whole (a copy). Returns the bytes stored (0: held already; its recency moves).

        InvalidArgumentError: truncated, corrupt or malformed (the import's errors), a bad
        namespace or block_size; NotSupportedError: a newer record version; InvalidStateError:
        token ids missing, positions removed, shorter than one block, a State layer at a length
        not a multiple of block_size; CapacityError: a record larger than capacity_bytes, or a
        flat record whose first block does not fit. Nothing changes on an error."""
        ns = namespace_id(namespace)
        block = self._block_size(block_size)
        return self._insert(record_data(record), ns, block, "put", trusted=False)[0]

    # --- out -----------------------------------------------------------------------------------

    def restore(self, cache: BatchCache, pool: Any, tokens: Tokens, namespace: Namespace = None, *,
                seq: Optional[int] = None, keep: bool = False) -> Restored:
        """Before admitting prompt `tokens` in prefix namespace `namespace` (None: 0): when the
        longest prefix of it the tier holds in that namespace is longer than the device's
        ``lookup_prefix`` hit, imports it (trusted in that namespace, so its full blocks are
        named by their keys) as sequence `seq` (default: the lowest inactive id): a flat model's
        as the record of exactly its held blocks, assembled from them; another model's held
        record. Otherwise imports nothing (a miss). Returns a ``Restored``. Nothing of another
        namespace is ever imported.

        keep=False: the sequence is released at once: its blocks wait cached and
        ``adopt_prefix(new_seq, tokens, namespace)`` hits them (a State model's at the record's
        length only: the import names its state after the last block as a snapshot, which needs
        ``BatchLimits.state_snapshots``).
        keep=True: `seq` stays active at the hit, as ``adopt_prefix(seq, tokens, namespace)``
        would leave it (``Restored.hit`` positions): the caller computes the rest of the prompt
        in it. A flat model serves every full-block prefix, another's record only its own length
        (a multiple of the block size).

        Call it between steps: a successful import ends a begun step, as every successful verb
        of the cache does.

        InvalidArgumentError: not a BatchCache and its pool, bad tokens, namespace or seq, a held
        record that fails the import's checks (corrupt: InvalidArgumentError,
        NotSupportedError) or whose token ids are not the prompt's: it is dropped from the tier
        (held blocks whose token ids are not the prompt's: dropped with the blocks after them);
        a record of another layout or dtype than the cache's (kept). InvalidStateError: seq
        active. CapacityError: no free sequence id or table row, too few free blocks for the
        record. The cache changes nothing on an error."""
        cache = _cache_of(cache, pool, "restore")
        ns = namespace_id(namespace)
        ids = token_ids(tokens, "restore")
        if len(ids) > cache.capacity:
            raise InvalidArgumentError(f"restore: {len(ids)} tokens > capacity {cache.capacity}")
        if not isinstance(keep, bool):
            raise InvalidArgumentError(f"restore: keep = {keep!r}: must be a bool")
        if seq is not None:
            seq = self._free_seq(cache, seq)  # refused whether the tier hits or not
        block = cache.block_size
        device_hit = cache.lookup_prefix(ids, ns)
        keys = self._prompt_keys(ids, block, ns)
        layout, n_run = self._held_run(keys, block, ns, device_hit // block)
        rec_key, n_rec = self._find(keys, block, ns, device_hit // block, keep)
        if max(n_run, n_rec) * block <= device_hit:
            self.misses += 1
            return Restored(device_hit, device_hit, 0, 0.0)
        start = time.perf_counter()
        record: Any
        if n_run >= n_rec:
            n = n_run * block
            run = [cast(_Block, self._lru[(_BLOCK, ns, block, layout) + keys[i]]).data for i in range(n_run)]
            record = self._layouts[layout].assemble(run)
            held = np.frombuffer(b"".join(r[: 4 * block] for r in run), "<i4")
            if not np.array_equal(held, ids[:n]):
                self._drop_run_from(keys, block, ns, layout, int(np.argmin(held == ids[:n])) // block)
                raise InvalidArgumentError(
                    f"restore: the blocks held for this prefix do not carry the prompt's first {n} token ids "
                    "in its namespace: dropped from the tier, nothing imported")
        else:
            n = n_rec * block
            entry = cast(_Record, self._lru[rec_key])
            record = entry.record
            try:
                info = RecordInfo.of(record)  # bytes from elsewhere: the import's checks, before anything
            except Exception:
                self._drop(rec_key)  # never served again
                raise
            tokens_held = np.asarray(info.tokens)
            if entry.namespace != ns or len(tokens_held) < n or not np.array_equal(tokens_held[:n], ids[:n]):
                self._drop(rec_key)
                raise InvalidArgumentError(
                    f"restore: the record stored for this prefix does not carry the prompt's first {n} token ids "
                    "in its namespace: dropped from the tier, nothing imported")
        seq = self._free_seq(cache, seq)
        if cache.free_table_rows < 1:
            raise CapacityError("restore: no free table row (batch.max_active_seqs sequences are active)")
        pool.import_sequence(seq, record, namespace=ns)  # checks everything first; changes nothing on error
        if keep:
            if cache.length(seq) > n:
                cache.rewind(seq, n)
            hit = cache.length(seq)
        else:
            cache.release_sequence(seq)
            hit = cache.lookup_prefix(ids, ns)
        seconds = time.perf_counter() - start
        if n_run >= n_rec:
            self._touch_run(keys, block, ns, layout, n_run)
        else:
            self._touch_record(rec_key)
        if hit > device_hit:
            self.hits += 1
        else:
            self.misses += 1
        self.bytes_restored += len(record)
        return Restored(device_hit, hit, len(record), seconds)

    # --- internals -----------------------------------------------------------------------------

    @staticmethod
    def _block_size(block_size: int) -> int:
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise InvalidArgumentError(f"block_size = {block_size!r}: must be an int >= 1")
        return block_size

    @staticmethod
    def _free_seq(cache: BatchCache, seq: Optional[int]) -> int:
        if seq is None:
            for s in range(cache.max_seqs):
                if not cache.sequence(s).active:
                    return s
            raise CapacityError(f"restore: every sequence id in [0, {cache.max_seqs}) is active: none to import into")
        if isinstance(seq, bool) or not isinstance(seq, int) or not 0 <= seq < cache.max_seqs:
            raise InvalidArgumentError(f"restore: seq = {seq!r}: must be an int in [0, {cache.max_seqs})")
        if cache.sequence(seq).active:
            raise InvalidStateError(f"restore: sequence {seq} is active: give an inactive id to import into")
        return seq

    @staticmethod
    def _prompt_keys(ids: npt.NDArray[np.int32], block: int, ns: int) -> list[tuple[int, int]]:
        """Keys of the prompt's blocks an adopt_prefix may hit (at most len - 1 tokens)."""
        usable = max(len(ids) - 1, 0) // block
        return [(int(lo), int(hi)) for lo, hi in block_keys(ids[: usable * block], block, ns)]

    def _held_in(self, keys: list[tuple[int, int]], block: int, ns: int, layout: int) -> int:
        """How many of `keys`' first blocks the tier holds in `layout`: held blocks are prefix
        closed, so a binary search finds the run's end."""
        lo, hi = 0, len(keys)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if (_BLOCK, ns, block, layout) + keys[mid - 1] in self._lru:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def _held_run(self, keys: list[tuple[int, int]], block: int, ns: int, above: int) -> tuple[int, int]:
        """(layout, blocks) of the longest run of the prompt's first blocks held in one layout,
        longer than `above` blocks; (-1, 0) if none."""
        best = (-1, 0)
        for layout in self._in_use.get((ns, block), {}):
            n = self._held_in(keys, block, ns, layout)
            if n > max(above, best[1]):
                best = (layout, n)
        return best

    def _find(self, keys: list[tuple[int, int]], block: int, ns: int, above: int, keep: bool) -> tuple[_Key, int]:
        """(record key, blocks) of the longest hit longer than `above` blocks a held record of
        namespace `ns` serves for the prompt; on a tie the smallest record, then the most recently
        used; ((), 0) if none."""
        if not self._by_block:
            return cast(_Key, ()), 0
        for i in range(len(keys) - 1, above - 1, -1):
            holders = self._by_block.get((ns, block) + keys[i])
            best: Optional[_Key] = None
            for k in holders or ():
                e = cast(_Record, self._lru[k])
                if e.namespace == ns and e.serves(i + 1, keep) and (best is None or self._cheaper(e, best)):
                    best = k
            if best is not None:
                return best, i + 1
        return cast(_Key, ()), 0

    def _insert(self, data: Any, ns: int, block: int, what: str, *, trusted: bool) -> tuple[int, int]:
        """Stores a record's blocks (flat) or the record; (bytes stored, layout or -1)."""
        info = RecordInfo.parse(data) if trusted else RecordInfo.of(data)  # untrusted: every check first
        n_full, flat, state = prefix_facts(info, block, what)
        keys = [(int(lo), int(hi)) for lo, hi in block_keys(np.asarray(info.tokens)[: n_full * block], block, ns)]
        if not flat:
            return self._insert_record(info, ns, block, keys, state, what), -1
        layout = BlockLayout(info, data, block)
        index = self._layout_ids.get(layout.signature)
        held = 0 if index is None else self._held_in(keys, block, ns, index)
        if held == 0 and layout.block_bytes > self._capacity:  # refused before anything is evicted
            raise CapacityError(f"{what}: a block of {layout.block_bytes} bytes > the tier's capacity_bytes "
                                f"{self._capacity}")
        if index is None:
            index = len(self._layouts)
            self._layouts.append(layout)
            self._layout_ids[layout.signature] = index
        layout = self._layouts[index]
        self._touch_run(keys, block, ns, index, held)  # the held run: newest, kept through eviction below
        room = self._capacity - self._bytes
        run = {(_BLOCK, ns, block, index) + k for k in keys[:held]}
        while room < (n_full - held) * layout.block_bytes:
            oldest = self._lru.oldest(run)  # least recently used first, never the held run (newest)
            if oldest is None:
                break
            room += self._lru[oldest].nbytes
            self._evict(oldest)
        fit = min(n_full - held, max(room, 0) // layout.block_bytes)
        new = layout.split(info, held, held + fit)
        for i in range(held + fit - 1, held - 1, -1):  # the last first: a block is added after its extensions
            self._lru.add((_BLOCK, ns, block, index) + keys[i], _Block(new[i - held], keys[i - 1] if i else None))
        for i in range(held - 1, -1, -1):  # the held run's blocks moved back to probation: newer than the new ones
            self._lru.refresh((_BLOCK, ns, block, index) + keys[i])
        if fit:
            use = self._in_use.setdefault((ns, block), {})
            use[index] = use.get(index, 0) + fit
            self._blocks += fit
            self._bytes += fit * layout.block_bytes
        return fit * layout.block_bytes, index

    def _insert_record(self, info: RecordInfo, ns: int, block: int, keys: list[tuple[int, int]], state: bool,
                       what: str) -> int:
        data = bytes(memoryview(info.data).cast("B"))
        if len(data) > self._capacity:
            raise CapacityError(f"{what}: a record of {len(data)} bytes > the tier's capacity_bytes {self._capacity}")
        key = (_RECORD, ns, block, -1) + keys[-1]
        if key in self._lru:
            self._touch_record(key)
            return 0
        while self._bytes + len(data) > self._capacity:
            oldest = self._lru.oldest()
            assert oldest is not None  # a record no larger than capacity fits once the tier is empty
            self._evict(oldest)
        entry = _Record(data, RecordFacts(ns, block, keys, info.length, False, state))
        self._clock += 1
        entry.last_used = self._clock
        self._lru.add(key, entry)
        for lo, hi in keys:
            self._by_block.setdefault((ns, block, lo, hi), set()).add(key)
        self._bytes += len(data)
        return len(data)

    def _touch_run(self, keys: list[tuple[int, int]], block: int, ns: int, layout: int, n: int) -> None:
        """Blocks 0..n-1 were used again: protected's newest, each newer than the blocks after it."""
        for i in range(n - 1, -1, -1):
            self._lru.touch((_BLOCK, ns, block, layout) + keys[i])

    def _touch_record(self, key: _Key) -> None:
        self._clock += 1
        cast(_Record, self._lru[key]).last_used = self._clock
        self._lru.touch(key)

    def _cheaper(self, a: _Record, b: _Key) -> bool:
        """Is record `a` cheaper to restore than held record `b`: fewer bytes, then more recent."""
        other = cast(_Record, self._lru[b])
        return (a.nbytes, -a.last_used) < (other.nbytes, -other.last_used)

    def _evict(self, key: _Key) -> None:
        self._drop(key)
        self.evictions += 1

    def _drop(self, key: _Key) -> None:
        entry = self._lru.pop(key)
        self._bytes -= entry.nbytes
        if key[0] == _BLOCK:
            self._blocks -= 1
            use = self._in_use[(key[1], key[2])]
            use[key[3]] -= 1
            if not use[key[3]]:
                del use[key[3]]
            return
        for lo, hi in cast(_Record, entry).keys:
            holders = self._by_block.get((key[1], key[2], lo, hi))
            if holders is not None:
                holders.discard(key)
                if not holders:
                    del self._by_block[(key[1], key[2], lo, hi)]

    def _drop_run_from(self, keys: list[tuple[int, int]], block: int, ns: int, layout: int, first: int) -> None:
        """Drops held block `first` of the prompt and every held block that extends it. A parent
        is newer than its children, so one pass from the newest end meets parents first."""
        gone = {keys[first]}
        self._drop((_BLOCK, ns, block, layout) + keys[first])
        for k in reversed([k for k in self._lru if k[0] == _BLOCK and k[1:4] == (ns, block, layout)]):
            if cast(_Block, self._lru[k]).parent in gone:
                gone.add((k[4], k[5]))
                self._drop(k)
