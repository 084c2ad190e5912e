"""Adapters of kvcore to other libraries.

Nothing here is imported by ``import kvcore``: each adapter imports its library
(torch, transformers, ExecuTorch) only when you import it, e.g.
``from kvcore.integrations.transformers import KVCoreCache``. kvcore's own torch
byte layers are ``kvcore.torch``; the step of one forward all adapters share is
``kvcore.forward_step``.

- ``kvcore.integrations.transformers``: a ``transformers`` ``Cache`` backed by
  kvcore (needs the ``transformers`` extra: ``pip install kvcore[transformers]``).
  Its parts: ``kvcore.integrations.transformers_layers`` (the cache's layer
  classes), ``kvcore.integrations.transformers_state`` (the states transformers'
  linear-attention layers pass, in kvcore's State slots),
  ``kvcore.integrations.transformers_mixers`` (recurrent mixers run token by token in
  verify steps and node by node in draft trees) and
  ``kvcore.integrations.transformers_versions`` (the Cache API it relies on, checked
  at import); import their public names from ``kvcore.integrations.transformers``.
- ``kvcore.integrations.transformers_speculative``: exact speculative decoding
  (prompt lookup, a draft model) with verify steps on hybrid models, whose
  recurrent states transformers cannot roll back.
- ``kvcore.integrations.transformers_release``: the transformers releases the
  two transformers integrations accept, and their one version check.
- ``kvcore.integrations.hf_batch``: transformers' continuous batching
  (``generate_batch``, its manager) with the cache served by a ``BatchCache``
  (needs the ``transformers`` extra; also reached through
  ``kvcore.integrations.transformers``).
- ``kvcore.integrations.hf_layers``: a transformers model config's layer types
  and their kvcore config, shared by the two above.
- ``kvcore.integrations.executorch``: drop-in caches for ExecuTorch's
  ``update_and_attend`` op, one sequence and many (needs ``torch`` and
  ``executorch``).

Deprecated paths (one release, each warns with a DeprecationWarning when imported):
``kvcore.integrations.torch_pool`` (now ``kvcore.torch.pool``),
``kvcore.integrations.torch_paged`` (``kvcore.torch.paged``; ``TorchPagedKV`` is
``TorchPagedKVPool``), ``kvcore.integrations.torch_state``
(``kvcore.torch.pool_records``), ``kvcore.integrations.torch_paged_state``
(``kvcore.torch.paged_records``) and ``kvcore.integrations.forward_step``
(``kvcore.forward_step``).
"""
