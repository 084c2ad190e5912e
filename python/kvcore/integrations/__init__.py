"""Optional integrations of kvcore with other libraries.

Nothing here is imported by ``import kvcore``: each integration imports its
library (torch, transformers) only when you import it, e.g.
``from kvcore.integrations.transformers import KVCoreCache``.

- ``kvcore.integrations.torch_pool``: a torch byte layer, K/V tensors laid out by
  kvcore plans (needs ``torch``).
- ``kvcore.integrations.transformers``: a ``transformers`` ``Cache`` backed by
  kvcore (needs the ``transformers`` extra: ``pip install kvcore[transformers]``).
"""
