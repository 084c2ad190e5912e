"""Records in and out of the cluster store: ``publish_record`` / ``publish`` check a record (or
export a sequence's) and put it in Ray's object store once; ``fetch`` checks a store record
completely before the host tier imports it (docs/state.md, "Trust")."""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Optional

import numpy as np

from kvcore._core import BatchCache, block_keys
from kvcore._errors import InvalidArgumentError, InvalidStateError, NotSupportedError
from kvcore.cluster.checks import positive
from kvcore.cluster.store import StoreHit, is_local, store_call
from kvcore.state import RecordInfo, record_data
from kvcore.tier import HostTier, Namespace, Tokens, namespace_id, token_ids


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
    block = positive(block_size, "publish_record: block_size")
    data = np.frombuffer(memoryview(record_data(record)).cast("B"), dtype=np.uint8)
    info = RecordInfo.of(data)
    n_full, flat, state = _record_facts(info, block, "publish_record")
    keys = [(int(lo), int(hi)) for lo, hi in block_keys(np.asarray(info.tokens)[: n_full * block], block, ns)]
    if is_local(store):
        value: list[Any] = [data.copy()]
    else:
        import ray

        value = [ray.put(data)]  # in a list: the actor keeps the ref, not the bytes
    result: int = store_call(store, "publish", value, ns, block, keys, info.length, int(data.nbytes), flat, state)
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
    ids = token_ids(tokens, "publish")
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
    the tier cannot hold (a flat record's first block, another model's whole record)."""
    start = time.perf_counter()
    ns = namespace_id(namespace)
    ids = token_ids(tokens, "fetch")
    block = cache.block_size
    usable = max(len(ids) - 1, 0) // block
    above = max(cache.lookup_prefix(ids, ns), tier.longest(ids, block, ns, keep=keep))
    if usable * block <= above:
        return Fetched(0, 0, time.perf_counter() - start)
    keys = [(int(lo), int(hi)) for lo, hi in block_keys(ids[: usable * block], block, ns)]
    hit: Optional[StoreHit] = store_call(store, "lookup", ns, block, keys, above, keep)
    if hit is None:
        return Fetched(0, 0, time.perf_counter() - start)
    if is_local(store):
        record = hit.value[0]
    else:
        import ray

        try:
            record = ray.get(hit.value[0])
        except ray.exceptions.ObjectLostError:  # its owner (the publisher's process) is gone
            store_call(store, "refuse", hit.entry)
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
        store_call(store, "refuse", hit.entry)
        raise
    _check_layout(info, cache, pool, hit.entry)
    tier.put(record, namespace=ns, block_size=block)
    return Fetched(hit.tokens, hit.nbytes, time.perf_counter() - start)
