"""Optional integrations of kvcore with other libraries.

Nothing here is imported by ``import kvcore``: each integration imports its
library (torch, transformers) only when you import it, e.g.
``from kvcore.integrations.transformers import KVCoreCache``.

- ``kvcore.integrations.torch_pool``: a torch byte layer for one sequence, K/V
  tensors laid out by kvcore plans (needs ``torch``).
- ``kvcore.integrations.torch_paged``: a torch byte layer for many sequences,
  one paged store per group of a ``BatchCache`` (needs ``torch``).
- ``kvcore.integrations.torch_state``: sequence records (kvcore.state) out of
  and into a ``torch_pool`` pool, the same bytes as ``KVPool``'s (needs ``torch``).
- ``kvcore.integrations.torch_paged_state``: sequence records out of and into a
  ``torch_paged`` store, the same bytes as ``PagedKVPool``'s (needs ``torch``).
- ``kvcore.integrations.transformers``: a ``transformers`` ``Cache`` backed by
  kvcore (needs the ``transformers`` extra: ``pip install kvcore[transformers]``).
- ``kvcore.integrations.transformers_release``: the transformers releases the
  two transformers integrations accept, and their one version check.
- ``kvcore.integrations.hf_batch``: transformers' continuous batching
  (``generate_batch``, its manager) with the cache served by a ``BatchCache``
  (needs the ``transformers`` extra; also reached through
  ``kvcore.integrations.transformers``).
- ``kvcore.integrations.executorch``: drop-in caches for ExecuTorch's
  ``update_and_attend`` op, one sequence and many (needs ``torch`` and
  ``executorch``).
- ``kvcore.integrations.forward_step``: the step of one forward, layer by layer,
  that the transformers cache and both ExecuTorch caches share (no dependency).
"""
