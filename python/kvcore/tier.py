"""The host tier: a bounded host-memory store of sequence records beneath a ``BatchCache``.

A device pool's least-recently-used eviction throws away prefixes later prompts could reuse
(issue 42). ``HostTier`` keeps them in host memory as **records** (docs/state.md): a sequence
about to be released (or any active one) is exported, with its token ids, and stored under
``(namespace, block size, key of its last full block)``; before a prompt is admitted,
``restore`` finds the longest prefix of it the tier holds in the prompt's namespace and,
when that is longer than the device's ``lookup_prefix`` hit, imports the record into a free
sequence id trusted in that namespace (its full blocks named by their keys) and releases it:
the blocks then wait cached on the device and the caller's ``adopt_prefix`` hits them. The
record is the unit of transfer, so a restore is exact by construction: every plan and read
after it equals the exporter's (docs/state.md, "Exactness").

The tier evicts whole records, least recently used first, when its bytes would pass its
capacity; it reports ``bytes``, ``hits``, ``misses`` and ``evictions``. A flat model's record
serves every full-block prefix of its tokens, so the tier keeps one copy of a prefix: a record
whose full blocks a held flat record holds is not stored, and one that extends held flat
records supersedes them (a conversation's turns take one record's bytes, not one per turn).
Records that enter by
``put`` are bytes from elsewhere: they are validated as an import validates them, and again
by the import at restore. One thread at a time (as the cache). docs/tier.md says what it
promises, what it costs and what is left.
"""

from __future__ import annotations

import builtins
import hashlib
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Optional, Sequence, Union, cast

import numpy as np
import numpy.typing as npt

from kvcore._core import BatchCache, block_keys
from kvcore._errors import CapacityError, InvalidArgumentError, InvalidStateError
from kvcore.state import RecordInfo, record_data

__all__ = ["HostTier", "RecordFacts", "Restored"]

Namespace = Optional[Union[int, bytes, str]]
Tokens = Union[Sequence[int], npt.NDArray[np.integer[Any]]]
_Key = tuple[int, int, int, int]  # (namespace, block size, key lo, key hi)


def namespace_id(namespace: Namespace) -> int:
    """The 64-bit prefix namespace `namespace` names, as ``BatchCache.add_sequence`` reads it:
    None is 0, an int in [0, 2**64) itself, bytes or str (UTF-8) its BLAKE2b digest (8 bytes,
    personalization ``b"kvcore-ns"``, little-endian). InvalidArgumentError: a bool, an int out of
    range, another type."""
    if namespace is None:
        return 0
    if isinstance(namespace, bool):
        raise InvalidArgumentError("namespace: must be None, an int in [0, 2**64), bytes or str, not a bool")
    if isinstance(namespace, int):
        if not 0 <= namespace < 1 << 64:
            raise InvalidArgumentError(f"namespace = {namespace}: an int namespace must be in [0, 2**64)")
        return namespace
    if isinstance(namespace, (str, bytes)):
        data = namespace.encode("utf-8") if isinstance(namespace, str) else namespace
        return int.from_bytes(hashlib.blake2b(data, digest_size=8, person=b"kvcore-ns").digest(), "little")
    raise InvalidArgumentError(
        f"namespace: must be None, an int in [0, 2**64), bytes or str, not {type(namespace).__name__}"
    )


def token_ids(tokens: Tokens, what: str) -> npt.NDArray[np.int32]:
    """`tokens` (an ordered sequence or 1-D array of ints) as a 1-D int32 array, a copy: the check
    the host tier and the cluster store make of a prompt. InvalidArgumentError names `what` and
    what is wrong (an unordered collection, a string, another shape or dtype, an id beyond 32 bits)."""
    if isinstance(tokens, (set, frozenset, dict, str, bytes)):
        raise InvalidArgumentError(f"{what}: tokens must be an ordered sequence of ints, not a {type(tokens).__name__}")
    try:
        arr = np.asarray(tokens)
    except (TypeError, ValueError) as e:
        raise InvalidArgumentError(f"{what}: tokens must be a 1-D sequence of ints ({e})") from None
    if arr.size == 0:
        arr = arr.reshape(0).astype(np.int64)
    if arr.ndim != 1 or arr.dtype.kind not in "iu":
        raise InvalidArgumentError(f"{what}: tokens must be a 1-D sequence of ints, not {arr.dtype} of shape {arr.shape}")
    if arr.size and (int(arr.min()) < -(1 << 31) or int(arr.max()) >= 1 << 31):
        raise InvalidArgumentError(f"{what}: a token id is beyond 32 bits")
    return np.ascontiguousarray(arr, dtype=np.int32).copy()


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


