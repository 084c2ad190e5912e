"""The cluster store's index (``RecordStore``): records keyed by namespaced prefix keys, LRU by
bytes, run in this process or as a Ray actor (``start_store``); ``store_call`` calls either."""

from __future__ import annotations

import dataclasses
import threading
from collections import OrderedDict
from typing import Any, Optional, Sequence

from kvcore._errors import CapacityError, InvalidArgumentError
from kvcore.cluster.checks import key_pairs, positive, u64
from kvcore.tier import RecordFacts

_Key = tuple[int, int, int, int]  # (namespace, block size, key lo, key hi)


@dataclasses.dataclass(frozen=True)
class StoreHit:
    """A store lookup's answer: ``entry`` (the stored record's id, for ``refuse``), ``tokens``
    (positions of the prompt it serves, a multiple of the block size), ``nbytes`` (the record's
    bytes) and ``value`` (a one-item list: a Ray object ref to the record, or the record itself in
    one process)."""

    entry: int
    tokens: int
    nbytes: int
    value: Any


@dataclasses.dataclass(frozen=True)
class StoreStats:
    """The store's counters: records and bytes held now, its capacity (bytes), records published
    (stored), held already when published (duplicates), evicted for room, dropped because a
    longer flat record holds their blocks (superseded), refused by an importer, lookups that hit
    and missed, bytes served (records handed out by hits)."""

    records: int
    bytes: int
    capacity_bytes: int
    published: int
    duplicates: int
    evictions: int
    superseded: int
    refused: int
    hits: int
    misses: int
    bytes_served: int


class _Entry(RecordFacts):
    """One record of the store: its id, its value (a Ray object ref in a one-item list, or the
    record itself in one process), its bytes and its facts (the host tier's rule serves it)."""

    __slots__ = ("id", "value", "nbytes")

    def __init__(self, entry_id: int, value: Any, namespace: int, block_size: int, keys: list[tuple[int, int]],
                 length: int, nbytes: int, flat: bool, state: bool) -> None:
        super().__init__(namespace, block_size, keys, length, flat, state)
        self.id = entry_id
        self.value = value
        self.nbytes = nbytes


