"""Replays a Mooncake-format trace through one kvcore replica with a host tier beneath its
device budget (issue 42 items 1 and 3, single replica): how much of the ideal's prompt reuse
the device alone gets, and how much kvcore's real `kvcore.tier.HostTier` adds at host
capacities of several multiples of the device budget.

Everything but the tier is bench/trace_replay.py's: the trace and its token ids, the scheduler,
the models, the budgets (a multiple of the peak working set of an infinite-cache run), the ideal
(`trace_ideal`, and `ideal_online`: what an infinite cache holds at each admission) and its
checks (a hit is a multiple of the block size, never above ideal_online nor, at a first
admission, the trace ideal; lookup_prefix before admission equals adopt_prefix's hit; the KV
events drained after every step are consistent with what the replay filled).

**The device** is the replay's BatchCache (one pool, `lookup_prefix`, KV events) with the layout
the budget gives the real model (the same num_blocks, block size, max_active_seqs, table rows),
and a real byte pool beneath it (`PagedKVPool`, float32) of the smallest honest shape: one layer
per block group (the Llama-like model has one group), 1 KV head of TINY_DIM. The tier stores
real rows (blocks cut from records), so they must exist; the shape does not change reuse: every decision of the cache
(hits, LRU eviction, refusals, preemption) depends on block counts, block size, table rows and
token ids, never on heads, dims or layers, and the tier's only byte-dependent decision (its LRU
by bytes) is given a capacity scaled by the ratio of the tiny record's bytes per token to the
real model's (`HostModel`: a held block's bytes per token, K/V rows and the token id, are a
record's; the record tier's fixed header per record, about 2 tokens' worth, is its only error). Every step writes each token's rows with its id and position encoded
(K = V = [id mod 2**16, id div 2**16, position, 0, ...]); every hit is checked **on the bytes**:
the rows the adopting sequence's table names hold the request's token ids at their positions
(restored blocks included: every restored prefix's tokens equal the request's), and every hit
block's key was stored by a KV event (an import's events are drained and checked after each
restore: a restored block within the hit has the request's key).

**The tier** (host capacity X times the device budget, several X in one run; X = 0: the device
alone): kvcore.tier.HostTier, per block for this flat model (`--protected`: its segmented LRU's
protected fraction, 0 a plain LRU; several in one run), and with `--baseline FILE` also an
earlier HostTier loaded from a file (the record tier of 5d81626), side by side. The replay spills a sequence when it releases it (finished, preempted or refused;
`HostTier.spill` before `release_sequence`, as docs/tier.md says); before admitting a request it
calls `HostTier.restore(cache, pool, prompt)`, which imports the tier's longest prefix of the
prompt (the record tier: the whole record serving it) when that is longer than the device's
`lookup_prefix` hit (into a free sequence id,
released at once: the blocks wait cached and `adopt_prefix` hits them). A restore the device has
no room for (`CapacityError`: the record needs more blocks than are free or evictable) falls back
to the device's hit and is counted.

Reported per host size: prompt tokens reused at first admission, split into the device's hit
and what the restore added (host), against the ideal and the device alone; the tier's bytes
(real-model equivalent), records, hits, misses, evictions, spills; bytes moved by restores
(the record imported: real-model equivalent) per reused token; CPU (thread time) per
request in kvcore's calls (as trace_replay counts them) and in the tier's calls (spill and
restore, which includes its own lookup_prefix and the import), median and total; the byte
layer's row writes apart (they stand for the model's forward); a **modelled** restore time
(bytes moved / `--bandwidth` GB/s, host to device: the record imported, and only its positions
past the device's hit, which are all the import writes) and the prefill tokens saved net of it at
the scheduler's own throughput (token_budget tokens per step_ms: 81,920 tokens/s by default).

    python3 bench/tier_replay.py --quick                              # first 300 requests
    python3 bench/tier_replay.py --host-tier 0,1,2,4,8 --blocks 16,512 --out bench/results/tier_replay.json
    python3 bench/tier_replay.py --generate 600 --seed 1 --out bench/results/tier_replay_generated.json
    python3 bench/tier_replay.py --unit-model --no-replay --out bench/results/tier_unit_model.json  # blocks vs records
    python3 bench/tier_replay.py --baseline /tmp/tier_records.py ...  # and the record tier (git show 5d81626:python/kvcore/tier.py)
    python3 bench/tier_replay.py --costs                              # HostTier's spill and restore on one model
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import statistics
import sys
import time
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from replay.kvcore_adapter import KvcoreAdapter  # noqa: E402
from replay.layouts import budgets_for, capacity_of, kvcore_layout, kvcore_one_pool  # noqa: E402
from replay.models import Model, make_model  # noqa: E402
from replay.outcomes import summarize  # noqa: E402
from replay.scheduler import Live, SchedulerConfig, replay  # noqa: E402
from replay.trace import (DEFAULT_TRACE, TraceRequest, block_fingerprints, generate_trace, load_trace,
                          prompt_tokens, trace_ideal)  # noqa: E402

TINY_DIM = 8  # one KV head of 8 float32: K and V rows of 64 bytes a token
ID_BYTES = 4  # a record carries every position's int32 token id


@dataclasses.dataclass(frozen=True)
class HostModel:
    """Record bytes of the tiny pool against the real model's: a record of L tokens takes
    header + L * per_token bytes (measured once on the tiny shape); the real model's record
    takes L * (K/V bytes of a token + 4) (its header, under a KiB, is left out)."""

    header: int
    per_token: int
    real_per_token: int

    def tiny_capacity(self, real_bytes: float) -> int:
        """The tiny tier capacity that holds the tokens `real_bytes` of real records hold."""
        return int(real_bytes * self.per_token / self.real_per_token)

    def tokens(self, tiny_bytes: int, records: int = 1) -> int:
        """Tokens in `records` tiny records of `tiny_bytes` in all."""
        return max(tiny_bytes - records * self.header, 0) // self.per_token

    def real(self, tiny_bytes: int, records: int = 1) -> int:
        """The real model's bytes for the tokens of those records."""
        return self.tokens(tiny_bytes, records) * self.real_per_token


