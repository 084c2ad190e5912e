"""A cluster-wide record store on Ray, serving replicas and a KV-aware router (issue 42 item 2).

Three tiers hold a prefix: a replica's **device** (its ``BatchCache`` + ``PagedKVPool``), its
**host** tier (``kvcore.tier.HostTier``) and the cluster's **store**. The store is Ray's object
store: a replica ``ray.put``-s a sequence's record (docs/state.md) once (the replica owns the
object: a record whose replica ended is lost, dropped at its next hit and missed), and the store
actor (``RecordStore``, run with ``start_store``) keeps the object refs in an index keyed like the host tier's, by (prefix namespace, block size, key of the record's last full
block), every full block's key indexed (``kvcore.block_keys(tokens, B, namespace)``). It evicts
whole records least recently used first when its bytes would pass its capacity; an evicted
record's ref is dropped and never served again.

Bytes from the store are another process's: ``fetch`` checks a record completely before it
enters the host tier (``RecordInfo.of``: truncated, corrupt, malformed, newer), compares its
token ids with the prompt's (a mismatched record is refused and dropped from the store), and the
host tier's ``restore`` imports it trusted **only in the prompt's namespace** (docs/state.md,
"Trust"). A prompt finds only records of its own namespace: the keys chain from the namespace and
the store checks the entry's namespace again.

``Replica`` is one serving replica (a Ray actor with ``start_replicas``, or a plain object in one
process): it restores the longest prefix a tier holds, computes the rest with the caller's
model, decodes greedily, then stores the sequence's record in its host tier and the store and
reports what its device and host tier hold (from the cache's KV events). ``Router`` sends each
request to the replica with the best score: ``local + store_weight x max(store - local, 0) -
alpha x running`` (tokens), where ``local`` is the prefix the replica's device or host tier holds
by its last report, ``store`` the store's and ``running`` the replica's requests in flight;
``"round_robin"`` and ``"least_loaded"`` are the baselines. ``Cluster`` runs requests through
them. docs/cluster.md says how to run it and what each tier promises.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import OrderedDict
from typing import Any, Callable, Optional, Sequence

import numpy as np
import numpy.typing as npt

from kvcore._core import KV_EVENT_CLEARED, KV_EVENT_STORED, BatchCache, block_keys
from kvcore._errors import CapacityError, InvalidArgumentError, InvalidStateError, NotSupportedError
from kvcore.state import RecordInfo, record_data
from kvcore.tier import HostTier, Namespace, RecordFacts, Tokens, namespace_id

__all__ = ["Cluster", "Fetched", "Replica", "Reply", "Request", "RecordStore", "Router", "StoreHit",
           "StoreStats", "fetch", "publish", "publish_record", "start_replicas", "start_store"]

_Key = tuple[int, int, int, int]  # (namespace, block size, key lo, key hi)
#: (namespace, key lo, key hi) of a full block, as a router counts a replica's.
BlockKey = tuple[int, int, int]
#: A model step: writes the step's rows through the pool and returns logits (n_tokens, vocab).
Forward = Callable[[list[int], Any, Any], npt.NDArray[Any]]
#: Builds a replica's (cache, pool, forward) in the replica's process.
Build = Callable[[], tuple[BatchCache, Any, Forward]]
POLICIES = ("kv", "round_robin", "least_loaded")


def _tokens(tokens: Tokens, what: str) -> npt.NDArray[np.int32]:
    """`tokens` as a 1-D int32 array (a copy). InvalidArgumentError names what is wrong."""
    if isinstance(tokens, (set, frozenset, dict, str, bytes)):
        raise InvalidArgumentError(f"{what}: tokens must be an ordered sequence of ints, not a {type(tokens).__name__}")
    try:
        arr = np.asarray(tokens) if len(tokens) else np.zeros(0, np.int64)
    except (TypeError, ValueError) as e:
        raise InvalidArgumentError(f"{what}: tokens must be a 1-D sequence of ints ({e})") from None
    if arr.ndim != 1 or arr.dtype.kind not in "iu":
        raise InvalidArgumentError(f"{what}: tokens must be a 1-D sequence of ints, not {arr.dtype} of shape {arr.shape}")
    if arr.size and (int(arr.min()) < -(1 << 31) or int(arr.max()) >= 1 << 31):
        raise InvalidArgumentError(f"{what}: a token id is beyond 32 bits")
    return np.ascontiguousarray(arr, dtype=np.int32).copy()


def _u64(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 0 <= int(value) < 1 << 64:
        raise InvalidArgumentError(f"{what} = {value!r}: must be an int in [0, 2**64)")
    return int(value)


def _positive(value: Any, what: str, least: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise InvalidArgumentError(f"{what} = {value!r}: must be an int >= {least}")
    return value


def _keys(keys: Any, what: str) -> list[tuple[int, int]]:
    try:
        pairs = [(lo, hi) for lo, hi in keys]
    except (TypeError, ValueError):
        raise InvalidArgumentError(f"{what}: must be a sequence of (lo, hi) pairs of uint64") from None
    return [(_u64(lo, f"{what} lo"), _u64(hi, f"{what} hi")) for lo, hi in pairs]


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
        self._capacity = _positive(capacity_bytes, "RecordStore: capacity_bytes", 0)
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
        ns = _u64(namespace, "publish: namespace")
        block = _positive(block_size, "publish: block_size")
        ks = _keys(keys, "publish: keys")
        if not ks:
            raise InvalidArgumentError("publish: keys is empty: a record keys at least one full block")
        length = _positive(length, "publish: length")
        if length < len(ks) * block or length >= (len(ks) + 1) * block:
            raise InvalidArgumentError(f"publish: length = {length}: must hold exactly {len(ks)} full blocks of "
                                       f"{block}")
        nbytes = _positive(nbytes, "publish: nbytes")
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
        ns = _u64(namespace, "lookup: namespace")
        block = _positive(block_size, "lookup: block_size")
        ks = _keys(keys, "lookup: keys")
        above = _positive(above, "lookup: above", 0)
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
        ns = _u64(namespace, "longest: namespace")
        block = _positive(block_size, "longest: block_size")
        ks = _keys(keys, "longest: keys")
        with self._lock:
            found = self._find(ns, block, ks, 0, bool(keep))
        return 0 if found is None else found[1] * block

    def refuse(self, entry: int) -> bool:
        """Drops record `entry` (an id ``lookup`` gave) an importer refused, if still held; True
        if it was. InvalidArgumentError: entry not an int >= 1."""
        entry = _positive(entry, "refuse: entry")
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

    _positive(capacity_bytes, "start_store: capacity_bytes", 0)
    return ray.remote(num_cpus=0)(RecordStore).remote(capacity_bytes)


def _is_local(store: Any) -> bool:
    return isinstance(store, RecordStore)


def _call(store: Any, method: str, *args: Any) -> Any:
    """Calls `method` of a RecordStore in this process or of a store actor (waiting for it)."""
    if _is_local(store):
        return getattr(store, method)(*args)
    import ray

    return ray.get(getattr(store, method).remote(*args))


def _record_facts(info: RecordInfo, block: int, what: str) -> tuple[int, bool, bool]:
    """(full blocks, flat, state) of a record that keys a prefix; InvalidStateError otherwise."""
    if info.start != 0 or info.holes:
        raise InvalidStateError(f"{what}: the record removed positions (start {info.start}, {len(info.holes)} "
                                "holes): it keys no prefix")
    if len(info.tokens) != info.length:
        raise InvalidStateError(f"{what}: the record carries {len(info.tokens)} token ids for length {info.length}: "
                                "it keys no prefix without every one")
    n_full = info.length // block
    if n_full == 0:
        raise InvalidStateError(f"{what}: the record's length {info.length} < block_size {block}: no full block "
                                "to key")
    kinds = [layer.kind for layer in info.layers]
    if "state" in kinds and info.length % block:
        raise InvalidStateError(f"{what}: length {info.length} is not a multiple of block_size {block} and the "
                                "model has State layers: it would serve no prefix")
    flat = all(k == "flat" or (k == "shared" and kinds[layer.param] == "flat") for k, layer in zip(kinds, info.layers))
    return n_full, flat, "state" in kinds


_KV_KINDS = ("flat", "ring", "chunked")


def _check_layout(info: RecordInfo, cache: BatchCache, pool: Any, entry: int) -> None:
    """InvalidArgumentError unless the record's layers are the cache's (count, kind, K/V heads and
    dims) and its K/V rows the pool's dtype (when `pool` is given and the rows are not quantized)."""
    where = f"fetch: the store's record {entry}"
    if len(info.layers) != cache.n_layers:
        raise InvalidArgumentError(f"{where} has {len(info.layers)} layers, this cache {cache.n_layers}: "
                                   "another model's (give each model its own namespace); refused")
    dtype = getattr(pool, "dtype", None)
    for i, layer in enumerate(info.layers):
        lc = cache.layer_config(i)
        kind = lc.policy.kind.name.lower()
        if layer.kind != kind:
            raise InvalidArgumentError(f"{where}: layer {i} is {layer.kind}, this cache's {kind}: another model's; "
                                       "refused")
        if kind in _KV_KINDS and (layer.n_kv_heads, layer.head_dim) != (lc.n_kv_heads, lc.head_dim):
            raise InvalidArgumentError(
                f"{where}: layer {i} has {layer.n_kv_heads} x {layer.head_dim} K rows, this cache's "
                f"{lc.n_kv_heads} x {lc.head_dim}: another model's; refused")
        if (kind in _KV_KINDS and layer.format is None and dtype is not None
                and np.dtype(layer.dtype) != np.dtype(dtype)):
            raise InvalidArgumentError(f"{where}: layer {i} holds {np.dtype(layer.dtype)} rows, this pool "
                                       f"{np.dtype(dtype)}: refused")


