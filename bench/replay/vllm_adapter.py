"""vLLM 0.33's KVCacheManager behind the scheduler's adapter calls (VllmAdapter), run in the vLLM
venv (`trace_replay.py --peer vllm`); vllm and torch are imported when an adapter is built, not
with this module.
"""

from __future__ import annotations

import time
from typing import Any

from replay.layouts import block_chunk
from replay.models import Model, vllm_block_size
from replay.scheduler import Live, SchedulerConfig, grow_each


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

    def waits(self, lv: Live, hit: int) -> bool:
        """Never: vLLM's attention hits blocks in flight, and its MambaManager's wait is
        allocate_slots failing (admit)."""
        return False

    def grow_many(self, batch: list[tuple[Live, int]]) -> int:
        """grow() entry by entry (vLLM's scheduler allocates request by request)."""
        return grow_each(self, batch)

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
