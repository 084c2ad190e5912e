"""kvcore caches behind ExecuTorch's ``kvcache::update_and_attend`` op.

ExecuTorch 1.5.1 (``executorch/extension/llm/cache/``) defines the neutral custom
op ``kvcache::update_and_attend(q, k, v, position, layer_id, scale, out_dtype)``:
an exported model calls it once per attention layer, and at run time it asks the
cache installed in its process-global ``REGISTRY`` for
``update_and_fetch(layer_id, k, v, position) -> (k_hist, v_hist, AttendSpec)``,
then attends ``q`` over that history. ExecuTorch ships two reference caches
(``reference_cache.py``). The two classes here are drop-in replacements for them,
with the same constructor (ExecuTorch's own ``CacheConfig``), verbs, op face and
builtin exception types, planned by kvcore:

- ``KVCoreContiguousCache`` (for ``ContiguousReferenceCache``): one sequence over a
  ``kvcore.SequenceCache`` and a torch pool. A ring (sliding-window) layer holds
  ``window + max_step - 1`` rows written in place, where the reference keeps the
  whole history and masks it; a flat layer holds its history.
- ``KVCoreCellCache`` (for ``CellReferenceCache``): many sequences over a
  ``kvcore.BatchCache`` (cell-granular by default: ``block_size=1``) and a torch
  paged store. Forks share rows, ``seq_rm`` releases them, and ring layers release
  what no future query can need, where the reference keeps every cell.

Both take ``kv_dtype`` (None, ``"int8"`` or ``"fp8"``): with ``"int8"`` each row is stored
as ExecuTorch's ``QuantizedKVCache`` quantizes it (asymmetric int8 per (token, head), a
float32 scale and an int8 zero point, bit for bit), with ``"fp8"`` as float8 e4m3fn with a
float32 scale (``kvcore.torch.TorchQuantizedKVPool`` / ``TorchQuantizedPagedKVPool``,
docs/quantized.md); the history comes back dequantized in the dtype ``k`` came in.

The ``AttendSpec`` each returns is the cheapest kind that is exact: ``NONE`` when
every query sees every returned row, ``CAUSAL`` when the history is exactly the
step's own tokens and each sees itself and the earlier ones (what torch's
``is_causal`` expresses), else ``EXPLICIT`` with a boolean mask from kvcore's
visibility rule. Errors are kvcore's exceptions, which subclass the builtins the
references raise (``ValueError``, ``RuntimeError``).

Use (see docs/executorch.md)::

    from executorch.extension.llm.cache.update_and_attend import REGISTRY
    cache = KVCoreContiguousCache(config, max_step=64)
    REGISTRY.install("llm", cache)
    with REGISTRY.active("llm"):
        out = exported_program.module()(tokens, positions, logits_indices)

Tested with executorch 1.5.1 and torch 2.13.0.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Optional

from kvcore.integrations.executorch_spec import MAX_SEQS, TESTED_EXECUTORCH
from kvcore.integrations.executorch_cells import KVCoreCellCache
from kvcore.integrations.executorch_contiguous import KVCoreContiguousCache


@contextmanager
def installed(cache: Any, key: Optional[str] = None) -> Iterator[str]:
    """Install ``cache`` in ExecuTorch's ``REGISTRY`` (and its kvcore cache in kvcore's registry under the
    same key), make it the active cache, yield the key, and remove both on exit.

    ``key`` None picks a fresh ``"executorch#N"``, reserved in kvcore's registry as it is picked. kvcore's
    registry is filled first: a taken ``key`` raises ``kvcore.AlreadyRegisteredError`` (a ``ValueError``)
    before ExecuTorch's ``REGISTRY`` is touched, and any later failure removes both entries.
    """
    import kvcore._core as core

    op = importlib.import_module("executorch.extension.llm.cache.update_and_attend")
    if key is None:
        key = core.registry_install_unique("executorch", cache.kvcore)
    else:
        core.registry_install(key, cache.kvcore)
    try:
        op.REGISTRY.install(key, cache)
        with op.REGISTRY.active(key):
            yield key
    finally:
        op.REGISTRY.uninstall(key)
        core.registry_erase_if_same(key, cache.kvcore)


__all__ = [
    "MAX_SEQS",
    "TESTED_EXECUTORCH",
    "KVCoreCellCache",
    "KVCoreContiguousCache",
    "installed",
]