class RecordStore:
    """The cluster store's index: records (Ray object refs, or the records themselves in one
    process) keyed by (namespace, block size, key of the last full block), every full block's key
    indexed, evicting whole records least recently used first when their bytes would pass
    ``capacity_bytes``. Run it as a Ray actor with ``start_store``; its methods are atomic there
    (one call at a time). It never reads a record's bytes: what publishers claim (keys, length,
    layer kinds) is a hint the importer checks (``fetch``).

    InvalidArgumentError: capacity_bytes not an int >= 0.
    """

    def __init__(self, capacity_bytes: int) -> None:
        self._capacity = positive(capacity_bytes, "RecordStore: capacity_bytes", 0)
        self._entries: OrderedDict[_Key, _Entry] = OrderedDict()  # least recently used first
        self._by_block: dict[_Key, set[_Key]] = {}
        self._by_id: dict[int, _Key] = {}
        self._bytes = 0
        self._next_id = 1
        self._lock = threading.Lock()  # a threaded actor or several driver threads: one call at a time
        self._counts = dict(published=0, duplicates=0, evictions=0, superseded=0, refused=0, hits=0, misses=0,
                            bytes_served=0)

    def publish(self, value: Any, namespace: int, block_size: int, keys: Sequence[tuple[int, int]], length: int,
                nbytes: int, flat: bool, state: bool) -> int:
        """Stores record `value` (a one-item list holding the record's Ray object ref, so Ray hands
        the actor the ref and not the bytes; or holding the record itself) of `nbytes` bytes whose full blocks have
        the chained keys `keys` in `namespace` and `block_size`, `length` positions; `flat`: it
        serves every full-block prefix; `state`: the model has State layers. Returns its entry id,
        0 when a held record serves it already (its recency moves). A flat record supersedes the
        held flat records it extends.

        InvalidArgumentError: a value out of its rule (namespace, block_size >= 1, keys as
        uint64 pairs, at least one, length >= len(keys) x block_size, nbytes >= 1, flags bools).
        CapacityError: nbytes > capacity_bytes. Nothing changes on an error."""
        ns = u64(namespace, "publish: namespace")
        block = positive(block_size, "publish: block_size")
        ks = key_pairs(keys, "publish: keys")
        if not ks:
            raise InvalidArgumentError("publish: keys is empty: a record keys at least one full block")
        length = positive(length, "publish: length")
        if length < len(ks) * block or length >= (len(ks) + 1) * block:
            raise InvalidArgumentError(f"publish: length = {length}: must hold exactly {len(ks)} full blocks of "
                                       f"{block}")
        nbytes = positive(nbytes, "publish: nbytes")
        if not isinstance(flat, bool) or not isinstance(state, bool):
            raise InvalidArgumentError(f"publish: flat = {flat!r}, state = {state!r}: must be bools")
        if not isinstance(value, list) or len(value) != 1:
            raise InvalidArgumentError(f"publish: value: must be a one-item list (the record's ref), not "
                                       f"{type(value).__name__}")
        if nbytes > self._capacity:
            raise CapacityError(f"publish: a record of {nbytes} bytes > the store's capacity_bytes {self._capacity}")
        with self._lock:
            key = (ns, block) + ks[-1]
            if key in self._entries:
                self._counts["duplicates"] += 1
                self._entries.move_to_end(key)
                return 0
            if flat:
                for k in self._by_block.get(key, ()):
                    if self._entries[k].flat:
                        self._counts["duplicates"] += 1
                        self._entries.move_to_end(k)
                        return 0
                for lo, hi in ks[:-1]:
                    shorter = self._entries.get((ns, block, lo, hi))
                    if shorter is not None and shorter.flat:
                        self._drop((ns, block, lo, hi))
                        self._counts["superseded"] += 1
            while self._bytes + nbytes > self._capacity:
                self._drop(next(iter(self._entries)))
                self._counts["evictions"] += 1
            entry = _Entry(self._next_id, value, ns, block, ks, length, nbytes, flat, state)
            self._next_id += 1
            self._entries[key] = entry
            self._by_id[entry.id] = key
            for lo, hi in ks:
                self._by_block.setdefault((ns, block, lo, hi), set()).add(key)
            self._bytes += nbytes
            self._counts["published"] += 1
            return entry.id

    def lookup(self, namespace: int, block_size: int, keys: Sequence[tuple[int, int]], above: int = 0,
               keep: bool = False) -> Optional[StoreHit]:
        """The longest prefix longer than `above` positions a record of `namespace` serves for a
        prompt whose full blocks have the chained keys `keys` (at most len(prompt) - 1 tokens'
        worth), the smallest such record then the most recently used; its recency moves. None on
        a miss. InvalidArgumentError: a bad namespace, block_size, keys or above."""
        ns = u64(namespace, "lookup: namespace")
        block = positive(block_size, "lookup: block_size")
        ks = key_pairs(keys, "lookup: keys")
        above = positive(above, "lookup: above", 0)
        with self._lock:
            found = self._find(ns, block, ks, above, bool(keep))
            if found is None:
                self._counts["misses"] += 1
                return None
            key, n = found
            entry = self._entries[key]
            self._entries.move_to_end(key)
            self._counts["hits"] += 1
            self._counts["bytes_served"] += entry.nbytes
            return StoreHit(entry.id, n * block, entry.nbytes, entry.value)

    def longest(self, namespace: int, block_size: int, keys: Sequence[tuple[int, int]], keep: bool = False) -> int:
        """What ``lookup`` would serve (positions), without side effects. Errors as lookup's."""
        ns = u64(namespace, "longest: namespace")
        block = positive(block_size, "longest: block_size")
        ks = key_pairs(keys, "longest: keys")
        with self._lock:
            found = self._find(ns, block, ks, 0, bool(keep))
        return 0 if found is None else found[1] * block

    def refuse(self, entry: int) -> bool:
        """Drops record `entry` (an id ``lookup`` gave) an importer refused, if still held; True
        if it was. InvalidArgumentError: entry not an int >= 1."""
        entry = positive(entry, "refuse: entry")
        with self._lock:
            key = self._by_id.get(entry)
            if key is None:
                return False
            self._drop(key)
            self._counts["refused"] += 1
            return True

    def entries(self) -> list[tuple[int, int, int, int]]:
        """(entry id, namespace, length, nbytes) of every held record, least recently used first."""
        with self._lock:
            return [(e.id, e.namespace, e.length, e.nbytes) for e in self._entries.values()]

    def stats(self) -> StoreStats:
        """The counters now (a StoreStats)."""
        with self._lock:
            return StoreStats(len(self._entries), self._bytes, self._capacity, **self._counts)

    def _find(self, ns: int, block: int, keys: list[tuple[int, int]], above: int,
              keep: bool) -> Optional[tuple[_Key, int]]:
        for i in range(len(keys) - 1, above // block - 1, -1):
            holders = self._by_block.get((ns, block) + keys[i])
            best: Optional[_Entry] = None
            best_key: Optional[_Key] = None
            for k in holders or ():
                e = self._entries[k]
                if e.namespace == ns and e.serves(i + 1, keep) and (best is None or e.nbytes < best.nbytes):
                    best, best_key = e, k
            if best_key is not None:
                return best_key, i + 1
        return None

    def _drop(self, key: _Key) -> None:
        entry = self._entries.pop(key)
        del self._by_id[entry.id]
        self._bytes -= entry.nbytes
        entry.value = None  # the ref goes: Ray frees the object once no importer borrows it
        for lo, hi in entry.keys:
            holders = self._by_block.get((entry.namespace, entry.block_size, lo, hi))
            if holders is not None:
                holders.discard(key)
                if not holders:
                    del self._by_block[(entry.namespace, entry.block_size, lo, hi)]


# --- a store in Ray, or in this process ---------------------------------------------------------

def start_store(capacity_bytes: int) -> Any:
    """Starts a ``RecordStore`` of `capacity_bytes` as a Ray actor (no CPU slot reserved) in the
    running Ray instance (``ray.init()`` first) and returns its handle. InvalidArgumentError: a
    bad capacity (checked here, before the actor starts)."""
    import ray

    positive(capacity_bytes, "start_store: capacity_bytes", 0)
    return ray.remote(num_cpus=0)(RecordStore).remote(capacity_bytes)


def is_local(store: Any) -> bool:
    """True when `store` is a RecordStore in this process (not a store actor's handle)."""
    return isinstance(store, RecordStore)


def store_call(store: Any, method: str, *args: Any) -> Any:
    """Calls `method` of a RecordStore in this process or of a store actor (waiting for it)."""
    if is_local(store):
        return getattr(store, method)(*args)
    import ray

    return ray.get(getattr(store, method).remote(*args))
