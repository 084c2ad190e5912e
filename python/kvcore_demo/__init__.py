"""The demos of ``kvcore demo`` and the reference model they run: a package of its own.

It ships in kvcore's wheel beside the core package, which names it only in its command line
(``kvcore demo`` runs ``kvcore_demo.command``); nothing here is imported by ``import kvcore``,
and ``kvcore.demo`` is its deprecated path (until kvcore 0.2.0). The real models the
``real_*`` demos run come from ``kvcore.integrations.transformers_models``. One concept per
module:

- ``kvcore_demo.model``: a small Gemma-style decoder in numpy (``Model``), its
  no-cache oracle (``Model.forward_full``) and ``Decoder``, which runs it through
  ``SequenceCache`` + ``KVPool``;
- ``kvcore_demo.options``: the model knobs both demos share (``ModelOptions``),
  the K/V dtypes and their tolerances;
- ``kvcore_demo.footprint``: the bytes a run needs, checked against the
  machine's memory before anything is allocated;
- ``kvcore_demo.drafts``: greedy decoding and speculative drafts;
- ``kvcore_demo.runner``: the progress bar, one BLAS thread, and the check, run,
  report and exit-code sequence both demos share;
- ``kvcore_demo.sequence``: ``kvcore demo``, one sequence, plain then speculative;
- ``kvcore_demo.batch``: ``kvcore demo --batch``, many chats through
  ``BatchCache`` + ``PagedKVPool`` (the run and its report), over
  ``kvcore_demo.batch_chats`` (its options, chats and oracle) and
  ``kvcore_demo.batch_server`` (its serving loop);
- ``kvcore_demo.trees``: ``kvcore demo --tree N``, speculative decoding with
  draft trees through ``SequenceCache`` + ``KVPool``;
- ``kvcore_demo.early_exit``: the tree demo's drafter, the model's own first
  layers with its final norm and head (self-speculative early exit);
- ``kvcore_demo.hf_batch``: ``kvcore demo --hf-batch``, a tiny random transformers
  model through kvcore's continuous batching against transformers' own (needs
  torch and transformers);
- ``kvcore_demo.disaggregated``: ``kvcore demo --disaggregated``, prefill and
  decode on Ray actors, sequences moved as records (kvcore.state);
- ``kvcore_demo.cluster``: ``kvcore demo --cluster``, conversations on Ray replicas
  over a cluster record store with a KV-aware router (kvcore.cluster);
- ``kvcore_demo.executorch_runtime``: ``kvcore demo --runtime executorch``, a tiny random
  model exported to a ``.pte`` and run by ``kvcore-run`` (ExecuTorch's C++ runtime, kvcore's
  kernel behind the op), its tokens checked against PyTorch (needs torch, executorch and the
  built runner);
- ``kvcore_demo.executorch_real``: ``kvcore demo --runtime executorch --model NAME``, a real
  model exported once (cached) and run by ``kvcore-run``, its tokens checked against
  transformers' greedy ``generate()``;
- ``kvcore_demo.real``: ``kvcore demo --model NAME``'s decoding, the real model through
  transformers and ``KVCoreCache``, plain and with prompt-lookup drafts, and the check
  against a full recomputation;
- ``kvcore_demo.real_run``: ``kvcore demo --model NAME``'s run and report: every
  decoding of the real model, each checked;
- ``kvcore_demo.real_trees``: ``kvcore demo --tree N --model NAME``, draft trees of
  the real model verified through ``KVCoreCache`` (``begin_tree`` / ``commit_tree``),
  against chains of the same budget;
- ``kvcore_demo.real_early_exit``: their drafter, the real model's own first layers
  with its final norm and head, weights shared;
- ``kvcore_demo.real_batch``: ``kvcore demo --batch --model NAME``, real chats sharing
  a system prompt through kvcore's ``generate_batch``, each checked against
  transformers' ``generate()`` of it alone;
- ``kvcore_demo.real_disaggregated``: ``kvcore demo --disaggregated --model NAME``, a real
  model's prefill and decode on two Ray actors, sequences moved as records;
- ``kvcore_demo.command``: the demos' command lines.
"""