def publish_record(store: Any, record: Any, *, namespace: Namespace, block_size: int) -> int:
    """Stores `record` (bytes-like or a numpy uint8 array, as ``export_sequence`` /
    ``export_into`` give it) in `store` (a store actor's handle or a ``RecordStore``) as a prefix
    of `namespace` in blocks of `block_size`: checked as an import checks it, then ``ray.put``
    once and indexed by its blocks' keys. The object is owned by this process (Ray 2.56 removed
    ``ray.put``'s ``_owner``): when it ends, ``fetch`` finds the object lost, drops the entry and
    misses.
    Returns the store's entry id, 0 when the store serves that prefix already.

    InvalidArgumentError: truncated, corrupt or malformed (the import's errors), a bad namespace
    or block_size; NotSupportedError: a newer record version; InvalidStateError: token ids
    missing, positions removed, shorter than one block, a State layer off a block boundary;
    CapacityError: larger than the store. The store changes nothing on an error."""
    ns = namespace_id(namespace)
    block = _positive(block_size, "publish_record: block_size")
    data = np.frombuffer(memoryview(record_data(record)).cast("B"), dtype=np.uint8)
    info = RecordInfo.of(data)
    n_full, flat, state = _record_facts(info, block, "publish_record")
    keys = [(int(lo), int(hi)) for lo, hi in block_keys(np.asarray(info.tokens)[: n_full * block], block, ns)]
    if _is_local(store):
        value: list[Any] = [data.copy()]
    else:
        import ray

        value = [ray.put(data)]  # in a list: the actor keeps the ref, not the bytes
    result: int = _call(store, "publish", value, ns, block, keys, info.length, int(data.nbytes), flat, state)
    return result


