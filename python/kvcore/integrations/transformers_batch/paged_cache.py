"""``KVCorePagedCache``: transformers' ``PagedAttentionCache`` interface, planned by a ``kvcore.BatchCache``.

transformers' continuous-batching manager, scheduler and input builder run
unchanged on top of it; what they ask of the cache is answered by kvcore:

- requests are kvcore sequences; admission (``can_store_request_tokens``) adds
  up the blocks kvcore says each request needs (``blocks_needed``, ``StepRound``),
  and the forward begins one kvcore step; releases are ``release_sequence``;
- prompt prefixes are adopted across requests for every attention type,
  sliding ones included (``search_prefix_match`` is ``adopt_prefix``), and full
  blocks are named by the token ids each step carries;
- parallel samples fork their parent (``prepare_fork_request`` is ``fork_many``):
  prompt blocks are shared, a partly filled one copied on write by the plan;
- K/V live in kvcore's torch paged pool (``TorchPagedKVPool``, or with
  ``options.kv_dtype`` ``TorchQuantizedPagedKVPool``: rows quantized, read back
  dequantized), one tensor per layer indexed by pool row; ``update`` performs the step's block copies, writes the
  new rows at the plan's slots and returns the rows transformers' masks expect
  (each request's keys in position order), so its paged attention functions
  (``sdpa``, ``paged|eager``) attend as with its own cache.

A forward is one kvcore step, committed by the update of the last layer.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
import torch

from kvcore._core import BatchCache, CacheConfig, LayerPolicy
from kvcore._errors import InternalError, NotSupportedError
from kvcore.integrations.transformers_batch.counters import BatchCounters
from kvcore.integrations.transformers_batch.group_view import GroupView
from kvcore.integrations.transformers_batch.options import BatchOptions, batch_config
from kvcore.integrations.transformers_batch.shared_prefill import SharedPrefill
from kvcore.integrations.transformers_batch.step_round import StepRound
from kvcore.integrations.transformers_batch.tokens import prompt_tokens_in_step
from kvcore.quantized import row_bytes
from kvcore.torch.paged import TorchPagedKVPool
from kvcore.torch.quantized_paged import TorchQuantizedPagedKVPool
from kvcore.integrations.transformers_config import CHUNKED, SLIDING


class _NoSectors:
    """transformers' scheduler asks the pool to regroup free sectors; kvcore has no sectors.
    The call opens a scheduling round, so it also drops admissions no forward used."""

    def __init__(self, cache: "KVCorePagedCache") -> None:
        self._cache = cache

    def try_to_free_sectors(self) -> None:
        self._cache.open_round()


class KVCorePagedCache:
    """A drop-in for transformers' ``PagedAttentionCache``, built by ``KVCoreBatchingManager``.

    ``config``: the model's text config. ``options``: kvcore's sizes and ``kv_dtype`` (``BatchOptions``).
    ``device``/``dtype``: where and how K/V are held. ``planned_config``: what
    ``batch_config(config, options)`` returned, when the caller has it (not built again). Raises
    NotSupportedError for a model kvcore cannot serve, InvalidArgumentError for options that do not
    fit it.
    """

    # transformers' processor builds its own offloading manager (replaced by ``Preemption`` right
    # after), which sizes a swap pool of 0 bytes in sectors; kvcore has no sectors.
    bytes_per_sector = 1

    def __init__(
        self,
        config: Any,
        options: BatchOptions,
        device: Any,
        dtype: torch.dtype,
        planned_config: Optional[tuple[CacheConfig, dict[str, list[int]]]] = None,
    ) -> None:
        kv_config, groups = planned_config if planned_config is not None else batch_config(config, options)
        self.config = config
        self.options = options
        self.device = device
        self.dtype = dtype
        self.batch = BatchCache(kv_config)
        self.pool = _NoSectors(self)
        self.kv = (
            TorchPagedKVPool(self.batch, dtype=dtype, device=device)
            if options.kv_dtype is None
            else TorchQuantizedPagedKVPool(self.batch, options.kv_dtype, device=device)
        )
        self.counters = BatchCounters()
        self.cache_allocators: dict[str, GroupView] = {}
        self.layer_to_allocator: dict[int, GroupView] = {}
        for index, (kind, layers) in enumerate(groups.items()):
            group = self.batch.group_of(layers[0])
            window = int(getattr(config, "sliding_window", 0) or 0) if kind == SLIDING else 0
            if kind == CHUNKED:
                window = self.batch.layer_config(layers[0]).policy.window  # the chunk size
            view = GroupView(index, kind, group, layers, window)
            self.cache_allocators[kind] = view
            self.layer_to_allocator.update(dict.fromkeys(layers, view))
        # KV-shared layers (Gemma 3n) never call update: the step commits after the last layer that writes.
        self._writing_layers = sum(1 for l in self.layer_to_allocator if self.batch.layer_config(l).policy.kind != LayerPolicy.Kind.Shared)
        self._views = list(self.cache_allocators.values())
        self._block_bytes = [self._bytes_per_block(v) for v in self._views]
        self.round = StepRound(self.batch, self._views)
        self._seq_of: dict[str, int] = {}
        self._free_seqs = list(range(options.max_seqs - 1, -1, -1))
        self.shared_prefill = SharedPrefill(self.batch.block_size)
        self._waiting: set[str] = set()  # new requests told to wait for a shared prompt this forward
        self._offsets = torch.zeros(0, dtype=torch.int64)  # get_seq_length of the planned forward ...
        self._offsets_of: Optional[dict[str, Any]] = None  # ... built for this round.planned
        # What transformers' scheduler and input builder read.
        self.max_batch_tokens = options.max_batch_tokens
        self.max_blocks_per_request = 0  # no decode fast path: every forward goes through the indices
        self.max_decode_fast_path_length = 0
        self.use_prefix_sharing = True
        self.allow_block_sharing = True
        capacity = self.batch.capacity
        self.max_tokens_read = options.max_tokens_read or options.max_seqs * capacity
        self.read_cache_limit = self._views[0].window if all(v.window for v in self._views) else None
        flat = [v for v in self._views if not v.window]
        self.num_blocks = self.batch.num_blocks((flat or self._views)[0].group)

    def _bytes_per_block(self, view: GroupView) -> int:
        """K/V bytes of one block of the group over its layers (quantized rows with their scales)."""
        kv_dtype, size = self.options.kv_dtype, torch.empty((), dtype=self.dtype).element_size()
        per_row = 0
        for layer in view.layer_indices:
            c = self.batch.layer_config(layer)
            if c.policy.kind == LayerPolicy.Kind.Shared:  # a KV-shared layer reads its source's rows
                continue
            if kv_dtype is None:
                per_row += c.n_kv_heads * (c.head_dim + c.value_dim) * size
            else:
                per_row += row_bytes(kv_dtype, c.n_kv_heads, c.head_dim) + row_bytes(kv_dtype, c.n_kv_heads, c.value_dim)
        return per_row * self.batch.block_size

    # --- sequences ----------------------------------------------------------------------

    def sequence_of(self, request_id: str) -> Optional[int]:
        """The kvcore sequence serving a request, or None."""
        return self._seq_of.get(request_id)

    def _new_sequence(self, request_id: str) -> Optional[int]:
        if not self._free_seqs:
            return None
        seq = self._free_seqs.pop()
        self.batch.add_sequence(seq)
        self._seq_of[request_id] = seq
        return seq

    def _release(self, request_id: str) -> None:
        self.shared_prefill.forget(request_id)
        seq = self._seq_of.pop(request_id, None)
        if seq is not None:
            self.batch.release_sequence(seq)
            self._free_seqs.append(seq)

    @property
    def active_sequences(self) -> int:
        """Sequences kvcore holds now (requests with a cache, parallel samples included)."""
        return len(self._seq_of)

    # --- scheduling rounds ------------------------------------------------------------------

    def open_round(self) -> None:
        """Start scheduling a forward: a step planned but never run, or admissions no forward
        used, are dropped (their blocks go back)."""
        if self.round.admitted or self.round.step is not None:
            self.round.end()

    def can_store_request_tokens(self, state: Any, request_len: int, dry_run: bool = False) -> bool:
        """Admit ``request_len`` more tokens of the request into the forward being scheduled:
        True if every group has the blocks (kvcore's admission), False and no change otherwise."""
        if self.round.planned is not None:
            self.round.end()
        known = self._seq_of.get(state.request_id)
        fresh = known is None
        seq = self._new_sequence(state.request_id) if known is None else known
        if seq is None:
            return False
        length = self.batch.length(seq)
        if length != state.current_len():
            raise InternalError(f"request {state.request_id}: at position {state.current_len()}, kvcore at {length}")
        if self.round.holds(state.request_id):
            raise InternalError(f"request {state.request_id}: admitted twice in one forward")
        if state.request_id in self._waiting and not dry_run:
            self._waiting.discard(state.request_id)
            if fresh or not length:
                self._release(state.request_id)
            return False
        request_len = min(request_len, self.batch.max_step)  # the scheduler cuts the chunk there (chunking.py)
        if dry_run:
            fits = self.round.admit(state.request_id, seq, state, request_len)
            if fits:
                self.round.drop(state.request_id)
            if fresh:
                self._release(state.request_id)
            return fits
        if self.round.admit(state.request_id, seq, state, request_len):
            self.shared_prefill.note(state.request_id, state, request_len)  # later candidates may wait for it
            return True
        if fresh:
            self._release(state.request_id)
        return False

    def search_prefix_match(self, request_id: str, prompt_ids: list[int]) -> int:
        """Adopt the longest cached prefix of a new request's prompt (every group, sliding ones
        included); returns the tokens adopted (0: none), which the request will not recompute."""
        if self.round.planned is not None:
            self.round.end()
        seq = self._seq_of.get(request_id)
        if seq is None:
            seq = self._new_sequence(request_id)
            if seq is None:
                return 0
        if self.batch.length(seq) or len(prompt_ids) > self.batch.capacity:
            return 0
        if self.options.wait_for_shared_prefill and self.shared_prefill.should_wait(prompt_ids):
            self._waiting.add(request_id)  # its prompt is being computed: adopt it once committed
            return 0
        hit = self.batch.adopt_prefix(seq, np.asarray(prompt_ids, np.int32))
        if hit and not self.round.fits():  # the revived blocks were counted free for the admitted
            self.batch.rewind(seq, 0)
            hit = 0
        if hit:
            self.counters.prefix_hits += 1
            self.counters.prefix_hit_tokens += hit
        return hit

    def count_new_complete_blocks(self, state: Any, request_len: int) -> dict[str, int]:
        """kvcore names full blocks itself when a step commits: nothing for transformers to mark."""
        return {}

    def mark_complete_blocks(self, state: Any, complete_blocks: dict[str, int]) -> None:
        """No-op: kvcore named the blocks at the step's commit."""

    def evict_cached_blocks(self) -> bool:
        """No-op (False): kvcore reclaims cached blocks, least recently released first, when a pool runs short."""
        return False

    def compute_free_capacity(self, relative: bool = True) -> float:
        """The free share of the one pool every group draws from (cached blocks count as free), or
        its free bytes: a free block is a page of every storage the groups share, the bytes of the
        largest group's block."""
        g = self._views[0].group
        if relative:
            return self.batch.free_blocks(g) / self.batch.num_blocks(g)
        return float(self.batch.free_blocks(g) * max(self._block_bytes))

    # --- releases and forks -------------------------------------------------------------------

    def free_blocks(self, request_id: str, no_cache: bool = False) -> None:
        """Release the request's sequence: its blocks return once no one holds them, full named
        ones stay cached for prefix reuse (``no_cache`` is ignored: kvcore reclaims when short)."""
        if self.round.planned is not None and request_id in self.round.planned:
            self.round.end()  # its forward failed: the step is abandoned
        elif self.round.holds(request_id):
            self.round.drop(request_id)
        self._release(request_id)

    def free_all_requests(self, clear_ledgers: bool = False) -> None:
        """Release every sequence; ``clear_ledgers`` also forgets every cached block."""
        self.round.end()
        self.batch.release_sequences(np.asarray(list(self._seq_of.values()), np.int32))
        self._free_seqs.extend(self._seq_of.values())
        self._seq_of.clear()
        self.shared_prefill.clear()
        self._waiting.clear()
        if clear_ledgers:
            self.batch.clear()

    def reset(self) -> None:
        """Release everything and forget cached blocks."""
        self.free_all_requests(clear_ledgers=True)

    def prepare_fork_request(
        self, src_state: Any, dst_req_ids: list[str], copy_src_and_dst: dict[str, tuple[list[int], list[int]]]
    ) -> list[str]:
        """Fork the request's sequence into each child while sequence ids last; returns the children
        forked. No block is copied now: a shared, partly filled block is copied when written."""
        src = self._seq_of.get(src_state.request_id)
        if src is None:
            return []
        self.round.end()
        forked = dst_req_ids[: len(self._free_seqs)]
        if not forked:
            return []
        keep = len(self._free_seqs) - len(forked)
        seqs = self._free_seqs[keep:][::-1]  # the ids pop() would give, lowest first
        self.batch.fork_many(src, np.asarray(seqs, np.int32))  # all or none
        del self._free_seqs[keep:]
        self._seq_of.update(zip(forked, seqs))
        self.counters.forks += len(forked)
        return forked

    def perform_cache_copy(self, copy_src_and_dst: dict[str, tuple[list[int], list[int]]]) -> None:
        """No-op: a step's plan carries its block copies, done by ``update`` before writing."""

    def fill_block_table(self, request_id: str, past_length: int, query_length: int, block_table: Any) -> None:
        """The decode fast path (flash block tables) is off: refuse."""
        raise NotSupportedError("kvcore's continuous batching has no decode fast path (max_blocks_per_request = 0)")

    # --- one forward ------------------------------------------------------------------------

    def extend_read_and_write_indices(
        self,
        request_id: str,
        past_length: int,
        query_length: int,
        read_index: Optional[list[list[int]]],
        write_index: list[list[int]],
    ) -> None:
        """Append the request's pool rows to transformers' index lists: per attention type, the
        row of each new token, and (``read_index``) of each key its queries read, in position order.
        The forward's kvcore step was begun by ``plan_forward``."""
        if self.round.planned is None:
            raise InternalError(f"request {request_id}: the forward's kvcore step was not planned")
        entry = self.round.planned.get(request_id)
        if entry is None or entry.place != self.round.next_place:
            raise InternalError(f"request {request_id}: not the next request of kvcore's step")
        if (past_length, query_length) != (entry.first, entry.tokens):
            raise InternalError(
                f"request {request_id}: {query_length} tokens at {past_length}; kvcore planned "
                f"{entry.tokens} at {entry.first}"
            )
        self.round.next_place += 1
        for v in self._views:
            write_index[v.index].extend(entry.writes[v.index].tolist())
            if read_index is not None:
                read_index[v.index].extend(entry.reads[v.index].tolist())

    def plan_forward(self, batch: list[Any]) -> None:
        """Begin the kvcore step of the scheduled ``batch`` (transformers' future states, in input
        order), just before transformers builds its inputs."""
        self.round.plan(batch)
        for future in batch:
            self.shared_prefill.note(future.state.request_id, future.state, future.query_length)
        self._count_step()

    def _count_step(self) -> None:
        c = self.counters
        step = self.round.step
        assert step is not None
        c.tokens_computed += step.n_tokens
        c.prompt_tokens_computed += sum(prompt_tokens_in_step(a.state) for a in self.round.admitted)
        held = [self.batch.held_blocks(v.group) for v in self._views]
        c.peak_blocks = max(c.peak_blocks, sum(held))
        c.peak_kv_bytes = max(c.peak_kv_bytes, sum(h * b for h, b in zip(held, self._block_bytes)))

    def get_seq_length(self, layer_idx: int = 0) -> torch.Tensor:
        """Per token of the planned forward (requests packed in input order): its position minus
        its index in the forward, an int64 tensor, so that ``arange(T) + get_seq_length()`` is
        each token's position. Llama 4's temperature tuning (NoPE layers) asks the cache for one
        past length and adds ``arange(T)``, which in a packed forward of requests at different
        positions must be this. InternalError when no forward is planned."""
        planned = self.round.planned
        if planned is None:
            raise InternalError("get_seq_length: no planned forward (inputs not built by this cache)")
        if self._offsets_of is not planned:  # built once per forward, and only for models that ask
            entries = sorted(planned.values(), key=lambda e: e.place)
            positions = np.concatenate([np.arange(e.first, e.first + e.tokens) for e in entries])
            self._offsets = torch.from_numpy(positions - np.arange(len(positions))).to(self.device)
            self._offsets_of = planned
        return self._offsets

    @torch.compiler.disable  # type: ignore[untyped-decorator]  # torch's decorator is untyped
    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, kwargs: dict[str, Any]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One layer's part of the forward: the step's block copies (first layer), the new K/V
        ``[1, heads, tokens, dim]`` written at the plan's slots, and the keys and values its
        queries read returned in transformers' order. The last layer that writes commits the step
        (a KV-shared layer attends over its source's returned rows and never calls update)."""
        view = self.layer_to_allocator[layer_idx]
        kwargs["cu_seq_lens_k"] = kwargs["cu_seq_lens_k"][view.layer_type].to(torch.int32)
        kwargs["max_length_k"] = kwargs["max_length_k"][view.layer_type]
        if kwargs.get("block_table") is not None:
            raise NotSupportedError("kvcore's continuous batching has no decode fast path")
        rnd = self.round
        if rnd.step is None or rnd.planned is None or not rnd.step.is_current:
            raise InternalError(f"layer {layer_idx}: no planned kvcore step (inputs not built by this cache)")
        if rnd.layers_done == 0:
            for v, copies in zip(self._views, rnd.copies):
                self.kv.copy_blocks(v.group, copies)
        write = kwargs["write_index"][view.index]
        read = kwargs["read_index"][view.index]
        # A forward reading no cache (transformers leaves read_index empty) attends over its own new
        # rows: read back from the pool, so quantized K/V are attended as stored, as every later read.
        key_states, value_states = self.kv.write_gather(
            layer_idx, write, key_states, value_states, rnd.live_rows[view.index], read if read.numel() else write
        )
        rnd.layers_done += 1
        if rnd.layers_done == self._writing_layers:
            rnd.step.commit()
            self.counters.forwards += 1
            rnd.end()
        return key_states, value_states


__all__ = ["KVCorePagedCache"]
