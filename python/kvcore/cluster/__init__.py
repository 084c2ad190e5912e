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

One concept per module: ``kvcore.cluster.store`` (``RecordStore``, ``start_store``),
``kvcore.cluster.transfer`` (``publish_record``, ``publish``, ``fetch``: records into and out of
the store, checked), ``kvcore.cluster.replica`` (``Replica``, ``start_replicas``, ``Request``,
``Reply``), ``kvcore.cluster.router`` (``Router``, ``Cluster``) and ``kvcore.cluster.checks``
(the checks of values the others take); every public name is importable from ``kvcore.cluster``.
"""

from __future__ import annotations

from kvcore.cluster.replica import BlockKey, Build, Forward, Replica, Reply, Request, start_replicas
from kvcore.cluster.router import POLICIES, Cluster, Router
from kvcore.cluster.store import RecordStore, StoreHit, StoreStats, start_store
from kvcore.cluster.transfer import Fetched, fetch, publish, publish_record

__all__ = ["POLICIES", "BlockKey", "Build", "Cluster", "Fetched", "Forward", "RecordStore", "Replica", "Reply",
           "Request", "Router", "StoreHit", "StoreStats", "fetch", "publish", "publish_record", "start_replicas",
           "start_store"]