@dataclass(frozen=True)
class Restored:
    """What one ``HostTier.restore`` did. Positions are tokens; ``bytes`` are the record's bytes
    read by the import (host to device), 0 when nothing was imported."""

    #: The device's prefix hit for the prompt before the restore (positions).
    device_hit: int
    #: The device's prefix hit after it: what ``adopt_prefix`` now gives (positions).
    hit: int
    #: The record's bytes moved into the device pool (0: nothing restored).
    bytes: int
    #: Wall time of the import and release (seconds; 0.0 when nothing was imported).
    seconds: float

    @property
    def tokens(self) -> int:
        """Positions of the prompt the restore added to the device's hit (``hit - device_hit``)."""
        return self.hit - self.device_hit


class RecordFacts:
    """What a tier knows of one validated record (kvcore.tier's host tier and kvcore.cluster's
    store): its prefix namespace id, its block size in tokens, the chained keys of its full
    blocks (``kvcore.block_keys``), its length in tokens, ``flat`` (every layer flat, or shared
    with a flat one: any full-block prefix serves) and ``state`` (a State layer: an import names
    no state snapshot). ``serves`` is the rule both tiers apply to a hit."""

    __slots__ = ("namespace", "block_size", "keys", "length", "flat", "state")

    def __init__(self, namespace: int, block_size: int, keys: list[tuple[int, int]], length: int, flat: bool,
                 state: bool) -> None:
        self.namespace = namespace
        self.block_size = block_size
        self.keys = keys
        self.length = length
        self.flat = flat
        self.state = state

    def serves(self, n_blocks: int, keep: bool) -> bool:
        """Can the record give a hit of `n_blocks` full blocks? A flat model's at every boundary
        (keep=True rewinds to it). Otherwise released (keep=False) only at its last full block and
        only without State layers (a ring's window is carried at the record's length only, and an
        import names no state snapshot: docs/state.md); kept (keep=True) only at its length."""
        if not 1 <= n_blocks <= len(self.keys):
            return False
        if self.flat:
            return True
        if keep:
            return n_blocks * self.block_size == self.length
        return not self.state and n_blocks == len(self.keys)


class _Entry(RecordFacts):
    """One stored record of the host tier: its bytes, its facts, when it was last used."""

    __slots__ = ("record", "last_used")

    def __init__(self, record: bytes, namespace: int, block_size: int, keys: list[tuple[int, int]], length: int,
                 flat: bool, state: bool) -> None:
        super().__init__(namespace, block_size, keys, length, flat, state)
        self.record = record
        self.last_used = 0


