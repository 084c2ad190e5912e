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
- ``kvcore.demo.trees``: ``kvcore demo --tree``, tree speculative decoding
  through ``SequenceCache.begin_tree`` and ``commit(accepted)``;
- ``kvcore.demo.disaggregated``: ``kvcore demo --disaggregated``, prefill and
  decode on Ray actors, sequences moved as records (kvcore.state);
- ``kvcore.demo.command``: the demos' command lines.
"""