def publish(store: Any, cache: BatchCache, pool: Any, seq: int, tokens: Tokens) -> int:
    """Exports active sequence `seq` of `cache` (byte layer `pool`) with every position's token
    id `tokens` and publishes the record in the sequence's namespace (``publish_record``). Call it
    between steps, before ``release_sequence``; the sequence is not changed. Returns the entry id
    (0: held already). InvalidArgumentError: seq out of range or tokens not one per position;
    InvalidStateError: seq not active; the rest as publish_record's."""
    if isinstance(seq, bool) or not isinstance(seq, int) or not 0 <= seq < cache.max_seqs:
        raise InvalidArgumentError(f"publish: seq = {seq!r}: must be an int in [0, {cache.max_seqs})")
    if not cache.sequence(seq).active:
        raise InvalidStateError(f"publish: sequence {seq} is not active")
    ids = _tokens(tokens, "publish")
    if len(ids) != cache.length(seq):
        raise InvalidArgumentError(f"publish: {len(ids)} tokens for sequence {seq} of length {cache.length(seq)}: "
                                   "give every position's id")
    record = pool.export_sequence(seq, ids)
    return publish_record(store, record, namespace=cache.prefix_namespace(seq), block_size=cache.block_size)


@dataclasses.dataclass(frozen=True)
class Fetched:
    """What ``fetch`` did: ``tokens`` (positions of the prompt the fetched record serves; 0: the
    store had nothing longer than the device and host tier), ``nbytes`` (record bytes moved from
    the store), ``seconds`` (wall time of the lookup, transfer and checks)."""

    tokens: int
    nbytes: int
    seconds: float


