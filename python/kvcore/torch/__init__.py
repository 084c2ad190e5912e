"""kvcore's torch byte layers: the torch counterparts of ``KVPool`` and ``PagedKVPool``.

kvcore plans steps with integers; a byte layer owns the K/V bytes and applies the
plans. These keep the bytes in torch tensors (any device), beside the numpy ones of
``kvcore._core``:

- ``TorchKVPool`` (``kvcore.torch.pool``): one ``SequenceCache``'s rows, per layer
  ``[batch, n_kv_heads, rows, dim]`` tensors laid out by the step's plans
  (``StepLayout``, ``kvcore.torch.step_layout``: where one policy's layers write and
  read a step, computed once per step and policy).
- ``TorchQuantizedKVPool`` (``kvcore.torch.quantized``): a ``TorchKVPool`` whose rows
  are stored quantized (``kv_dtype`` "int8" or "fp8", each row with its scales:
  docs/quantized.md), values in and out in a compute dtype.
- ``TorchPagedKVPool`` (``kvcore.torch.paged``): a ``BatchCache``'s rows, per layer
  ``[1, n_kv_heads, pool rows, dim]`` tensors indexed by pool row.
- ``TorchQuantizedPagedKVPool`` (``kvcore.torch.quantized_paged``): a ``TorchPagedKVPool``
  whose rows are stored quantized as ``PagedKVPool(cache, "qint8" / "fp8_e4m3")`` stores them,
  read back dequantized in a compute dtype (continuous batching's ``kv_dtype``).
- ``TorchStateSlots`` (``kvcore.torch.state_slots``): the recurrent states of a
  ``SequenceCache``'s State layers, any number of named tensors per layer, ``D``
  slots each, read and written where the step's plan says (design.md section 9).
- Their record export and import (``pool_records``, ``paged_records``: docs/state.md),
  reached through their ``export_sequence`` / ``import_sequence`` methods and
  ``kvcore.state``; ``layer`` (one layer's tensors of a ``TorchKVPool``) and
  ``record_dtypes`` (the dtypes a record and a tensor share) and ``workspace`` (the reused
  buffers reads are returned in) below them.

Naming: a byte layer class is ``[Torch]<Cache kind>KVPool``: ``KVPool`` /
``TorchKVPool`` over a ``SequenceCache``, ``PagedKVPool`` / ``TorchPagedKVPool`` over a
``BatchCache``. Needs ``torch``; ``import kvcore`` does not import this package.
The old paths (``kvcore.integrations.torch_pool``, ``torch_paged``, ``torch_state``,
``torch_paged_state``, and the name ``TorchPagedKV``) and the old verb names
(``TorchPagedKVPool.apply_commit`` and ``state``, ``TorchKVPool.policy_of``: one name per action
with the numpy pools) work for one more release and warn (DeprecationWarning;
docs/deprecations.md).
"""

from __future__ import annotations

from kvcore.torch.layer import LayerPool
from kvcore.torch.paged import TorchPagedKVPool
from kvcore.torch.pool import ORDERS, TorchKVPool
from kvcore.torch.quantized import TorchQuantizedKVPool
from kvcore.torch.quantized_paged import TorchQuantizedPagedKVPool
from kvcore.torch.state_slots import TorchStateSlots
from kvcore.torch.step_layout import StepLayout, read_positions

__all__ = ["ORDERS", "LayerPool", "StepLayout", "TorchKVPool", "TorchPagedKVPool", "TorchQuantizedKVPool",
           "TorchQuantizedPagedKVPool", "TorchStateSlots", "read_positions"]
