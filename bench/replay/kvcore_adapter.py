"""kvcore's BatchCache behind the scheduler's adapter calls (KvcoreAdapter), with its checks of
every hit's blocks against the tokens they were computed from and of the drained KV events.
kvcore is imported when an adapter is built, not with this module.

Lookup and KV events (when the module has them:
`BatchCache.lookup_prefix`, bound with the one pool): the scheduler asks lookup_prefix (no side
effect) before admitting, admission's adopt_prefix must give the same hit, and the KV events
drained after every step are checked against the replay (a stored key is a block a step of the
replay filled, at its token range, not stored twice; an evicted key was stored; every hit
block's key is stored; none dropped). With an older module the lookup is `adopt_prefix` on the
sequence being admitted (released again if the first chunk does not fit, which touches the LRU
order) and no events are checked; the JSON says which (`lookup`, `kv_events_checked`).
"""

from __future__ import annotations

import time
from typing import Any, cast

import numpy as np

from replay.layouts import block_chunk, page_blocks_for, table_pages_for
from replay.models import Model
from replay.scheduler import Live, SchedulerConfig, grow_each, ring_blocks_per_seq


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
        # The full blocks this step's entries complete (in flight: keyed, and their states named,
        # only when the step commits; a hit covers committed blocks only). A waiting request
        # whose first block past its hit is one of them waits a step instead of computing it
        # again beside its producer: after the commit its hit reaches past it. vLLM keeps a
        # Mamba request so (MambaManager.get_num_blocks_to_allocate); its full-attention manager
        # instead hits such a block in the same forward (hashed when allocated). Kept as the
        # entries' block ranges (request -> (lv, first, end)), keyed only when a waiting
        # request's next block falls in one: block i's chained key can only equal block i's.
        self.in_flight: dict[int, tuple[Live, int, int]] = {}
        self.waits_for_producer = 0  # admissions put off a step for a producer
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
            running = layout.get("running_blocks", 0)
            if running < 1:
                raise ValueError(f"paged tables need layout['running_blocks'] >= 1 (the traffic's peak running "
                                 f"blocks, budgets_for's info), got {running}")
            stride = -(-capacity // block)
            # The groups the layout forms, from a one-block cache of the same layers.
            probe = kvcore.BatchCache(kvcore.CacheConfig(block, layers, max_step=1, batch=kvcore.BatchLimits(
                **extra, block_size=block, max_seqs=1, num_blocks=1)))
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

    def waits(self, lv: Live, hit: int) -> bool:
        """Does the prompt's first full block past the hit complete in this step (another entry
        computes it)? Then the request waits: after the commit its hit reaches past it. The keys
        it computes count as kvcore's CPU."""
        i = hit // self.block_size
        if not self.in_flight or i >= (lv.known - 1) // self.block_size:
            return False
        t0 = time.thread_time_ns()
        found = any(first <= i < end and self._key(p, i) == self._key(lv, i)
                    for p, first, end in self.in_flight.values())
        self._timed(lv, t0)
        self.waits_for_producer += found
        return found

    def _note_in_flight(self, lv: Live, start: int, n: int) -> None:
        """lv completes the full blocks of positions [start, start + n) in this step (with a State
        block of several blocks: only when the step ends on one, naming a state there)."""
        if self.state_block != self.block_size and (start + n) % self.state_block:
            return
        b = self.block_size
        if (start + n) // b > start // b:
            self.in_flight[lv.req.index] = (lv, start // b, (start + n) // b)

    def _drop_in_flight(self, lv: Live) -> None:
        """lv leaves the step (preempted): the blocks it was to complete are no longer in flight."""
        self.in_flight.pop(lv.req.index, None)

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

    def grow_many(self, batch: list[tuple[Live, int]]) -> int:
        """Reserves the blocks of the running requests' entries in order; returns how many fit
        (the first that does not is not reserved). One blocks_needed call for them all (its array
        form), the first short of blocks found from the running sums, its CPU split over the
        entries; with states in the pool or paged tables, grow() entry by entry."""
        if self.states_in_pool or self.paged or len(batch) < 2:  # one entry: grow() costs less
            return grow_each(self, batch)
        t0 = time.thread_time_ns()
        seqs = np.fromiter((lv.handle for lv, _ in batch), dtype=np.int32, count=len(batch))
        ts = np.fromiter((n for _, n in batch), dtype=np.int32, count=len(batch))
        need = self.cache.blocks_needed(seqs, ts)
        if self.one_pool:  # every group's needs against the one pool's free blocks
            total = np.cumsum(need.sum(axis=1)) + (sum(self.reserved) + self.reserved_states)
            short = np.flatnonzero(total > self.cache.free_blocks(0))
        else:
            free = np.array([self.cache.free_blocks(g) - self.reserved[g] for g in range(self.n_groups)])
            short = np.flatnonzero((np.cumsum(need, axis=0) > free).any(axis=1))
        k = int(short[0]) if len(short) else len(batch)
        taken = need[:k].sum(axis=0)
        for g in range(self.n_groups):
            self.reserved[g] += int(taken[g])
        for lv, n in batch[:k]:
            self._note_in_flight(lv, lv.computed, n)
        share = (time.thread_time_ns() - t0) // len(batch)
        for lv, _ in batch:
            lv.cpu_ns += share
        return k

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