class HostTier:
    """A bounded host store of sequence records keyed by (namespace, block size, key of the
    record's last full block), evicting whole records least recently used first.

    ``capacity_bytes``: the most record bytes it holds (an int >= 0). ``spill`` stores a
    sequence's record, ``put`` a record from elsewhere (validated), ``restore`` brings the
    longest prefix of a prompt it holds back into a device cache, ``longest`` answers without
    side effects. Counters: ``bytes`` (held now), ``hits`` and ``misses`` (restores that did /
    did not lengthen the device's hit), ``evictions`` (records dropped for room),
    ``superseded`` (flat records dropped because a longer one holds their blocks),
    ``bytes_restored``. InvalidArgumentError: capacity_bytes not an int >= 0.
    """

    def __init__(self, capacity_bytes: int) -> None:
        if isinstance(capacity_bytes, bool) or not isinstance(capacity_bytes, int) or capacity_bytes < 0:
            raise InvalidArgumentError(f"HostTier: capacity_bytes = {capacity_bytes!r}: must be an int >= 0")
        self._capacity = capacity_bytes
        self._entries: OrderedDict[_Key, _Entry] = OrderedDict()  # least recently used first
        self._by_block: dict[_Key, set[_Key]] = {}  # a block's key -> records holding that block
        self._bytes = 0
        self._clock = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self.superseded = 0
        self.bytes_restored = 0

    # --- what it holds ---------------------------------------------------------------------

    @property
    def capacity_bytes(self) -> int:
        """The most record bytes the tier holds."""
        return self._capacity

    @property
    def bytes(self) -> int:
        """Record bytes held now (the records' sizes; the tier's index is not counted)."""
        return self._bytes

    def __len__(self) -> int:
        """Records held now."""
        return len(self._entries)

    def clear(self) -> None:
        """Forgets every record (not counted as evictions); counters stay."""
        self._entries.clear()
        self._by_block.clear()
        self._bytes = 0

    def block_keys_held(self) -> frozenset[tuple[int, int, int, int]]:
        """(namespace, block size, key lo, key hi) of every full block some held record carries: what
        a router may count as this tier's. A ring's or State layer's record serves fewer prefixes
        than it carries blocks (``longest`` is exact); no side effect."""
        return frozenset(self._by_block)

    def longest(self, tokens: Tokens, block_size: int, namespace: Namespace = None, *, keep: bool = False) -> int:
        """The longest prefix of `tokens` (positions, a multiple of block_size) a record held in
        `namespace` can give an ``adopt_prefix`` of `tokens` (at most len(tokens) - 1 tokens) after
        ``restore(..., keep=keep)``, 0 if none. No side effect (no record's recency moves).
        InvalidArgumentError: bad tokens, block_size < 1, a bad namespace."""
        ns = namespace_id(namespace)
        found = self._find(token_ids(tokens, "longest"), self._block_size(block_size), ns, 0, keep)
        return 0 if found is None else found[1]

    # --- in ------------------------------------------------------------------------------------

    def spill(self, cache: BatchCache, pool: Any, seq: int, tokens: Tokens) -> int:
        """Exports active sequence `seq` of `cache` (its byte layer `pool`: a ``PagedKVPool`` or
        ``TorchPagedKVPool``) with its token ids `tokens` (every position's, len == its length)
        and stores the record in the sequence's prefix namespace, unless the tier holds that
        prefix already (its recency then moves; for a flat model also as a prefix of a longer
        record, and a stored flat record supersedes held ones it extends). Call it before
        ``release_sequence``; the sequence is not changed. Returns the bytes stored (0: already
        held).

        InvalidArgumentError: not a BatchCache and its pool, bad tokens or not one per position.
        InvalidStateError: seq not active, a step is begun, positions removed (its record keys
        nothing), shorter than one block, or a model with State layers at a length that is not a
        multiple of block_size (its state is named only at a block boundary). CapacityError: the
        record is larger than capacity_bytes. Nothing changes on an error."""
        cache = _cache_of(cache, pool, "spill")
        if not isinstance(seq, int) or not 0 <= seq < cache.max_seqs:
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
        last = block_keys(ids[: length // block * block], block, ns)[-1]
        key = (ns, block, int(last[0]), int(last[1]))
        if key in self._entries:
            self._touch(key)
            return 0
        record = bytes(pool.export_sequence(seq, ids))
        return self._insert(record, ns, block, "spill")

    def put(self, record: Any, *, namespace: Namespace, block_size: int) -> int:
        """Stores `record` (bytes-like or a path: from another process, a file, a store) as a
        prefix of namespace `namespace` in blocks of `block_size`. It is checked as an import
        checks it (``RecordInfo.of``), and must carry every position's token id with nothing
        removed and at least one full block; the tier keeps a copy. Returns the bytes stored (0:
        the tier holds that prefix already, for a flat model also as a prefix of a longer record;
        its recency moves; a stored flat record supersedes held flat ones it extends).

        InvalidArgumentError: truncated, corrupt or malformed (the import's errors), a bad
        namespace or block_size; NotSupportedError: a newer record version; InvalidStateError:
        token ids missing, positions removed, shorter than one block, a State layer at a length
        not a multiple of block_size; CapacityError: larger than capacity_bytes. Nothing changes
        on an error."""
        ns = namespace_id(namespace)
        block = self._block_size(block_size)
        data = bytes(memoryview(record_data(record)).cast("B"))
        return self._insert(data, ns, block, "put")

    # --- out -----------------------------------------------------------------------------------

    def restore(self, cache: BatchCache, pool: Any, tokens: Tokens, namespace: Namespace = None, *,
                seq: Optional[int] = None, keep: bool = False) -> Restored:
        """Before admitting prompt `tokens` in prefix namespace `namespace` (None: 0): when the
        longest prefix of it a record of that namespace serves is longer than the device's
        ``lookup_prefix`` hit, imports the record (trusted in that namespace, so its full blocks
        are named by their keys) as sequence `seq` (default: the lowest inactive id). Otherwise
        imports nothing (a miss). Returns a ``Restored``. A record of another namespace is never
        imported.

        keep=False: the sequence is released at once: its blocks wait cached and
        ``adopt_prefix(new_seq, tokens, namespace)`` hits them. Serves K/V layers only (an import
        names no State layer's state snapshot: a State model's record serves only keep=True).
        keep=True: `seq` stays active, truncated to the hit, as ``adopt_prefix(seq, tokens,
        namespace)`` would leave it (``Restored.hit`` positions): the caller computes the rest of
        the prompt in it. A flat model's record serves every full-block prefix, another's only
        its own length (a multiple of the block size).

        Call it between steps: a successful import ends a begun step, as every successful verb
        of the cache does.

        InvalidArgumentError: not a BatchCache and its pool, bad tokens, namespace or seq, a
        stored record that fails the import's checks (corrupt: InvalidArgumentError,
        NotSupportedError) or whose token ids are not the prompt's: that record is dropped from
        the tier; a record of another layout or dtype than the cache's (kept). InvalidStateError:
        seq active. CapacityError: no free sequence id or table row, too few free blocks for the
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
        device_hit = cache.lookup_prefix(ids, ns)
        found = self._find(ids, cache.block_size, ns, device_hit, keep)
        if found is None:
            self.misses += 1
            return Restored(device_hit, device_hit, 0, 0.0)
        key, n = found
        entry = self._entries[key]
        try:
            info = RecordInfo.of(entry.record)  # bytes from elsewhere: the import's checks, before anything
        except Exception:
            self._drop(key)  # never served again
            raise
        held = np.asarray(info.tokens)
        if entry.namespace != ns or len(held) < n or not np.array_equal(held[:n], ids[:n]):
            self._drop(key)
            raise InvalidArgumentError(
                f"restore: the record stored for this prefix does not carry the prompt's first {n} token ids "
                "in its namespace: dropped from the tier, nothing imported"
            )
        seq = self._free_seq(cache, seq)
        if cache.free_table_rows < 1:
            raise CapacityError("restore: no free table row (batch.max_active_seqs sequences are active)")
        start = time.perf_counter()
        pool.import_sequence(seq, entry.record, namespace=ns)  # checks everything first; changes nothing on error
        if keep:
            if cache.length(seq) > n:
                cache.rewind(seq, n)  # a flat model's: every rewind is within reach (serves())
            hit = cache.length(seq)
        else:
            cache.release_sequence(seq)
        seconds = time.perf_counter() - start
        if not keep:
            hit = cache.lookup_prefix(ids, ns)
        self._touch(key)
        if hit > device_hit:
            self.hits += 1
        else:
            self.misses += 1
        self.bytes_restored += len(entry.record)
        return Restored(device_hit, hit, len(entry.record), seconds)

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

    def _find(self, ids: npt.NDArray[np.int32], block: int, ns: int, above: int,
              keep: bool) -> Optional[tuple[_Key, int]]:
        """(record key, hit positions) of the longest hit longer than `above` a held record of
        namespace `ns` serves for prompt `ids`; on a tie the smallest record (the fewest bytes to
        import and blocks to take), then the most recently used; None if none."""
        usable = max(len(ids) - 1, 0) // block  # adopt_prefix takes at most len - 1 tokens
        if usable * block <= above:
            return None
        keys = block_keys(ids[: usable * block], block, ns)
        for i in range(usable - 1, above // block - 1, -1):
            holders = self._by_block.get((ns, block, int(keys[i][0]), int(keys[i][1])))
            if not holders:
                continue
            best: Optional[_Key] = None
            for k in holders:
                e = self._entries[k]
                if e.namespace == ns and e.serves(i + 1, keep) and (best is None or self._cheaper(e, self._entries[best])):
                    best = k
            if best is not None:
                return best, (i + 1) * block
        return None

    def _insert(self, record: builtins.bytes, ns: int, block: int, what: str) -> int:
        info = RecordInfo.of(record)  # the import's checks: truncated, corrupt, malformed, newer
        if info.start != 0 or info.holes:
            raise InvalidStateError(f"{what}: the record removed positions (start {info.start}, "
                                    f"{len(info.holes)} holes): it keys no prefix")
        if len(info.tokens) != info.length:
            raise InvalidStateError(f"{what}: the record carries {len(info.tokens)} token ids for length "
                                    f"{info.length}: it keys no prefix without every one")
        n_full = info.length // block
        if n_full == 0:
            raise InvalidStateError(f"{what}: the record's length {info.length} < block_size {block}: no full block to key")
        kinds = [layer.kind for layer in info.layers]
        if "state" in kinds and info.length % block:
            raise InvalidStateError(
                f"{what}: length {info.length} is not a multiple of block_size {block} and the model has State layers: "
                "a state is named only at a block boundary, so the record would serve no prefix"
            )
        if len(record) > self._capacity:
            raise CapacityError(f"{what}: a record of {len(record)} bytes > the tier's capacity_bytes {self._capacity}")
        keys = [(int(lo), int(hi)) for lo, hi in block_keys(np.asarray(info.tokens)[: n_full * block], block, ns)]
        key = (ns, block) + keys[-1]
        if key in self._entries:
            self._touch(key)
            return 0
        flat = all(k == "flat" or (k == "shared" and kinds[layer.param] == "flat")
                   for k, layer in zip(kinds, info.layers))
        if flat:
            # A flat record serves every full-block prefix of its tokens: one held already that
            # holds this record's last full block (so every block before it) serves all this one
            # would; held ones whose last full block is one of this record's are superseded by it.
            for k in self._by_block.get(key, ()):
                if self._entries[k].flat:
                    self._touch(k)
                    return 0
            for lo, hi in keys[:-1]:
                shorter = self._entries.get((ns, block, lo, hi))
                if shorter is not None and shorter.flat:
                    self._drop((ns, block, lo, hi))
                    self.superseded += 1
        while self._bytes + len(record) > self._capacity:
            self._drop(next(iter(self._entries)))
            self.evictions += 1
        entry = _Entry(record, ns, block, keys, info.length, flat, "state" in kinds)
        self._entries[key] = entry
        self._touch(key)
        for lo, hi in keys:
            self._by_block.setdefault((ns, block, lo, hi), set()).add(key)
        self._bytes += len(record)
        return len(record)

    @staticmethod
    def _cheaper(a: _Entry, b: _Entry) -> bool:
        return (len(a.record), -a.last_used) < (len(b.record), -b.last_used)

    def _touch(self, key: _Key) -> None:
        self._clock += 1
        self._entries[key].last_used = self._clock
        self._entries.move_to_end(key)

    def _drop(self, key: _Key) -> None:
        entry = self._entries.pop(key)
        self._bytes -= len(entry.record)
        for lo, hi in entry.keys:
            block_key = (entry.namespace, entry.block_size, lo, hi)
            holders = self._by_block.get(block_key)
            if holders is not None:
                holders.discard(key)
                if not holders:
                    del self._by_block[block_key]
