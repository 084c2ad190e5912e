"""TorchKVPool: a ``SequenceCache``'s K/V rows in torch tensors, laid out by kvcore plans.

The torch counterpart of ``kvcore.KVPool`` (``kvcore.torch``: docs/pool.md).

kvcore decides with integers where a step's rows go and which rows its queries
read (``SeqStepPlan``); this module owns the bytes. Per layer it keeps two
tensors shaped ``[batch, n_kv_heads, rows, dim]`` (keys and values), sized and
addressed by the layer's ``LayerGeometry`` (``cache.geometry(layer)``: nothing
about rows is derived here). A step writes its new rows where the plan says and
returns the layer's history in one of two orders:

- ``order="rows"`` (the default): every row that holds a position, as the rows
  lie (``LayerGeometry.held_rows``), always one view, never a copy, no more rows
  than ``cache.rows(layer)``. Attention is order-invariant over keys; build the
  mask from ``StepLayout.key_positions()`` or ``Step.mask(layer)`` (order "rows").
- ``order="positions"``: the plan's read in increasing positions: a view when it
  is one span of rows, else the spans copied into a gather workspace shared by
  all layers. Needed where something indexes keys by position (transformers'
  own mask functions: ``KVCoreCache`` uses this order).

Mirrored rings (``mirror_rings=True``, as ``kvcore.KVPool``'s and
``RingStorage::Mirrored`` in ``kv_pool.h``; ``LayerGeometry.mirror_rows``): a
ring layer without sinks that wraps keeps, after its last row, a copy of its
first ``R - 1`` rows (``R = window + max_step - 1``), written together with them.
A window that wraps round the ring then continues into the copy, so a
position-order read is one span: a view, never a gather. The cost is ``R - 1``
rows per such layer and a second copy of each write that lands in the repeated
rows. Row-order reads never need it (the held rows are one view without it), so
only a pool of order "positions" keeps a mirror: with ``order="rows"``,
``mirror_rings=True`` allocates and writes nothing more (``TorchKVPool.mirror_rings``
reports False, ``mirror_rows`` 0).

A step is laid out once per group of layers sharing a policy (``plan_step``): write
destinations (mirror included), the read spans, and for ``T = 1`` the index of
destination rows, shared by every layer of that group. The per-layer path
(``write_read``) then only checks the tensors and issues the copies.

Allocation happens only while warming up: a ring layer is allocated whole
(``cache.rows(layer)`` = window + max_step - 1 rows, plus its sinks, plus the
mirror) on first use; a flat layer starts at ``min(rows, initial_capacity)``
rows and doubles (capped at ``rows``) when a write needs more; the gather
workspace grows to the largest gathered read once. After that a step allocates
nothing but the small per-step layout.

Chunked layers (``kvcore.Chunked(K)``, Llama 4) live in a ring of ``K + max_step - 1``
rows like a sliding layer (mirrored alike); order "positions" returns the keys of the
chunk of the step's first query onwards in position order, what transformers' chunked
mask expects. Shared layers (``kvcore.Shared(source)``, Gemma 3n) allocate nothing and
write nothing (``update`` refuses them by name); ``read(layer, step)`` returns the
step's K/V of the layer they read (``cache.row_layer(layer)``), once that layer wrote
them in the same step.

Draft trees (docs/trees.md): for a step of ``cache.begin_tree(parents)`` the
plan is the chain plan of ``N`` nodes; node ``i``'s row goes to
``step.tree_rows(layer)[i]`` (its chain index's row, as ``kvcore.KVPool`` and
``kv_pool_tree.h`` write it, mirror included), the reads are the chain plan's
reads, ``StepLayout.key_positions()`` gives each read row's token position
(``length + depth`` for the step's rows) and ``step.mask(layer, order=...)``
is the tree's mask. After ``cache.commit(step, accepted=path)``,
``apply_copies(copies)`` performs its row copies before the next step.

The returned history is valid until the next ``update`` of any layer of the same
pool (the workspace is reused, and a later step overwrites ring rows). That is
what an attention layer needs; it is also why the pool is for inference only
(autograd would reject a backward through overwritten rows): key/value tensors
that require grad are taken detached (their values are stored, never their
autograd history), so the pool's tensors never require grad and no gradient
flows through the cache.

What ``kvcore.KVPool`` checks, this pool checks before it writes a row: the step
is its cache's begun step (InvalidStateError naming a stale step, another
cache's step, or a plan that is not the layer's plan of the begun step), and the
tensors fit the layer (InvalidArgumentError). A refused call changes nothing.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any, Optional, Union

import numpy as np
import torch

from kvcore._core import _copy_rows
from kvcore._core import LayerConfig, LayerGeometry, LayerPolicy, SeqStepPlan, SequenceCache, Step
from kvcore._errors import InternalError, InvalidArgumentError, InvalidStateError
from kvcore.torch import pool_records
from kvcore.torch.layer import LayerPool
from kvcore.torch.record_dtypes import Tokens
from kvcore.torch.step_layout import RowStorage, StepLayout
from kvcore.torch.workspace import Workspace

ORDERS = ("rows", "positions")


class TorchKVPool:
    """K/V storage in torch tensors for every layer of one ``kvcore.SequenceCache``.

    Use it from a forward pass: begin a step on the cache, then per layer
    ``keys, values = pool.update(layer, step, new_keys, new_values)`` with
    ``new_keys`` shaped ``[batch, n_kv_heads, T, head_dim]``; commit the step after
    the last layer. A layer is allocated on its first update (or by ``allocate``)
    with the batch size, dtype and device of what it is given. ``order`` ("rows",
    the default, or "positions") and ``mirror_rings``: see the module docstring;
    a mirror is kept only with order "positions" (row-order reads never use one), and
    the ``mirror_rings`` attribute says whether this pool keeps them (``mirror_rows(layer)``:
    how many rows). Raises InvalidArgumentError for an unknown order.
    """

    def __init__(self, cache: SequenceCache, *, mirror_rings: bool = False, order: str = "rows") -> None:
        if order not in ORDERS:
            raise InvalidArgumentError(f"order = {order!r}: must be 'rows' (the held rows as they lie) or 'positions'")
        self.cache = cache
        # Whether ring layers keep a mirror: asked for, and useful (only position-order reads use it).
        self.mirror_rings = bool(mirror_rings) and order == "positions"
        self.order = order
        cfg = cache.config
        self._initial_rows = cfg.initial_capacity
        n = cache.n_layers
        # Resolved once: the per-step path reads these for every layer.
        self._configs = [cfg.layers[0 if len(cfg.layers) == 1 else i] for i in range(n)]
        # Each layer's group (layers of one policy object share one storage layout and one StepLayout).
        self.group_of = [cache.group_of(i) for i in range(n)]
        self._first_of_group = [self.group_of.index(g) for g in range(cache.n_groups)]
        # The layer whose rows each layer reads: a Shared layer's source, else itself.
        self.row_layer = [cache.row_layer(i) for i in range(n)]
        # A Shared policy reads its source's rows: its reads are laid out on the source's geometry.
        self._storage = [
            RowStorage(cache.geometry(self.row_layer[first]), self.mirror_rings) for first in self._first_of_group
        ]
        self._layers: list[Optional[LayerPool]] = [None] * n
        self._written: list[Optional[Step]] = [None] * n  # the step each layer last wrote (read checks it)
        self._workspace = Workspace()
        self._planned: Optional[tuple[Step, list[StepLayout]]] = None

    @property
    def policy_of(self) -> list[int]:
        """Deprecated alias of ``group_of`` (removed in kvcore 0.2.0): each layer's group, the index
        of its ``StepLayout`` in ``plan_step(step)``. Warns DeprecationWarning."""
        warnings.warn(
            "TorchKVPool.policy_of is deprecated: use TorchKVPool.group_of (removed in kvcore 0.2.0)",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.group_of

    # --- allocation ----------------------------------------------------------

    def allocate(
        self, layer: int, *, batch_size: int, dtype: torch.dtype, device: Union[torch.device, str]
    ) -> LayerPool:
        """(Re)allocate ``layer`` for ``batch_size`` sequences; its rows hold nothing yet.
        InvalidArgumentError: a bad layer or batch size, or a Shared layer (it holds no rows)."""
        lc = self._layer_config(layer)
        self._refuse_shared(layer, "allocate")
        if batch_size < 1:
            raise InvalidArgumentError(f"batch_size = {batch_size}: must be >= 1")
        storage = self._storage[self.group_of[layer]]
        rows = storage.rows
        # A ring (sliding or chunked) is small and cycles through all its rows at once; only flat layers grow.
        ring = lc.policy.is_ring or lc.policy.kind == LayerPolicy.Kind.Chunked
        start = rows + storage.mirror_rows if ring else min(rows, self._initial_rows)
        pool = LayerPool(
            keys=torch.empty((batch_size, lc.n_kv_heads, start, lc.head_dim), dtype=dtype, device=device),
            values=torch.empty((batch_size, lc.n_kv_heads, start, lc.value_dim), dtype=dtype, device=device),
            rows=rows,
            mirror_rows=storage.mirror_rows if ring else 0,
        )
        self._layers[layer] = pool
        return pool

    def _refuse_shared(self, layer: int, what: str) -> None:
        """InvalidArgumentError when ``layer`` is Shared: it holds no rows and writes nothing."""
        source = self.row_layer[layer]
        if source != layer:
            raise InvalidArgumentError(
                f"{what} of layer {layer}: it is Shared({source}), which holds no rows and writes nothing; "
                f"layer {source} writes the K/V it reads (pool.read({layer}, step) returns them)"
            )

    def layer(self, layer: int) -> Optional[LayerPool]:
        """The layer's storage, or None before it is allocated (always None for a Shared layer)."""
        self._layer_config(layer)
        return self._layers[layer]

    def mirror_rows(self, layer: int) -> int:
        """Rows the layer keeps after its last row as a copy of its first ring rows (0: none, and for a Shared layer)."""
        self._layer_config(layer)
        return self._storage[self.group_of[layer]].mirror_rows if self.row_layer[layer] == layer else 0

    def nbytes(self, layer: Optional[int] = None) -> int:
        """Bytes held by one layer's K/V tensors, or by every layer (mirrors included, workspace excluded)."""
        if layer is not None:
            pool = self.layer(layer)
            return 0 if pool is None else pool.nbytes
        return sum(p.nbytes for p in self._layers if p is not None)

    @property
    def workspace_nbytes(self) -> int:
        """Bytes of the shared gather workspace gathered reads are returned in."""
        return self._workspace.nbytes

    def release(self) -> None:
        """Drop every tensor (the next update allocates again)."""
        self._layers = [None] * len(self._layers)
        self._written = [None] * len(self._layers)
        self._workspace.clear()

    # --- records (docs/state.md) ---------------------------------------------

    def export_sequence(self, tokens: Tokens = None, *, dtype: Optional[torch.dtype] = None) -> bytes:
        """The cache's sequence as a record (bytes, docs/state.md), byte for byte what a ``KVPool``
        holding the same rows gives; ``tokens``: ids of positions ``[0, len(tokens))``; ``dtype``:
        the record's dtype while no layer holds tensors. Errors: ``pool_records.export_sequence``."""
        return pool_records.export_sequence(self, tokens, dtype=dtype)

    def import_sequence(self, record: Any, *, device: Union[torch.device, str, None] = None) -> None:
        """Admits the sequence of ``record`` (bytes-like or a path; from any kvcore pool) into the
        empty cache and new batch-1 tensors on ``device``, the record validated before anything is allocated; changes
        nothing on an error. Errors: ``pool_records.import_layers``."""
        self._install(pool_records.import_layers(self, record, device=device))

    def _install(self, layers: list[LayerPool]) -> None:
        """Replace every layer's storage (an import's tensors); cached step layouts are dropped."""
        self._layers = list(layers)
        self._written = [None] * len(self._layers)
        self._planned = None

    def map_batch(self, layer: int, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """Replace the layer's batch with ``fn(tensor)`` (beam reorder / select / repeat on dim 0)."""
        pool = self.layer(layer)
        if pool is None:
            return
        keys, values = fn(pool.keys).detach(), fn(pool.values).detach()
        if keys.shape[1:] != pool.keys.shape[1:] or values.shape[1:] != pool.values.shape[1:]:
            raise InvalidArgumentError("map_batch: fn may change only the batch dimension (dim 0)")
        pool.set_tensors(keys.contiguous(), values.contiguous())

    # --- the per-step path -----------------------------------------------------

    def plan_step(self, step: Step) -> list[StepLayout]:
        """The begun ``step`` laid out per group (index with ``group_of[layer]``); cached for the step."""
        planned = self._planned
        if planned is not None and planned[0] is step and step.is_current:
            return planned[1]
        self._check_step(step)
        position, T = step.position, step.T
        order = self.order
        chain_positions = None
        if step.is_tree:  # the token position of each chain index
            chain_positions = [0] * T
            for node, ci in enumerate(step.chain_index.tolist()):
                chain_positions[ci] = int(step.positions[node])
        layouts = [
            StepLayout(
                step.plan(first), self._storage[p], position, T, order,
                None if chain_positions is None else (step.tree_rows(first).tolist(), chain_positions),
                step,
            )
            for p, first in enumerate(self._first_of_group)
        ]  # fmt: skip
        self._planned = (step, layouts)
        return layouts

    def _check_step(self, step: Step) -> None:
        """InvalidStateError unless ``step`` is the begun step of the pool's cache (as ``KVPool.update``)."""
        if not isinstance(step, Step):
            raise InvalidArgumentError(f"step: a kvcore.Step of the pool's cache, not {type(step).__name__}")
        if step.cache is not self.cache:
            raise InvalidStateError(f"step {step!r} belongs to another cache than the pool's")
        if not step.is_current:
            raise InvalidStateError(
                f"step {step!r} is stale: it is no longer its cache's begun step (committed, aborted or replaced)"
            )

    def _check_plan(self, layer: int, plan: SeqStepPlan) -> Step:
        """The begun step, after checking ``plan`` is ``layer``'s plan of it (as ``KVPool.write``):
        InvalidStateError naming a stale plan or another step's (another cache's) plan."""
        active = self.cache.active_step
        if active is None:
            raise InvalidStateError(f"plan of layer {layer}: no step is begun (stale plan)")
        if active.is_tree:
            raise InvalidArgumentError(
                f"layer {layer}: the begun step is a draft tree: pass the Step, not its plan "
                "(node rows follow the tree's chain indices)"
            )
        if active.plan(layer) != plan:
            raise InvalidStateError(
                f"plan is not layer {layer}'s plan of the begun step (position {active.position}, T {active.T}): "
                "a stale plan or another cache's"
            )
        return active

    def update(
        self, layer: int, step: Union[Step, SeqStepPlan], key: torch.Tensor, value: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the step's rows of ``layer`` where kvcore's plan says, return its history in the pool's order.

        ``step``: the begun step (or the layer's ``SeqStepPlan`` of it). ``key``/``value``:
        ``[batch, n_kv_heads, T, head_dim]`` / ``[..., value_dim]``, taken detached when they
        require grad (the values are stored, never their autograd history). Returns keys and values
        ``[batch, n_kv_heads, n, dim]``: for order "positions" the positions
        ``read_positions(plan)`` in order; for "rows" the held rows, row r standing for
        ``cache.geometry(layer).position_at(r, step.end)`` (``StepLayout.key_positions``).
        A draft-tree step (``begin_tree``) writes input row ``i`` (node ``i``) to its
        chain index's row; it must be passed as the Step (its plan alone does not
        name the tree). Raises InvalidArgumentError for a bad layer, a Shared layer (it
        writes nothing: ``read`` returns its source's K/V), tensors that do not fit it, or a tree step passed as a plan; InvalidStateError for a stale step
        or plan (of an earlier step) or another cache's step or plan. Nothing is written
        on an error.
        """
        self._layer_config(layer)
        if isinstance(step, SeqStepPlan):
            active = self._check_plan(layer, step)
            storage = self._storage[self.group_of[layer]]
            layout = StepLayout(step, storage, active.position, active.T, self.order, step=active)
        else:
            layout = self.plan_step(step)[self.group_of[layer]]
        return self.write_read(layer, layout, key, value)

    def write_read(
        self, layer: int, layout: StepLayout, key: torch.Tensor, value: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``update`` with the step already laid out (``plan_step(step)[group_of[layer]]``): the hot path.

        Same checks, result and errors as ``update``: InvalidArgumentError for a layer outside
        ``[0, n_layers)``, InvalidStateError when the layout's step is no longer its cache's
        begun step or the layout is another pool's.
        """
        if not 0 <= layer < len(self._layers):  # -1 would write the last layer
            raise InvalidArgumentError(f"layer = {layer}: must be in [0, n_layers = {len(self._layers)})")
        step = layout.step
        if step is None or layout.storage is not self._storage[self.group_of[layer]] or not step.is_current:
            self._refuse_layout(layer, layout)
        if key.requires_grad or value.requires_grad:  # inference only: the values, never the graph
            key, value = key.detach(), value.detach()
        pool = self._layers[layer]
        if (
            pool is None
            or pool.T != layout.T
            or key.shape != pool.k_shape
            or value.shape != pool.v_shape
            or key.dtype != pool.dtype
            or value.dtype != pool.dtype
            or key.device != pool.device
            or value.device != pool.device
        ):
            pool = self._pool_for(layer, layout, key, value)
        if layout.write_end > pool.tensor_rows:
            self._grow(pool, layout.write_end)
        pk, pv = pool.keys, pool.values
        pair = layout.pair
        native = pool.native
        # _copy_rows checks nothing. Checked here: key/value have the pool's shape for T rows, its
        # dtype and device (the test above, else _pool_for); every destination row lies in the
        # tensors (write_end <= tensor_rows, else _grow, which refuses rows past the layer's);
        # every source row in [0, T) (StepLayout: the plan's runs add up to T).
        if native is not None and layout.flat_writes:  # CPU: every write of K and V in one native call
            _copy_rows(
                (pk.data_ptr(), *native[0]), (pv.data_ptr(), *native[1]), native[2], layout.flat_writes,
                key.data_ptr(), key.stride(), value.data_ptr(), value.stride(),
            )  # fmt: skip
        elif pair is not None:  # T = 1 into a row and its mirror: one strided view of both, the row broadcast
            row, gap = pair  # (inlined, like the view below: this runs for every layer of every token)
            B, H, D, st, off = pool._k_geometry
            pk.as_strided((B, H, 2, D), (st[0], st[1], gap * st[2], st[3]), off + row * st[2]).copy_(key)
            B, H, D, st, off = pool._v_geometry
            pv.as_strided((B, H, 2, D), (st[0], st[1], gap * st[2], st[3]), off + row * st[2]).copy_(value)
        elif layout.tree_dst:  # a draft tree: node i to its chain index's row (and mirror copies)
            dst, src = layout.tree_index_on(pool.device)
            if len(layout.tree_dst) == layout.T:
                pk.index_copy_(2, dst, key)
                pv.index_copy_(2, dst, value)
            else:
                pk.index_copy_(2, dst, key.index_select(2, src))
                pv.index_copy_(2, dst, value.index_select(2, src))
        elif layout.index:  # T = 1 into one row: one indexed copy
            rows = layout.index_on(pool.device)
            pk.index_copy_(2, rows, key)
            pv.index_copy_(2, rows, value)
        else:
            T = layout.T
            for row, n, off in layout.writes:
                pk.narrow(2, row, n).copy_(key if n == T else key.narrow(2, off, n))
                pv.narrow(2, row, n).copy_(value if n == T else value.narrow(2, off, n))
        self._written[layer] = step
        view = layout.view
        if view is not None:  # LayerPool.view, inlined
            row, n = view
            B, H, D, st, off = pool._k_geometry
            keys = pk.as_strided((B, H, n, D), st, off + row * st[2])
            B, H, D, st, off = pool._v_geometry
            return keys, pv.as_strided((B, H, n, D), st, off + row * st[2])
        return self._gather(pool, layout.gather, layout.read_len)

    def read(self, layer: int, step: Step) -> tuple[torch.Tensor, torch.Tensor]:
        """The K/V ``update`` returned for ``layer`` in the begun ``step``, without writing anything.

        For a Shared layer: the rows of its source (``row_layer[layer]``) for the step's plan,
        which is the source's read (a view, or a copy in the gather workspace, in the pool's
        order). The rows must be written first: InvalidStateError when the layer that holds them
        has not been updated in ``step`` (a Shared layer's source writes earlier in the same
        forward); InvalidArgumentError for a bad layer or a non-Step; InvalidStateError for a
        stale step or another cache's. Valid until the next update of any layer (as ``update``'s).
        """
        self._layer_config(layer)
        layout = self.plan_step(step)[self.group_of[layer]]
        source = self.row_layer[layer]
        pool = self._layers[source]
        if pool is None or self._written[source] is not step:
            raise InvalidStateError(
                f"read of layer {layer}: layer {source} has not written its rows of this step (position "
                f"{step.position}, T {step.T}) yet; update layer {source} first"
            )
        if layout.view is not None:
            return pool.view(*layout.view)
        return self._gather(pool, layout.gather, layout.read_len)

    def _refuse_layout(self, layer: int, layout: StepLayout) -> None:
        """Why ``write_read`` refuses ``layout``: not this pool's (InvalidArgumentError), or its step ended."""
        self._layer_config(layer)
        if layout.step is None or layout.storage is not self._storage[self.group_of[layer]]:
            raise InvalidArgumentError(
                f"layer {layer}: the layout is not this pool's layout of the layer's policy (use pool.plan_step(step))"
            )
        self._check_step(layout.step)

    def apply_copies(self, copies: Sequence[Any]) -> None:
        """Performs a draft-tree commit's row copies: ``copies`` is what
        ``SequenceCache.commit(step, accepted)`` returned, one int ``(n, 2)`` array of
        ``[src row, dst row]`` per layer, copied in order (K and V, every batch row,
        the mirror copy too). Call it after the commit and before the next step's
        update. InvalidArgumentError: not one ``(n, 2)`` int array per layer, or a row
        outside ``[0, cache.rows(layer))``; InvalidStateError: a row the layer has not
        allocated (the tree step was not written). Every layer is checked before
        anything is copied.
        """
        n = len(self._layers)
        if isinstance(copies, (str, bytes)) or not isinstance(copies, Sequence) or len(copies) != n:
            raise InvalidArgumentError(f"apply_copies: copies must be a list of one (n, 2) int array per layer ({n} layers)")
        checked: list[list[list[int]]] = []
        for layer, c in enumerate(copies):
            a = np.asarray(c.cpu() if isinstance(c, torch.Tensor) else c)
            if a.ndim != 2 or a.shape[1] != 2 or not (a.size == 0 or np.issubdtype(a.dtype, np.integer)):
                raise InvalidArgumentError(f"apply_copies: copies[{layer}] must be an (n, 2) int array, got shape {a.shape}")
            rows = self._storage[self.group_of[layer]].rows
            pool = self._layers[layer]
            allocated = 0 if pool is None else pool.allocated_rows
            for i, (src, dst) in enumerate(a.tolist()):
                if not (0 <= src < rows and 0 <= dst < rows):
                    raise InvalidArgumentError(
                        f"apply_copies: copies[{layer}][{i}] (row {src} to row {dst}) must lie in rows [0, {rows})"
                    )
                if src >= allocated or dst >= allocated:
                    raise InvalidStateError(
                        f"apply_copies: copies[{layer}][{i}] (row {src} to row {dst}) reaches rows layer {layer} "
                        f"has not allocated ({allocated}): write the tree step first"
                    )
            checked.append(a.tolist())
        for layer, pairs in enumerate(checked):
            pool = self._layers[layer]
            if pool is None or not pairs:
                continue
            storage = self._storage[self.group_of[layer]]
            lo_m = storage.ring_start
            for src, dst in pairs:
                targets = [dst]
                if pool.mirror_rows and lo_m <= dst < lo_m + pool.mirror_rows:
                    targets.append(pool.rows + dst - lo_m)
                for t in targets:
                    if t != src:
                        pool.keys[:, :, t].copy_(pool.keys[:, :, src])
                        pool.values[:, :, t].copy_(pool.values[:, :, src])

    def _gather(
        self, pool: LayerPool, spans: Sequence[tuple[int, int]], n: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        pk, pv = pool.keys, pool.values
        B, H, _, D = pk.shape
        keys = self._workspace.take("k", (B, H, n, D), pk)
        values = self._workspace.take("v", (B, H, n, pv.shape[3]), pv)
        torch.cat([pk.narrow(2, row, m) for row, m in spans], dim=2, out=keys)
        torch.cat([pv.narrow(2, row, m) for row, m in spans], dim=2, out=values)
        return keys, values

    def _pool_for(self, layer: int, layout: StepLayout, key: torch.Tensor, value: torch.Tensor) -> LayerPool:
        """The slow path of ``write_read``: explain a mismatch, or (re)allocate the layer."""
        self.check_input(layer, key, value, position=layout.position, T=layout.T)
        pool = self._layers[layer]
        if pool is None or (pool.batch_size, pool.dtype, pool.device) != (key.shape[0], key.dtype, key.device):
            pool = self.allocate(layer, batch_size=int(key.shape[0]), dtype=key.dtype, device=key.device)
        pool.expect(layout.T)
        return pool

    def check_input(
        self, layer: int, key: torch.Tensor, value: torch.Tensor, *, position: int, T: Optional[int] = None
    ) -> int:
        """Raise InvalidArgumentError unless ``key``/``value`` fit ``layer`` for ``T`` new rows at ``position``.

        ``T`` defaults to what ``key`` carries; returns it. Allocates and changes nothing, so
        a caller can check a layer's input before it changes any state (``write_read``
        checks it again on its slow path).
        """
        lc = self._layer_config(layer)
        self._refuse_shared(layer, "update")
        if key.dim() != 4 or value.dim() != 4:
            raise InvalidArgumentError(
                f"layer {layer}: key/value must be 4-D [batch, n_kv_heads, T, dim], got {tuple(key.shape)} "
                f"and {tuple(value.shape)}"
            )
        if T is None:
            T = int(key.shape[2])
        want_k = (key.shape[0], lc.n_kv_heads, T, lc.head_dim)
        want_v = (key.shape[0], lc.n_kv_heads, T, lc.value_dim)
        if tuple(key.shape) != want_k or tuple(value.shape) != want_v:
            raise InvalidArgumentError(
                f"layer {layer}: key {tuple(key.shape)} / value {tuple(value.shape)} do not match the step "
                f"(T = {T}) and the layer config: want {want_k} / {want_v}"
            )
        if key.dtype != value.dtype or key.device != value.device:
            raise InvalidArgumentError(
                f"layer {layer}: key ({key.dtype}, {key.device}) and value ({value.dtype}, {value.device}) differ"
            )
        pool = self._layers[layer]
        if pool is None or (pool.batch_size, pool.dtype, pool.device) != (key.shape[0], key.dtype, key.device):
            # A new batch/dtype/device may start only a new sequence: older rows would not match it.
            if pool is not None and position != 0:
                raise InvalidArgumentError(
                    f"layer {layer}: the pool holds batch {pool.batch_size} of {pool.dtype} on "
                    f"{pool.device}, got batch {key.shape[0]} of {key.dtype} on {key.device} at position "
                    f"{position}; a different batch, dtype or device can only start at position 0"
                )
        return T

    @staticmethod
    def _grow(pool: LayerPool, needed: int) -> None:
        # Doubling keeps growth amortised O(1) per row; never past kvcore's rows (flat layers only).
        if needed > pool.rows:  # kvcore's plans never write past them; _copy_rows relies on it
            raise InternalError(f"a step writes row {needed - 1}, past the layer's {pool.rows} rows")
        new_rows = min(pool.rows, max(needed, 2 * pool.allocated_rows))
        old = pool.allocated_rows
        keys = pool.keys.new_empty((*pool.keys.shape[:2], new_rows, pool.keys.shape[3]))
        values = pool.values.new_empty((*pool.values.shape[:2], new_rows, pool.values.shape[3]))
        keys[:, :, :old].copy_(pool.keys)
        values[:, :, :old].copy_(pool.values)
        pool.set_tensors(keys, values)

    def _layer_config(self, layer: int) -> LayerConfig:
        if not 0 <= layer < len(self._layers):
            raise InvalidArgumentError(f"layer = {layer}: must be in [0, n_layers = {len(self._layers)})")
        return self._configs[layer]


__all__ = ["ORDERS", "TorchKVPool"]