def fetch(store: Any, tier: HostTier, cache: BatchCache, tokens: Tokens, namespace: Namespace = None, *,
          keep: bool = False, pool: Any = None) -> Fetched:
    """Before admitting prompt `tokens` of `namespace`: when the store serves a longer prefix of
    it than the device (``lookup_prefix``) and the host tier (``tier.longest``), moves that record
    into `tier` (``HostTier.put``), so ``tier.restore(cache, pool, tokens, namespace, keep=keep)``
    then imports it. The record is checked completely first (``RecordInfo.of``) and its token ids
    compared with the prompt's over the served prefix; a record that fails is dropped from the
    store (``refuse``) and the error raised, the tier and cache unchanged. A record whose layers
    are not the cache's (count, kinds, K/V heads and dims; with `pool`, its dtype) is refused but
    kept in the store (another model's replica may read it: give each model its own namespace).

    InvalidArgumentError: bad tokens or namespace, a truncated, corrupt, malformed or mismatched
    record (dropped), a record of another layout (kept); NotSupportedError: a newer record version
    (dropped); InvalidStateError: a record that keys no prefix (dropped); CapacityError: a record
    larger than the tier."""
    start = time.perf_counter()
    ns = namespace_id(namespace)
    ids = _tokens(tokens, "fetch")
    block = cache.block_size
    usable = max(len(ids) - 1, 0) // block
    above = max(cache.lookup_prefix(ids, ns), tier.longest(ids, block, ns, keep=keep))
    if usable * block <= above:
        return Fetched(0, 0, time.perf_counter() - start)
    keys = [(int(lo), int(hi)) for lo, hi in block_keys(ids[: usable * block], block, ns)]
    hit: Optional[StoreHit] = _call(store, "lookup", ns, block, keys, above, keep)
    if hit is None:
        return Fetched(0, 0, time.perf_counter() - start)
    if _is_local(store):
        record = hit.value[0]
    else:
        import ray

        try:
            record = ray.get(hit.value[0])
        except ray.exceptions.ObjectLostError:  # its owner (the publisher's process) is gone
            _call(store, "refuse", hit.entry)
            return Fetched(0, 0, time.perf_counter() - start)
    try:
        info = RecordInfo.of(record)
        _record_facts(info, block, "fetch")
        held = np.asarray(info.tokens)
        if len(held) < hit.tokens or not np.array_equal(held[: hit.tokens], ids[: hit.tokens]):
            raise InvalidArgumentError(
                f"fetch: the store's record {hit.entry} does not carry the prompt's first {hit.tokens} token ids: "
                "refused, dropped from the store, nothing imported")
    except (InvalidArgumentError, NotSupportedError, InvalidStateError):
        _call(store, "refuse", hit.entry)
        raise
    _check_layout(info, cache, pool, hit.entry)
    tier.put(record, namespace=ns, block_size=block)
    return Fetched(hit.tokens, hit.nbytes, time.perf_counter() - start)


# --- replicas --------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Request:
    """One request: an id, its prompt's token ids, its prefix namespace (None: 0) and the tokens
    to generate after the prompt's first (greedy)."""

    rid: int
    tokens: tuple[int, ...]
    namespace: Namespace = None
    gen_len: int = 1


@dataclasses.dataclass(frozen=True)
class Reply:
    """A replica's answer: the generated tokens (gen_len + 1), the logits of the decode steps
    (gen_len x vocab), where the prompt's prefix came from (positions: ``device`` hit before any
    restore, ``host`` and ``store`` added by the restore, ``computed`` the rest), bytes moved from
    the store (``store_bytes``) and from the host tier into the device (``host_bytes``: records
    fetched from the store included, they pass through it), records from the store refused, and the
    replica's full-block keys after the request (device and host tier, for the router)."""

    rid: int
    replica: int
    tokens: list[int]
    logits: npt.NDArray[Any]
    device: int
    host: int
    store: int
    computed: int
    store_bytes: int
    host_bytes: int
    refused: int
    held: frozenset[BlockKey]


