"""Adapters of kvcore to other libraries.

Nothing here is imported by ``import kvcore``: each adapter imports its library
(torch, transformers, ExecuTorch) only when you import it, e.g.
``from kvcore.integrations.transformers import KVCoreCache``. kvcore's own torch
byte layers are ``kvcore.torch``; the step of one forward all adapters share is
``kvcore.forward_step``; reading a config.json (no transformers needed) is
``kvcore.hf_config``. A module that imports transformers or torch says so in its
path (``transformers_*``, ``kvcore.torch``; ExecuTorch is torch's);
``tests/python/test_import_graph.py`` checks it.

- ``kvcore.integrations.transformers``: a ``transformers`` ``Cache`` backed by
  kvcore (needs the ``transformers`` extra: ``pip install kvcore[transformers]``),
  the front module: every public name of the modules below is importable from it.
  Its parts, one concept each:
  ``kvcore.integrations.transformers_cache`` (``KVCoreCache``: construction, facts,
  ``update``, length changes), ``kvcore.integrations.transformers_steps`` (the step of
  one forward: begun, joined, committed, retried, discarded),
  ``kvcore.integrations.transformers_trees`` (draft trees and verify steps),
  ``kvcore.integrations.transformers_state_calls`` (transformers' linear-attention API
  over kvcore's State slots), ``kvcore.integrations.transformers_masks`` (mask sizes and
  ``attention_masks``), ``kvcore.integrations.transformers_layers`` (the cache's layer
  classes), ``kvcore.integrations.transformers_state`` (the states transformers'
  linear-attention layers pass, in kvcore's State slots),
  ``kvcore.integrations.transformers_mixers`` (recurrent mixers run token by token in
  verify steps and node by node in draft trees),
  ``kvcore.integrations.transformers_prefill`` (``prefill``: a model's forwards in chunks
  of ``max_step``), ``kvcore.integrations.transformers_config`` (a transformers model
  config's layer types and their kvcore config, shared with continuous batching) and
  ``kvcore.integrations.transformers_versions`` (the one version gate: the transformers
  releases both transformers integrations accept, and the calls they rely on).
- ``kvcore.integrations.transformers_speculative``: exact speculative decoding
  (prompt lookup, a draft model) with verify steps on hybrid models, whose
  recurrent states transformers cannot roll back, and ``verify_tree`` (one forward
  over a draft tree).
- ``kvcore.integrations.transformers_models``: real trained models by name (Gemma 3 270M
  from PyPI), converted once and cached under ~/.cache/kvcore, for ``kvcore export --model``
  and the real-model demos (needs the ``gemma`` extra).
- ``kvcore.integrations.transformers_batch``: transformers' continuous batching
  (``generate_batch``, its manager) with the cache served by a ``BatchCache``
  (needs the ``transformers`` extra; also reached through
  ``kvcore.integrations.transformers``).
- ``kvcore.integrations.executorch``: drop-in caches for ExecuTorch's
  ``update_and_attend`` op, one sequence and many (needs ``torch`` and
  ``executorch``), the front module of its parts:
  ``kvcore.integrations.executorch_contiguous`` (``KVCoreContiguousCache``, one sequence),
  ``kvcore.integrations.executorch_cells`` (``KVCoreCellCache``, many) and
  ``kvcore.integrations.executorch_spec`` (ExecuTorch's reference types and the checks and
  layer configs both share).
- ``kvcore.integrations.executorch_runtime``: kvcore inside ExecuTorch's runtime: the
  ``.out`` variant ``to_executorch`` needs, kvcore's cache metadata in the program, an
  export, and the ``kvcore_executorch_ops`` kernel library loaded and driven from Python
  (needs ``torch``, ``executorch`` and the built library; docs/executorch.md).
- ``kvcore.integrations.executorch_export``: ``kvcore export``: an off-graph attention for
  transformers models (each layer calls ``kvcache::update_and_attend``), the cache metadata of a
  transformers config, and the export of ``tiny`` or Gemma 3 270M to a ``.pte`` for
  ``kvcore-run`` (needs ``torch`` and ``executorch``; ``transformers`` for real models).
- ``kvcore.integrations.executorch_tiny``: a tiny random decoder on that op with a plain
  PyTorch reference, exported in seconds, for checks and demos (needs ``torch`` and
  ``executorch``).

Deprecated paths, each removed in kvcore 0.2.0 and warning with a DeprecationWarning
when imported (docs/deprecations.md): ``kvcore.integrations.torch_pool`` (now
``kvcore.torch.pool``), ``kvcore.integrations.torch_paged`` (``kvcore.torch.paged``;
``TorchPagedKV`` is ``TorchPagedKVPool``), ``kvcore.integrations.torch_state``
(``kvcore.torch.pool_records``), ``kvcore.integrations.torch_paged_state``
(``kvcore.torch.paged_records``), ``kvcore.integrations.forward_step``
(``kvcore.forward_step``), ``kvcore.integrations.hf_layers``
(``kvcore.integrations.transformers_config``) and ``kvcore.integrations.hf_batch``
(``kvcore.integrations.transformers_batch``).
"""