def measure_host_model(model: Model) -> HostModel:
    """Exports two records of the tiny shape to find its header and bytes per token."""
    import kvcore

    sizes = []
    for n in (64, 1088):
        limits = kvcore.BatchLimits(block_size=16, max_seqs=1, max_active_seqs=1, num_blocks=80,
                                    max_step_tokens=2048, page_layers=1)
        cache = kvcore.BatchCache(kvcore.CacheConfig(2048, [kvcore.LayerConfig(kvcore.Flat(), 1, TINY_DIM)],
                                                     max_step=2048, batch=limits))
        pool = kvcore.PagedKVPool(cache, np.float32)
        toks = np.arange(1, n + 1, dtype=np.int32)
        cache.add_sequence(0)
        step = cache.begin_step(np.zeros(1, np.int32), np.array([n], np.int32), toks)
        rows = np.zeros((n, 1, TINY_DIM), np.float32)
        pool.update(0, step, rows, rows)
        cache.commit(step)
        sizes.append(len(pool.export_sequence(0, toks)))
    per_token = (sizes[1] - sizes[0]) // 1024
    return HostModel(sizes[0] - 64 * per_token, per_token, model.bytes_per_token("full") + ID_BYTES)


def encode_rows(tokens: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """K (= V) rows of the tiny pool: [id mod 2**16, id div 2**16, position, 0...] (exact in float32)."""
    rows = np.zeros((len(tokens), 1, TINY_DIM), np.float32)
    t = tokens.astype(np.int64)
    rows[:, 0, 0] = t & 0xFFFF
    rows[:, 0, 1] = t >> 16
    rows[:, 0, 2] = positions
    return rows


class TierAdapter(KvcoreAdapter):
    """trace_replay's kvcore adapter on a tiny real byte pool, with a HostTier beneath it
    (host_bytes None: the device alone). Flat (Llama-like) models only: a ring's record serves
    only its last full block and a State model's only with keep=True (docs/tier.md)."""

    def __init__(self, model: Model, block: int, layout: dict[str, Any], cfg: SchedulerConfig,
                 capacity: int, check: bool, host_bytes: float | None, host_model: HostModel,
                 spill_at: str = "sequence", tier_class: Any = None):
        if any(lay.kind != "full" for lay in model.layers):
            raise ValueError(f"tier replay: model {model.name!r} has non-full-attention layers; "
                             "only flat models are replayed (a ring or State record serves one length)")
        super().__init__(model, block, layout, cfg, capacity, check)
        if tier_class is None:
            from kvcore.tier import HostTier as tier_class

        kv: Any = self.kv
        self.pool = kv.PagedKVPool(self.cache, np.float32)
        if spill_at not in ("sequence", "prompt"):
            raise ValueError(f"spill_at {spill_at!r}: expected 'sequence' or 'prompt'")
        self.spill_at = spill_at
        self.hm = host_model
        self.host_bytes = host_bytes
        self.tier = None if host_bytes is None else tier_class(host_model.tiny_capacity(host_bytes))
        self.capacity_error: type[Exception] = kv.CapacityError
        self.pool_ns = 0  # the byte layer's row writes (the model's forward stands there)
        self.pending: dict[int, tuple[int, int]] = {}  # request -> (device hit, hit) of its restores
        self.host_hit: dict[int, int] = {}  # request -> tokens the restore added at its first admission
        self.stats = {"restores": 0, "restore_refused_no_room": 0, "restored_tokens_imported": 0,
                      "restore_bytes_tiny": 0, "restore_bytes_real": 0, "restore_beyond_device_real": 0,
                      "restored_hits_checked": 0, "spills": 0, "spills_held_already": 0,
                      "spills_too_large": 0, "spilled_bytes_tiny": 0, "peak_host_bytes_tiny": 0,
                      "peak_host_records": 0, "restore_events_stored": 0, "restore_events_evicted": 0}
        self.restore_times: list[float] = []

    def _make_cache(self, model: Model, block: int, layout: dict[str, Any], cfg: SchedulerConfig,
                    capacity: int) -> tuple[Any, list[int]]:
        """One Flat layer of 1 x TINY_DIM per group (the model's one group), the layout's blocks."""
        kvcore = self.kv
        extra = {"page_layers": 1} if "page_layers" in layout else {}
        limits = kvcore.BatchLimits(**extra, block_size=block, max_seqs=self.max_active,
                                    max_active_seqs=self.max_active, max_step_tokens=cfg.token_budget,
                                    num_blocks=layout["num_blocks_flat"], state_snapshots=0,
                                    max_rewind=cfg.max_rewind)
        cache = kvcore.BatchCache(kvcore.CacheConfig(
            capacity, [kvcore.LayerConfig(kvcore.Flat(), 1, TINY_DIM)], max_step=cfg.chunk, batch=limits))
        return cache, [block * model.bytes_per_token("full")]

    # --- the device's step: the tiny pool's rows are written between begin_step and commit ----

    def end_step(self, entries: list[tuple[Live, int]]) -> None:
        """begin_step, the pool's row writes (timed apart), commit and the KV events."""
        seqs = np.fromiter((lv.handle for lv, _ in entries), dtype=np.int32, count=len(entries))
        ts = np.fromiter((n for _, n in entries), dtype=np.int32, count=len(entries))
        toks = np.concatenate([lv.tokens[lv.computed: lv.computed + n] for lv, n in entries])
        pos = np.concatenate([np.arange(lv.computed, lv.computed + n) for lv, n in entries])
        rows = encode_rows(toks, pos)
        t0 = time.thread_time_ns()
        step = self.cache.begin_step(seqs, ts, toks)
        t1 = time.thread_time_ns()
        self.pool.update(0, step, rows, rows)
        t2 = time.thread_time_ns()
        self.cache.commit(step)
        events = self.ext.drain_kv_events()
        t3 = time.thread_time_ns()
        self.pool_ns += t2 - t1
        share = (t1 - t0 + t3 - t2) // len(entries)
        if self.check:
            self._check_events(entries, events)
        for lv, _ in entries:
            lv.cpu_ns += share

    def _check_hit(self, lv: Live, seq: int, hit: int) -> None:
        """The hit's rows, read from the pool through seq's table, hold the request's token ids at
        their positions; every hit block's key is stored (KV events)."""
        b = self.block_size
        nb = hit // b
        table = np.asarray(self.cache.block_table(seq, 0))[:nb].astype(np.int64)
        if (table < 0).any():
            raise AssertionError(f"request {lv.req.index}: hit of {hit} tokens with an unmapped block")
        k, _ = self.pool.rows(0)
        got = np.asarray(k)[(table[:, None] * b + np.arange(b)).ravel(), 0, :3]
        want = lv.tokens[:hit].astype(np.int64)
        ok = (got[:, 0] == (want & 0xFFFF)) & (got[:, 1] == (want >> 16)) & (got[:, 2] == np.arange(hit))
        if not ok.all():
            p = int(np.argmin(ok))
            raise AssertionError(f"request {lv.req.index}: block {int(table[p // b])} (block index {p // b}) "
                                 f"does not hold the request's tokens (position {p})")
        for i in range(nb):
            if self._key(lv, i) not in self.stored[0]:
                raise AssertionError(f"request {lv.req.index}: hit block index {i} has no stored KV event")
        if lv.req.index in self.pending:
            self.stats["restored_hits_checked"] += 1

    # --- the tier -----------------------------------------------------------------------------

    def lookup(self, lv: Live) -> int:
        """HostTier.restore (its own lookup_prefix, then the import when the tier's prefix is
        longer), timed as the tier's; the device's lookup_prefix without a tier."""
        if self.tier is None:
            return super().lookup(lv)
        toks = lv.tokens[: lv.known]
        seq = self.free_ids[-1] if self.free_ids else None
        t0 = time.thread_time_ns()
        try:
            r = self.tier.restore(self.cache, self.pool, toks, seq=seq)
        except self.capacity_error:
            r = None
        lv.aux_ns += time.thread_time_ns() - t0
        if r is None:
            self.stats["restore_refused_no_room"] += 1
            return super().lookup(lv)
        if r.bytes:
            self._restored(lv, r)
        return int(r.hit)

    def _restored(self, lv: Live, r: Any) -> None:
        st = self.stats
        st["restores"] += 1
        st["restore_bytes_tiny"] += r.bytes
        n = self.hm.tokens(r.bytes)
        st["restored_tokens_imported"] += n
        st["restore_bytes_real"] += n * self.hm.real_per_token
        st["restore_beyond_device_real"] += max(n - r.device_hit, 0) * self.hm.real_per_token
        self.restore_times.append(n * self.hm.real_per_token)
        old = self.pending.get(lv.req.index)
        self.pending[lv.req.index] = (r.device_hit, r.hit) if old is None else (min(old[0], r.device_hit),
                                                                              max(old[1], r.hit))
        if self.check:  # the import's KV events: consistent with the mirror, the hit's keys the request's
            kv: Any = self.kv
            b = self.block_size
            for e in self.ext.drain_kv_events():
                kind, key = int(e["kind"]), (int(e["key_lo"]), int(e["key_hi"]))
                if kind == kv.KV_EVENT_STORED:
                    st["restore_events_stored"] += 1
                    if key in self.stored[0]:
                        raise AssertionError(f"restore for request {lv.req.index}: key {key} stored twice")
                    if int(e["end"]) <= r.hit and key != self._key(lv, int(e["start"]) // b):
                        raise AssertionError(f"restore for request {lv.req.index}: block at {int(e['start'])} "
                                             "has another key than the request's")
                    self.stored[0].add(key)
                elif kind == kv.KV_EVENT_EVICTED:
                    st["restore_events_evicted"] += 1
                    if key not in self.stored[0]:
                        raise AssertionError(f"restore: evicted key {key}, never stored")
                    self.stored[0].discard(key)
                else:
                    raise AssertionError(f"restore: KV event of kind {kind}")

    def admit(self, lv: Live, hit: int, n: int) -> bool:
        """The replay's admission; at a first admission, what the restores added to the hit."""
        ok = super().admit(lv, hit, n)
        if ok:
            p = self.pending.pop(lv.req.index, None)
            if lv.admissions == 0:
                self.host_hit[lv.req.index] = max(0, min(hit, p[1]) - p[0]) if p else 0
        return ok

    def free(self, lv: Live, preempted: bool) -> None:
        """HostTier.spill before release_sequence (finished, preempted or refused)."""
        if self.tier is not None and lv.handle is not None:
            seq = lv.handle
            length = self.cache.length(seq)
            t0 = time.thread_time_ns()
            if self.spill_at == "prompt" and not preempted and length > lv.req.input_length:
                # The sampled tokens never start a later prompt (trace_replay's token ids): keep
                # the prompt only (a flat layer rewinds anywhere; the sequence is released next).
                self.cache.rewind(seq, lv.req.input_length)
                length = lv.req.input_length
            if length >= self.block_size:
                try:
                    got = self.tier.spill(self.cache, self.pool, seq, lv.tokens[:length])
                except self.capacity_error:
                    got = -1
                lv.aux_ns += time.thread_time_ns() - t0
                st = self.stats
                if got < 0:
                    st["spills_too_large"] += 1
                elif got == 0:
                    st["spills_held_already"] += 1
                else:
                    st["spills"] += 1
                    st["spilled_bytes_tiny"] += got
                if self.tier.bytes > st["peak_host_bytes_tiny"]:
                    st["peak_host_bytes_tiny"] = self.tier.bytes
                    st["peak_host_records"] = records_of(self.tier)
        super().free(lv, preempted)


def records_of(tier: Any) -> int:
    """Records a tier holds (each with its header); a per-block tier's blocks carry none."""
    return int(tier.records) if hasattr(tier, "blocks") else len(tier)


def load_baseline(path: str) -> Any:
    """The HostTier class of an earlier kvcore.tier, from a file (e.g. `git show
    5d81626:python/kvcore/tier.py > /tmp/tier_records.py`): the record-per-sequence tier."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("tier_baseline", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"--baseline {path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules["tier_baseline"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module.HostTier


def run_tier(trace: Sequence[TraceRequest], model: Model, block: int, budget: int,
             cfg: SchedulerConfig, capacity: int, host_x: float, ideal_trace: Sequence[int], *,
             host_model: HostModel | None = None, check: bool = True, exact: bool = False,
             bandwidth_gbs: float = 25.0, spill_at: str = "sequence", tier_class: Any = None) -> dict[str, Any]:
    """One replay at device `budget` bytes with a host tier of host_x * budget bytes (0: none):
    kvcore.tier.HostTier, or `tier_class` (an earlier HostTier: load_baseline)."""
    hm = host_model or measure_host_model(model)
    one_pool = kvcore_one_pool()
    layout = kvcore_layout(model, block, budget, cfg, capacity, one_pool=one_pool)
    adapter = TierAdapter(model, block, layout, cfg, capacity, check, host_x * budget if host_x else None, hm,
                          spill_at, tier_class)
    t = time.perf_counter()
    res = replay(trace, adapter, cfg, model, check=check, exact=exact, ideal_trace=ideal_trace,
                 capacity=capacity)
    wall = time.perf_counter() - t
    base = summarize("kvcore", res, trace, wall)
    prompt = sum(r.input_length for r in trace)
    served = [i for i in range(len(trace)) if i not in set(res.refused)]
    host_hits = [adapter.host_hit.get(i, 0) for i in range(len(trace))]
    host = sum(host_hits)
    reused = sum(res.hits_first)
    ideal = sum(ideal_trace)
    online = sum(res.ideal_online)
    tier_us = [res.aux_us[i] for i in served] or [0.0]
    st = adapter.stats
    rate = cfg.token_budget / (cfg.step_ms / 1000.0)  # the scheduler's prefill throughput, tokens/s
    restore_s = st["restore_bytes_real"] / (bandwidth_gbs * 1e9)
    tier = adapter.tier
    out = {
        "host_x": host_x, "spill_at": spill_at, "host_bytes": int(host_x * budget), "host_capacity_tiny": tier.capacity_bytes if tier else 0,
        "reused_tokens": reused, "device_tokens": reused - host, "host_tokens": host,
        "reused_pct": 100.0 * reused / prompt, "device_pct": 100.0 * (reused - host) / prompt,
        "host_pct": 100.0 * host / prompt,
        "ideal_trace_tokens": ideal, "ideal_online_tokens": online,
        "of_ideal_pct": 100.0 * reused / ideal if ideal else 0.0,
        "of_online_ideal_pct": 100.0 * reused / online if online else 0.0,
        "refused": base["refused"], "preempted": base["preempted"], "steps": base["steps"],
        "peak_device_bytes": base["peak_bytes"],
        "kv_cpu_us_median": base["cpu_us_median"], "kv_cpu_us_total": base["cpu_us_total"],
        "tier_cpu_us_median": statistics.median(tier_us), "tier_cpu_us_total": sum(tier_us),
        "pool_write_cpu_s": adapter.pool_ns / 1e9,
        "host_records_end": records_of(tier) if tier else 0,
        "host_blocks_end": int(getattr(tier, "blocks", 0)) if tier else 0,
        "host_bytes_end_real": hm.real(tier.bytes, records_of(tier)) if tier else 0,
        "host_bytes_peak_real": hm.real(st["peak_host_bytes_tiny"], st["peak_host_records"]) if tier else 0,
        "host_hits": tier.hits if tier else 0, "host_misses": tier.misses if tier else 0,
        "host_evictions": tier.evictions if tier else 0,
        "host_superseded": getattr(tier, "superseded", 0) if tier else 0,  # the record tier's
        **st,
        "bytes_moved_per_reused_token": st["restore_bytes_real"] / reused if reused else 0.0,
        "bytes_moved_per_host_token": st["restore_bytes_real"] / host if host else 0.0,
        "model_bandwidth_gbs": bandwidth_gbs, "model_prefill_tokens_per_s": rate,
        "modelled_restore_s": restore_s, "prefill_s_saved_by_host": host / rate,
        "net_prefill_tokens_saved_by_host": host - restore_s * rate,
        # The import shares the blocks the device caches already: only the record's positions past
        # the device's hit are written (its blocks past the prompt's hit too).
        "modelled_restore_written_s": st["restore_beyond_device_real"] / (bandwidth_gbs * 1e9),
        "net_prefill_tokens_saved_written": host - st["restore_beyond_device_real"] / (bandwidth_gbs * 1e9) * rate,
        "wall_s": wall, "hits": res.hits_first, "host_hits_per_request": host_hits,
        "ideal_online": res.ideal_online,
    }
    return out


def unit_model(trace: Sequence[TraceRequest], block: int, capacities: Sequence[int]) -> list[dict[str, Any]]:
    """A model, not HostTier: what the storage unit costs at equal bytes. Requests in arrival
    order, one at a time (no concurrency, no device/host split); a store of `capacity` blocks
    either keeps **blocks** (LRU per block, a prompt's blocks touched when it is served) or
    **records** as HostTier keeps a flat model's (a prompt's full blocks as one record, LRU
    over records by blocks; a prefix held once: a record inside a held one is not stored and
    supersedes held ones it extends). Returns per capacity the prompt tokens each reuses."""
    prints = [block_fingerprints(prompt_tokens(r), block, r.input_length // block) for r in trace]
    caps = [(r.input_length - 1) // block for r in trace]
    out = []
    for capacity in capacities:
        blocks: OrderedDict[int, None] = OrderedDict()
        records: OrderedDict[int, list[int]] = OrderedDict()
        holders: dict[int, set[int]] = {}
        used = 0
        got_b = got_r = 0
        for i, fps in enumerate(prints):
            n = 0
            while n < caps[i] and fps[n] in blocks:
                n += 1
            got_b += n * block
            for f in fps:
                blocks[f] = None
                blocks.move_to_end(f)
            while len(blocks) > capacity:
                blocks.popitem(last=False)
            n = 0
            while n < caps[i] and holders.get(fps[n]):
                n += 1
            got_r += n * block
            if n:
                records.move_to_end(min(holders[fps[n - 1]], key=lambda k: len(records[k])))
            if not fps or len(fps) > capacity:
                continue
            if holders.get(fps[-1]):
                records.move_to_end(next(iter(holders[fps[-1]])))
                continue
            for f in fps[:-1]:  # held records this one extends: superseded
                for k in [k for k in holders.get(f, ()) if records[k][-1] == f]:
                    used -= len(records[k])
                    for g in records.pop(k):
                        holders[g].discard(k)
            records[i] = fps
            used += len(fps)
            for f in fps:
                holders.setdefault(f, set()).add(i)
            while used > capacity:
                k, old = records.popitem(last=False)
                used -= len(old)
                for g in old:
                    holders[g].discard(k)
        out.append({"capacity_blocks": capacity, "blocks_reused_tokens": got_b, "records_reused_tokens": got_r})
    return out


def measure_costs(repeats: int = 9) -> dict[str, Any]:
    """HostTier's own costs on one flat model of 8 layers, 8 KV heads x 64, float16, 512 tokens,
    block size 16: bytes held and the record's, and the median wall time of spill (into an empty
    tier), restore (into a cleared device: assembly, import, release) and the import alone."""
    import kvcore
    from kvcore.tier import HostTier

    n, b = 512, 16
    cfg = kvcore.CacheConfig(1024, [kvcore.LayerConfig(kvcore.Flat(), 8, 64) for _ in range(8)], max_step=n,
                             batch=kvcore.BatchLimits(block_size=b, max_seqs=2, num_blocks=128))
    src = kvcore.BatchCache(cfg)
    pool = kvcore.PagedKVPool(src, np.float16)
    toks = np.arange(1, n + 1, dtype=np.int32)
    src.add_sequence(0)
    step = src.begin_step(np.zeros(1, np.int32), np.array([n], np.int32), toks)
    rows = np.random.default_rng(0).standard_normal((n, 8, 64)).astype(np.float16)
    for layer in range(8):
        pool.update(layer, step, rows, rows)
    src.commit(step)
    record = np.frombuffer(pool.export_sequence(0, toks), np.uint8).copy()
    dst = kvcore.BatchCache(cfg)
    dst_pool = kvcore.PagedKVPool(dst, np.float16)
    prompt = np.append(toks, 7).astype(np.int32)
    times: dict[str, list[float]] = {"spill_ms": [], "restore_ms": [], "import_and_release_ms": []}
    tier = HostTier(1 << 30)
    for _ in range(repeats):
        tier = HostTier(1 << 30)
        t0 = time.perf_counter()
        tier.spill(src, pool, 0, toks)
        times["spill_ms"].append(time.perf_counter() - t0)
        dst.clear()
        t0 = time.perf_counter()
        if tier.restore(dst, dst_pool, prompt).hit != n:
            raise AssertionError("costs: the restore missed")
        times["restore_ms"].append(time.perf_counter() - t0)
        dst.clear()
        t0 = time.perf_counter()
        dst_pool.import_sequence(1, record, namespace=0)
        dst.release_sequence(1)
        times["import_and_release_ms"].append(time.perf_counter() - t0)
    out: dict[str, Any] = {k: 1e3 * statistics.median(v) for k, v in times.items()}
    out.update(record_bytes=len(record), tier_bytes=tier.bytes, repeats=repeats)
    return out


def print_rows(rows: list[dict[str, Any]]) -> None:
    """One line per host size."""
    head = (f"{'B':>4} {'tier':>7} {'host':>5} | {'dev%':>6} {'host%':>6} {'total%':>6} {'ideal%':>6} {'of ideal':>8} | "
            f"{'held GiB':>8} {'hits':>5} {'miss':>5} {'evict':>5} {'noroom':>6} | {'B/tok':>8} {'restore s':>9} "
            f"{'net Mtok':>8} | {'kv us':>6} {'tier us':>7} {'kv s':>5} {'tier s':>6}")
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['block']:>4} {r['tier']:>7} {r['host_x']:>4g}x | {r['device_pct']:>6.2f} {r['host_pct']:>6.2f} {r['reused_pct']:>6.2f} "
              f"{r['ideal_pct']:>6.2f} {r['of_ideal_pct']:>7.1f}% | {r['host_bytes_peak_real'] / 2**30:>8.1f} "
              f"{r['host_hits']:>5} {r['host_misses']:>5} {r['host_evictions']:>5} {r['restore_refused_no_room']:>6} | "
              f"{r['bytes_moved_per_reused_token']:>8.0f} {r['modelled_restore_s']:>9.2f} "
              f"{r['net_prefill_tokens_saved_by_host'] / 1e6:>8.2f} | {r['kv_cpu_us_median']:>6.0f} "
              f"{r['tier_cpu_us_median']:>7.0f} {r['kv_cpu_us_total'] / 1e6:>5.1f} {r['tier_cpu_us_total'] / 1e6:>6.1f}")


def main(argv: Sequence[str] | None = None) -> int:
    """Command line (module docstring). Exit status 1 when a check failed."""
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--trace", default=str(DEFAULT_TRACE))
    ap.add_argument("--limit", type=int, help="replay only the first LIMIT requests")
    ap.add_argument("--generate", type=int, metavar="N", help="a generated trace of N requests instead")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rate", type=float, default=4.0, help="--generate arrivals per second")
    ap.add_argument("--model", default="llama", help="a flat model (llama)")
    ap.add_argument("--blocks", default="16,512")
    ap.add_argument("--budget", default="2x", help="the device budget: a multiple of the peak working set")
    ap.add_argument("--host-tier", default="0,1,2,4,8", help="host capacities, multiples of the device budget")
    ap.add_argument("--spill-at", choices=["sequence", "prompt"], default="sequence",
                    help="spill the whole sequence at release (default), or only its prompt (a finished one)")
    ap.add_argument("--bandwidth", type=float, default=25.0, help="modelled host->device GB/s (PCIe 4 x16)")
    ap.add_argument("--unit-model", action="store_true",
                    help="also model blocks against records at (1 + X) x the device's blocks (unit_model)")
    ap.add_argument("--no-replay", action="store_true", help="with --unit-model: the model only")
    ap.add_argument("--baseline", metavar="PATH",
                    help="also replay an earlier HostTier from this file (the record tier: git show "
                         "5d81626:python/kvcore/tier.py > PATH), side by side at every host size")
    ap.add_argument("--protected", default="0.8",
                    help="HostTier's protected fraction (segmented LRU; 0: plain LRU); several: one run each")
    ap.add_argument("--costs", action="store_true", help="only HostTier's own costs (measure_costs), then exit")
    ap.add_argument("--quick", action="store_true", help="first 300 requests")
    ap.add_argument("--out", help="write the JSON here")
    args = ap.parse_args(argv)
    if args.costs:
        print(json.dumps(measure_costs(), indent=1))
        return 0
    if args.quick:
        args.limit = args.limit or 300
    cfg = SchedulerConfig()
    if args.generate:
        trace = generate_trace(args.generate, args.seed, rate_per_s=args.rate)[: args.limit]
        trace_name = f"generated(n={args.generate}, seed={args.seed}, rate={args.rate})"
    else:
        trace = load_trace(args.trace, args.limit)
        trace_name = args.trace + (f" (first {args.limit})" if args.limit else "")
    model = make_model(args.model)
    hm = measure_host_model(model)
    from functools import partial

    from kvcore.tier import HostTier

    tiers: list[tuple[str, Any]] = [("blocks" if len(args.protected.split(",")) == 1 else f"blocks-p{p}",
                                     partial(HostTier, protected=float(p))) for p in args.protected.split(",")]
    if args.baseline:
        tiers.append(("records", load_baseline(args.baseline)))
    xs = [float(x) for x in args.host_tier.split(",")]
    prompt_total = sum(r.input_length for r in trace)
    rows: list[dict[str, Any]] = []
    failed: list[str] = []
    for b in [int(x) for x in args.blocks.split(",")]:
        capacity = capacity_of(trace, b)
        budgets, info = budgets_for(model, b, trace, cfg, capacity, [args.budget], None, None,
                                    one_pool=kvcore_one_pool())
        ideal = trace_ideal(trace, b)
        units: dict[float, dict[str, Any]] = {}
        if args.unit_model:
            dev_blocks = kvcore_layout(model, b, budgets[args.budget], cfg, capacity,
                                       one_pool=kvcore_one_pool())["num_blocks_flat"]
            for x, u in zip(xs, unit_model(trace, b, [int((1 + x) * dev_blocks) for x in xs])):
                units[x] = {**u, "device_blocks": dev_blocks,
                            "blocks_reused_pct": 100.0 * u["blocks_reused_tokens"] / prompt_total,
                            "records_reused_pct": 100.0 * u["records_reused_tokens"] / prompt_total}
        for x in xs:
            if args.no_replay:
                rows.append({"model": model.name, "block": b, "budget": args.budget, "host_x": x,
                             "budget_bytes": budgets[args.budget], "ideal_pct": 100.0 * sum(ideal) / prompt_total,
                             "unit_model": units.get(x)})
                continue
            for name, tier_class in tiers if x else tiers[:1]:
                t0 = time.perf_counter()
                try:
                    r = run_tier(trace, model, b, budgets[args.budget], cfg, capacity, x, ideal, host_model=hm,
                                 bandwidth_gbs=args.bandwidth, spill_at=args.spill_at, tier_class=tier_class)
                    r["violation"] = None
                except AssertionError as e:
                    failed.append(f"B={b} host {x}x ({name}): {e}")
                    r = {"host_x": x, "violation": str(e)}
                r.update({"tier": name if x else "none", "model": model.name, "block": b, "budget": args.budget,
                          "budget_bytes": budgets[args.budget], "ideal_pct": 100.0 * sum(ideal) / prompt_total,
                          "infinite_cache_reused_pct": info["infinite_cache_reused_pct"],
                          "peak_working_set_bytes": info["peak_working_set_bytes"], "unit_model": units.get(x)})
                rows.append(r)
                print(f"B={b} host {x:g}x ({r['tier']}): reused {r.get('reused_pct', 0):.2f}% "
                      f"(host {r.get('host_pct', 0):.2f}%) in {time.perf_counter() - t0:.0f}s", file=sys.stderr,
                      flush=True)
    print(f"trace {trace_name}: {len(trace)} requests, {prompt_total:,} prompt tokens; model {model.name}; "
          f"device budget {args.budget} of the peak working set; host->device {args.bandwidth} GB/s (a model)")
    ok_rows = [r for r in rows if r.get("violation") is None]
    if not args.no_replay:
        print_rows(ok_rows)
    for r in ok_rows:
        if r.get("unit_model"):
            u = r["unit_model"]
            print(f"unit model B={r['block']} store of (1 + {r['host_x']:g}) x the device's blocks: blocks "
                  f"{u['blocks_reused_pct']:.2f}%, records {u['records_reused_pct']:.2f}% (ideal {r['ideal_pct']:.2f}%)")
    if failed:
        print("CHECKS FAILED:\n  " + "\n  ".join(failed))
    if args.out:
        report = {"trace": trace_name, "requests": len(trace), "prompt_tokens": prompt_total,
                  "scheduler": dataclasses.asdict(cfg), "model": model.name, "budget": args.budget,
                  "spill_at": args.spill_at, "bandwidth_gbs": args.bandwidth, "baseline": args.baseline,
                  "protected": args.protected,
                  "host_model": dataclasses.asdict(hm), "tiny_dim": TINY_DIM, "python": platform.python_version(),
                  "checks_failed": failed, "rows": rows}
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps(report, indent=1)
        import re

        text = re.sub(r"\[\s*(-?[\d.e+]+(?:,\s*-?[\d.e+]+)*)\s*\]",
                      lambda m: "[" + "".join(m.group(1).split()) + "]", text)
        Path(args.out).write_text(text + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