class Replica:
    """One serving replica: a ``BatchCache`` + byte pool built by `build` (in the replica's own
    process), a ``HostTier`` of `host_bytes` beneath it and the cluster `store` (a store actor's
    handle, a ``RecordStore``, or None). ``serve`` answers a Request; the device's cached keys
    are tracked from its KV events. One request at a time (a Ray actor's default).

    InvalidArgumentError: a bad index or host_bytes, or build not giving a BatchCache and its pool."""

    def __init__(self, index: int, build: Build, store: Any, host_bytes: int, events: int = 1 << 16) -> None:
        self.index = _positive(index, "Replica: index", 0)
        self.cache, self.pool, self.forward = build()
        if not isinstance(self.cache, BatchCache) or getattr(self.pool, "cache", None) is not self.cache:
            raise InvalidArgumentError("Replica: build must return (BatchCache, its pool, forward)")
        self.tier = HostTier(host_bytes)
        self.store = store
        self.cache.enable_kv_events(events)
        self._device: dict[BlockKey, set[int]] = {}  # key -> groups holding it
        self.refused = 0

    def serve(self, request: Request) -> Reply:
        """Restores the longest prefix of the prompt a tier holds (store, then host tier, into the
        device), adopts it, computes the rest and decodes ``gen_len`` tokens greedily; then stores
        the sequence's record in the host tier and the store and releases it. A record the store
        gives that fails the checks is refused (counted) and the prompt computed instead.
        InvalidArgumentError: a bad request; CapacityError: no room on the device."""
        c = self.cache
        ids = _tokens(list(request.tokens), "serve")
        ns = namespace_id(request.namespace)
        gen = _positive(request.gen_len, "serve: gen_len", 0)
        if len(ids) == 0 or len(ids) + gen > c.capacity:
            raise InvalidArgumentError(f"serve: {len(ids)} prompt + {gen} generated tokens: must be in [1, "
                                       f"capacity {c.capacity}]")
        device = c.lookup_prefix(ids, ns)
        fetched = Fetched(0, 0, 0.0)
        refused = 0
        if self.store is not None:
            try:
                fetched = fetch(self.store, self.tier, c, ids, ns, pool=self.pool)
            except (InvalidArgumentError, NotSupportedError, InvalidStateError):
                refused = 1
            except CapacityError:
                pass
        try:
            restored = self.tier.restore(c, self.pool, ids, ns)
            host_bytes = restored.bytes
        except CapacityError:  # no device room for the record: the device's own hit
            host_bytes = 0
        seq = next(s for s in range(c.max_seqs) if not c.sequence(s).active)
        c.add_sequence(seq, ns)
        hit = c.adopt_prefix(seq, ids)
        from_store = max(min(hit, fetched.tokens) - device, 0)
        from_host = max(hit - device - from_store, 0)
        try:
            logits = self._feed(seq, [int(t) for t in ids[hit:]])
            out = [int(np.argmax(logits[-1]))]
            steps = []
            for _ in range(gen):
                lg = self._feed(seq, [out[-1]])[-1]
                steps.append(lg)
                out.append(int(np.argmax(lg)))
            full = np.concatenate([ids, np.asarray(out[:gen], np.int32)])
            if c.length(seq) >= c.block_size:
                record = self.pool.export_sequence(seq, full)
                try:
                    self.tier.put(record, namespace=ns, block_size=c.block_size)
                    if self.store is not None:
                        publish_record(self.store, record, namespace=ns, block_size=c.block_size)
                except (InvalidStateError, CapacityError):
                    pass  # a State model off a block boundary, or a record larger than a tier: not stored
        finally:
            c.release_sequence(seq)
        self.refused += refused
        return Reply(request.rid, self.index, out, np.stack(steps) if steps else np.zeros((0, 0), np.float32),
                     device, from_host, from_store, len(ids) - hit, fetched.nbytes, host_bytes, refused, self.held())

    def held(self) -> frozenset[BlockKey]:
        """(namespace, key lo, key hi) of every full block the device caches (some group holds
        it, by the KV events drained now) or the host tier holds."""
        for e in self.cache.drain_kv_events():
            kind, key = int(e["kind"]), (int(e["namespace"]), int(e["key_lo"]), int(e["key_hi"]))
            if kind == KV_EVENT_CLEARED:
                self._device.clear()
            elif kind == KV_EVENT_STORED:
                self._device.setdefault(key, set()).add(int(e["group"]))
            else:
                groups = self._device.get(key)
                if groups is not None:
                    groups.discard(int(e["group"]))
                    if not groups:
                        del self._device[key]
        block = self.cache.block_size
        host = {(ns, lo, hi) for ns, b, lo, hi in self.tier.block_keys_held() if b == block}
        return frozenset(self._device.keys() | host)

    def _feed(self, seq: int, tokens: list[int]) -> npt.NDArray[Any]:
        chunk = self.cache.max_step
        out = []
        for i in range(0, len(tokens), chunk):
            part = tokens[i : i + chunk]
            with self.cache.step([(seq, len(part), part)]) as step:
                out.append(self.forward(part, step, self.pool))
        return np.concatenate(out)


