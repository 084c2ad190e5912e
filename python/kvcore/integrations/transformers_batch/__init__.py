"""transformers' continuous batching served by kvcore (``BatchCache`` + a torch paged pool).

- ``generate_batch(model, inputs, generation_config=None, **options)``: what
  ``model.generate_batch`` returns, with kvcore planning the cache: prompt
  prefixes reused across requests for every attention type (sliding ones
  included), parallel samples sharing prompt blocks by ``fork``, K/V in kvcore's
  pool.
- ``KVCoreBatchingManager`` / ``init_kvcore_batching``: transformers'
  ``ContinuousBatchingManager`` for streaming use (``add_request``,
  ``get_result``, ``request_id_iter``, ``start``/``stop``, a context manager).
- ``BatchOptions``, ``BatchCounters``, ``check_batching_support`` (the release check, from
  ``kvcore.integrations.transformers_versions``, the one version gate).

Also importable from ``kvcore.integrations.transformers``. See docs/transformers.md
("Continuous batching"). Was ``kvcore.integrations.hf_batch`` (deprecated, removed in
kvcore 0.2.0).
"""

from kvcore.integrations.transformers_batch.counters import BatchCounters
from kvcore.integrations.transformers_batch.manager import KVCoreBatchingManager, generate_batch, init_kvcore_batching
from kvcore.integrations.transformers_batch.options import BatchOptions
from kvcore.integrations.transformers_batch.paged_cache import KVCorePagedCache
from kvcore.integrations.transformers_versions import SUPPORTED_BATCHING as SUPPORTED
from kvcore.integrations.transformers_versions import TESTED, check_batching_support

__all__ = [
    "SUPPORTED",
    "TESTED",
    "BatchCounters",
    "BatchOptions",
    "KVCoreBatchingManager",
    "KVCorePagedCache",
    "check_batching_support",
    "generate_batch",
    "init_kvcore_batching",
]
