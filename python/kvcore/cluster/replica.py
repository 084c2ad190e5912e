"""One serving replica (``Replica``, a Ray actor with ``start_replicas``): its device, its host
tier and the cluster store, each request restored from the longest prefix a tier holds."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import numpy as np
import numpy.typing as npt

from kvcore._core import KV_EVENT_CLEARED, KV_EVENT_STORED, BatchCache
from kvcore._errors import CapacityError, InvalidArgumentError, InvalidStateError, NotSupportedError
from kvcore.cluster.checks import positive
from kvcore.cluster.transfer import Fetched, fetch, publish_record
from kvcore.tier import HostTier, Namespace, namespace_id, token_ids

#: (namespace, key lo, key hi) of a full block, as a router counts a replica's.
BlockKey = tuple[int, int, int]
#: A model step: writes the step's rows through the pool and returns logits (n_tokens, vocab).
Forward = Callable[[list[int], Any, Any], npt.NDArray[Any]]
#: Builds a replica's (cache, pool, forward) in the replica's process.
Build = Callable[[], tuple[BatchCache, Any, Forward]]


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
        self.index = positive(index, "Replica: index", 0)
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
        ids = token_ids(list(request.tokens), "serve")
        ns = namespace_id(request.namespace)
        gen = positive(request.gen_len, "serve: gen_len", 0)
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

    positive(n, "start_replicas: n")
    actor: Any = ray.remote(num_cpus=0)(Replica)
    return [actor.remote(i, build, store, host_bytes) for i in range(n)]