def start_replicas(n: int, build: Build, store: Any, host_bytes: int) -> list[Any]:
    """Starts `n` ``Replica`` actors (no CPU slot reserved each) in the running Ray instance,
    each building its cache with `build`, over `store`. InvalidArgumentError: n < 1."""
    import ray

    _positive(n, "start_replicas: n")
    actor: Any = ray.remote(num_cpus=0)(Replica)
    return [actor.remote(i, build, store, host_bytes) for i in range(n)]


# --- routing ---------------------------------------------------------------------------------------

class Router:
    """Chooses a replica for each request. ``policy``: ``"kv"`` scores each replica ``local +
    store_weight x max(store - local, 0) - alpha x running`` (tokens; ``local`` the prompt's
    prefix the replica's reported keys hold, ``store`` the store's prefix, ``running`` the
    replica's requests in flight) and takes the highest, ties to fewer running, then fewer requests
    sent so far, then the lowest index; ``"round_robin"`` cycles; ``"least_loaded"`` takes the
    fewest running (ties as kv's).
    ``decisions`` counts requests sent to each replica, ``peak_running`` each one's most in flight.

    InvalidArgumentError: replicas or block_size < 1, an unknown policy, alpha or store_weight
    negative or not a number."""

    def __init__(self, replicas: int, block_size: int, *, policy: str = "kv", alpha: float = 16.0,
                 store_weight: float = 0.5) -> None:
        self.replicas = _positive(replicas, "Router: replicas")
        self.block_size = _positive(block_size, "Router: block_size")
        if policy not in POLICIES:
            raise InvalidArgumentError(f"Router: policy = {policy!r}: must be one of {', '.join(POLICIES)}")
        for name, value in (("alpha", alpha), ("store_weight", store_weight)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise InvalidArgumentError(f"Router: {name} = {value!r}: must be a number >= 0")
        self.policy, self.alpha, self.store_weight = policy, float(alpha), float(store_weight)
        self.running = [0] * replicas
        self.decisions = [0] * replicas
        self.peak_running = [0] * replicas
        self._held: list[frozenset[BlockKey]] = [frozenset()] * replicas
        self._next = 0

    def update(self, replica: int, held: frozenset[BlockKey]) -> None:
        """Replaces what `replica` is known to hold (a Reply's ``held``)."""
        self._held[self._index(replica)] = frozenset(held)

    def local(self, replica: int, tokens: Tokens, namespace: Namespace = None) -> int:
        """The prefix of `tokens` (positions, at most len - 1) whose full blocks `replica` reported."""
        held = self._held[self._index(replica)]
        ns = namespace_id(namespace)
        ids = _tokens(tokens, "Router.local")
        usable = max(len(ids) - 1, 0) // self.block_size
        n = 0
        for lo, hi in block_keys(ids[: usable * self.block_size], self.block_size, ns):
            if (ns, int(lo), int(hi)) not in held:
                break
            n += 1
        return n * self.block_size

    def choose(self, tokens: Tokens, namespace: Namespace = None, store: int = 0) -> int:
        """The replica for a prompt (`store`: the store's prefix of it, positions); counts the
        decision and one more running request there (``finished`` takes it back)."""
        if self.policy == "round_robin":
            r = self._next
            self._next = (self._next + 1) % self.replicas
        elif self.policy == "least_loaded":
            r = min(range(self.replicas), key=lambda i: (self.running[i], self.decisions[i], i))
        else:
            def score(i: int) -> tuple[float, int, int, int]:
                local = self.local(i, tokens, namespace)
                gain = local + self.store_weight * max(store - local, 0) - self.alpha * self.running[i]
                return (-gain, self.running[i], self.decisions[i], i)
            r = min(range(self.replicas), key=score)
        self.decisions[r] += 1
        self.running[r] += 1
        self.peak_running[r] = max(self.peak_running[r], self.running[r])
        return r

    def finished(self, replica: int) -> None:
        """One request of `replica` finished. InvalidStateError: it has none running."""
        r = self._index(replica)
        if self.running[r] == 0:
            raise InvalidStateError(f"Router.finished: replica {r} has no request running")
        self.running[r] -= 1

    def balance(self) -> float:
        """max / mean of the decisions per replica (1.0: even; 0.0 before any)."""
        total = sum(self.decisions)
        return 0.0 if total == 0 else max(self.decisions) * self.replicas / total

    def _index(self, replica: int) -> int:
        if isinstance(replica, bool) or not isinstance(replica, int) or not 0 <= replica < self.replicas:
            raise InvalidArgumentError(f"Router: replica = {replica!r}: must be an int in [0, {self.replicas})")
        return replica


class Cluster:
    """A store actor, `replicas` Replica actors and a Router in this (driver) process, on the
    running Ray instance. ``run`` serves a list of requests, at most `max_in_flight` at a time
    (routing each as it is sent, with the replicas' reports so far); ``shutdown`` ends the
    actors. InvalidArgumentError: a bad count or size, or the Router's."""

    def __init__(self, build: Build, replicas: int, *, block_size: int, store_bytes: int, host_bytes: int,
                 policy: str = "kv", alpha: float = 16.0, store_weight: float = 0.5, max_in_flight: int = 0) -> None:
        self.router = Router(replicas, block_size, policy=policy, alpha=alpha, store_weight=store_weight)
        self.max_in_flight = _positive(max_in_flight, "Cluster: max_in_flight", 0) or 2 * replicas
        _positive(host_bytes, "Cluster: host_bytes", 0)
        self.store = start_store(store_bytes)
        self.replicas = start_replicas(replicas, build, self.store, host_bytes)

    def run(self, requests: Sequence[Request]) -> list[Reply]:
        """Serves `requests` (each routed when it is sent); the replies in the requests' order.
        Raises what a replica raises."""
        import ray

        pending = list(requests)[::-1]
        flying: dict[Any, int] = {}
        replies: dict[int, Reply] = {}
        while pending or flying:
            while pending and len(flying) < self.max_in_flight:
                req = pending.pop()
                ids = _tokens(list(req.tokens), "Cluster.run")
                ns = namespace_id(req.namespace)
                usable = max(len(ids) - 1, 0) // self.router.block_size
                keys = [(int(lo), int(hi)) for lo, hi in
                        block_keys(ids[: usable * self.router.block_size], self.router.block_size, ns)]
                store = int(ray.get(self.store.longest.remote(ns, self.router.block_size, keys))) if keys else 0
                r = self.router.choose(ids, ns, store)
                flying[self.replicas[r].serve.remote(req)] = r
            done, _ = ray.wait(list(flying), num_returns=1)
            r = flying.pop(done[0])
            self.router.finished(r)
            reply: Reply = ray.get(done[0])
            self.router.update(r, reply.held)
            replies[reply.rid] = reply
        return [replies[req.rid] for req in requests]

    def store_stats(self) -> StoreStats:
        """The store's counters."""
        import ray

        stats: StoreStats = ray.get(self.store.stats.remote())
        return stats

    def shutdown(self) -> None:
        """Ends the replica and store actors (their objects go with the store)."""
        import ray

        for actor in [*self.replicas, self.store]:
            ray.kill(actor)
        self.replicas = []

