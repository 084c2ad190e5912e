"""What transformers' batch processor asks of its offloading manager, answered by recompute preemption.

transformers offloads a starved request's K/V to a CPU swap pool (or "soft
resets" it) by walking its allocators' block tables. With kvcore the request is
released instead and requeued as an equivalent new request (prompt plus the
tokens generated so far); its full blocks stay cached under their token names,
so its re-prefill adopts most of them back (``search_prefix_match``) unless the
pool had to reclaim them. This object also hands the scheduled batch to the
cache right before transformers builds the forward's inputs.
"""

from __future__ import annotations

from typing import Any

from transformers.generation.continuous_batching.requests import RequestStatus

from kvcore.integrations.transformers_batch.paged_cache import KVCorePagedCache


class Preemption:
    """Stands in for transformers' ``OffloadingManager`` beside a ``KVCorePagedCache``."""

    def __init__(self, cache: KVCorePagedCache, scheduler: Any) -> None:
        self.cache = cache
        self.scheduler = scheduler

    def offload_requests(self) -> bool:
        """Release the newest starved request (not in the batch just scheduled) and requeue it from
        its prompt and generated tokens; False when none can go (one active request left)."""
        scheduler = self.scheduler
        starved = scheduler.starved_requests
        if not starved or len(scheduler.active_requests) <= 1:
            return False
        state, _ = starved.pop()
        requeued = state.create_equivalent_initial_request()
        state._status = RequestStatus.FINISHED  # bypass the setter's lifespan bookkeeping, as transformers does
        scheduler.finish_request(state.request_id)
        scheduler.add_waiting_request(requeued)
        scheduler.block_new_requests = True
        self.cache.counters.preempted += 1
        return True

    def restore_scheduled_requests(self, requests_in_batch: list[Any]) -> None:
        """Nothing is swapped out; plan the batch's kvcore step (transformers builds its inputs next)."""
        self.cache.plan_forward(requests_in_batch)

    def free_request_cpu_cache(self, state: Any) -> None:
        """No-op: nothing lives in a CPU swap pool."""

    def free_all_waiting_cpu_caches(self) -> None:
        """No-op: nothing lives in a CPU swap pool."""

    def reset(self) -> None:
        """No-op: nothing lives in a CPU swap pool."""


__all__ = ["Preemption"]
