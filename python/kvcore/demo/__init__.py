"""The demos of ``kvcore demo`` and the reference model they run, apart from the API.

Nothing here is imported by ``import kvcore``. One concept per module:

- ``kvcore.demo.model``: a small Gemma-style decoder in numpy (``Model``), its
  no-cache oracle (``Model.forward_full``) and ``Decoder``, which runs it through
  ``SequenceCache`` + ``KVPool``;
- ``kvcore.demo.options``: the model knobs both demos share (``ModelOptions``),
  the K/V dtypes and their tolerances;
- ``kvcore.demo.footprint``: the bytes a run needs, checked against the
  machine's memory before anything is allocated;
- ``kvcore.demo.drafts``: greedy decoding and speculative drafts;
- ``kvcore.demo.runner``: the progress bar, one BLAS thread, and the check, run,
  report and exit-code sequence both demos share;
- ``kvcore.demo.sequence``: ``kvcore demo``, one sequence, plain then speculative;
- ``kvcore.demo.batch``: ``kvcore demo --batch``, many chats through
  ``BatchCache`` + ``PagedKVPool``;
- ``kvcore.demo.trees``: ``kvcore demo --tree N``, speculative decoding with
  draft trees through ``SequenceCache`` + ``KVPool``;
- ``kvcore.demo.early_exit``: the tree demo's drafter, the model's own first
  layers with its final norm and head (self-speculative early exit);
- ``kvcore.demo.hf_batch``: ``kvcore demo --hf-batch``, a tiny random transformers
  model through kvcore's continuous batching against transformers' own (needs
  torch and transformers);
- ``kvcore.demo.disaggregated``: ``kvcore demo --disaggregated``, prefill and
  decode on Ray actors, sequences moved as records (kvcore.state);
- ``kvcore.demo.executorch_runtime``: ``kvcore demo --runtime executorch``, a tiny random
  model exported to a ``.pte`` and run by ``kvcore-run`` (ExecuTorch's C++ runtime, kvcore's
  kernel behind the op), its tokens checked against PyTorch (needs torch, executorch and the
  built runner);
- ``kvcore.demo.executorch_real``: ``kvcore demo --runtime executorch --model NAME``, a real
  model exported once (cached) and run by ``kvcore-run``, its tokens checked against
  transformers' greedy ``generate()``;
- ``kvcore.demo.real_model``: real trained models for ``--model`` (Gemma 3 270M from
  PyPI), converted once and cached under ~/.cache/kvcore (needs the gemma extra);
- ``kvcore.demo.real``: ``kvcore demo --model NAME``'s decoding, the real model through
  transformers and ``KVCoreCache``, plain and with prompt-lookup drafts, and the check
  against a full recomputation;
- ``kvcore.demo.real_run``: ``kvcore demo --model NAME``'s run and report: every
  decoding of the real model, each checked;
- ``kvcore.demo.real_trees``: ``kvcore demo --tree N --model NAME``, draft trees of
  the real model verified through ``KVCoreCache`` (``begin_tree`` / ``commit_tree``),
  against chains of the same budget;
- ``kvcore.demo.real_early_exit``: their drafter, the real model's own first layers
  with its final norm and head, weights shared;
- ``kvcore.demo.real_batch``: ``kvcore demo --batch --model NAME``, real chats sharing
  a system prompt through kvcore's ``generate_batch``, each checked against
  transformers' ``generate()`` of it alone;
- ``kvcore.demo.real_disaggregated``: ``kvcore demo --disaggregated --model NAME``, a real
  model's prefill and decode on two Ray actors, sequences moved as records;
- ``kvcore.demo.command``: the demos' command lines.
"""
