"""TorchStateSlots: the recurrent states of a ``SequenceCache``'s State layers in torch tensors.

The torch byte layer of design.md section 9's State layers (docs/layer_kinds.md,
"Recurrent state"). A ``State(D)`` layer keeps ``D`` snapshots of its state per
sequence, in slots ``slot(p) = p % D``: the token at ``p`` reads the state after
``p - 1`` (zeros at ``p = 0``) and the plan of each step names which slots it
writes (``plan(layer).write``: one slot for a plain step, the state after each
position for a verify or tree step). kvcore decides the slots with integers; this
module owns the bytes.

Per State layer it keeps any number of named tensors (a conv window and a recurrent
matrix for gated DeltaNet and Mamba-2, a conv window alone for LFM2's short
convolutions), each with its own shape and dtype, taken from the first write of
that name: a state ``[batch, *shape]`` is stored as ``[D, batch, *shape]``
(``batch_first=False``, the default: every slot is one contiguous block, as
kernels that update a state in place want it) or ``[batch, D, *shape]``
(``batch_first=True``).

The per-call path of an integration works on a ``SlotSpan`` (``span(layer, plan,
first, count)``): the slots one call of a layer over positions ``[first, first +
count)`` reads and keeps, plain integers checked against the plan once, so a call
that outlives its step's commit (a model whose last layer holds a state commits
the forward at that layer's first call) still writes where the plan said.
``read_state`` / ``write_states`` / ``prepare`` then read and write by the span.

- ``read(layer, name, plan, position)``: the state after ``position - 1`` as the
  plan holds it (``plan.read`` for the step's first position, the step's own write
  slots after it); zeros at position 0.
- ``write(layer, name, plan, first, states)``: states after positions
  ``first, first + 1, ...`` (``[batch, n, *shape]``); each one the plan keeps goes to
  its slot, the others are dropped (a plain step keeps only its last).
- ``apply_copies(copies)``: the slot copies ``commit(step, accepted)`` returns for a
  tree (none on the main line), before the next step.

A rewind moves nothing here: the next step reads the slot holding the state after
its first position minus one, which is what ``can_rewind`` promises is held. A
refused call (bad layer, name, shape, dtype, device, positions outside the step or
not kept by it, a stale plan) raises before anything is written.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Optional

import torch

from kvcore._core import LayerPolicy, SeqStepPlan, SequenceCache, Step
from kvcore._errors import InvalidArgumentError, InvalidStateError


def plan_slot(plan: SeqStepPlan, position: int) -> Optional[int]:
    """The slot holding the state after ``position`` in ``plan``'s read or write runs, or None
    when the plan names no slot for it (a plain step keeps only its last position)."""
    for run in (*plan.read, *plan.write):
        if run.pos <= position < run.pos + run.len:
            return int(run.row + position - run.pos)
    return None


def check_like(layer: int, name: str, stored: torch.Tensor, one: torch.Tensor) -> None:
    """InvalidArgumentError unless ``one`` (a state to store) has the shape, dtype and device of
    ``stored`` (one slot of state ``name`` of ``layer`` as stored): a state keeps those of its first
    write (``TorchStateSlots`` and ``TorchPagedKVPool`` store states by this rule)."""
    shape = tuple(stored.shape)
    if tuple(one.shape) != shape or one.dtype != stored.dtype or one.device != stored.device:
        raise InvalidArgumentError(
            f"state {name!r} of layer {layer}: {tuple(one.shape)} {one.dtype} on {one.device}, but the "
            f"layer stores {shape} {stored.dtype} on {stored.device} (a state keeps the shape of its first write)"
        )


@dataclass(frozen=True)
class SlotSpan:
    """The slots one call of a State layer over positions ``[first, first + count)`` of a step uses.

    ``read``: the slot holding the state after ``first - 1``; None at ``first = 0`` (zeros) and
    when the plan does not hold it (``first`` inside a plain step: reading it is refused).
    ``keep``: ``(position, slot)`` for each position of the call whose state the step keeps,
    in order (every one in a verify step, the step's last only in a plain step).
    """

    layer: int
    first: int
    count: int
    read: Optional[int]
    keep: tuple[tuple[int, int], ...]

    @property
    def last_slot(self) -> Optional[int]:
        """The slot of the call's last position, or None when the step does not keep it."""
        if self.keep and self.keep[-1][0] == self.first + self.count - 1:
            return self.keep[-1][1]
        return None


class TorchStateSlots:
    """State slots in torch tensors for every State layer of one ``kvcore.SequenceCache``.

    ``cache``: the SequenceCache whose plans address the slots. ``batch_first``: store a
    state ``[batch, *shape]`` as ``[batch, D, *shape]`` (True) or ``[D, batch, *shape]``
    (False, the default: each slot contiguous). Tensors are allocated on the first write
    of each (layer, name), zero-filled. See the module docstring.
    """

    def __init__(self, cache: SequenceCache, *, batch_first: bool = False) -> None:
        self.cache = cache
        self.batch_first = bool(batch_first)
        policies = [cache.layer_policy(i) for i in range(cache.n_layers)]
        self._slots = {i: p.slots for i, p in enumerate(policies) if p.kind == LayerPolicy.Kind.State}
        self._tensors: dict[int, dict[str, torch.Tensor]] = {i: {} for i in self._slots}

    # --- what is held ----------------------------------------------------------------

    @property
    def layers(self) -> tuple[int, ...]:
        """The cache's State layers, in order."""
        return tuple(self._slots)

    def slots(self, layer: int) -> int:
        """D, the state slots ``layer`` keeps per sequence. InvalidArgumentError: not a State layer."""
        return self._slots[self._check_layer(layer)]

    def names(self, layer: int) -> tuple[str, ...]:
        """The state names ``layer`` holds so far (allocated by their first write)."""
        return tuple(self._tensors[self._check_layer(layer)])

    def tensor(self, layer: int, name: str) -> Optional[torch.Tensor]:
        """The whole storage of ``name`` in ``layer`` (``[D, batch, *shape]`` or ``[batch, D, *shape]``),
        or None before its first write."""
        return self._tensors[self._check_layer(layer)].get(name)

    def slot(self, layer: int, name: str, slot: int) -> torch.Tensor:
        """A view ``[batch, *shape]`` of one slot of ``name`` (writing it writes the slot).
        InvalidArgumentError: a slot outside ``[0, D)``; InvalidStateError: ``name`` not written yet."""
        t = self._stored(layer, name)
        D = self._slots[layer]
        if not 0 <= slot < D:
            raise InvalidArgumentError(f"slot = {slot}: layer {layer} keeps slots [0, {D})")
        return t[:, slot] if self.batch_first else t[slot]

    def nbytes(self, layer: Optional[int] = None) -> int:
        """Bytes of state slots held by one State layer, or by all."""
        layers = self.layers if layer is None else (self._check_layer(layer),)
        return sum(t.numel() * t.element_size() for i in layers for t in self._tensors[i].values())

    @property
    def batch_size(self) -> Optional[int]:
        """The batch size of the stored states, or None before any write."""
        for named in self._tensors.values():
            for t in named.values():
                return int(t.shape[0 if self.batch_first else 1])
        return None

    # --- reads and writes --------------------------------------------------------------

    def span(self, layer: int, plan: SeqStepPlan, first: int, count: int) -> SlotSpan:
        """The slots a call of ``layer`` over positions ``[first, first + count)`` of the begun step reads
        and keeps (``plan``: the layer's plan of that step). InvalidArgumentError: positions outside the
        step; InvalidStateError: a stale plan."""
        self._check_plan(layer, plan)
        P, T = self._step_span()
        if count < 1 or not P <= first or first + count > P + T:
            raise InvalidArgumentError(
                f"positions [{first}, {first + count}): layer {layer}'s step covers [{P}, {P + T})"
            )
        read = plan_slot(plan, first - 1) if first > 0 else None
        written = [(int(r.pos), int(r.len), int(r.row)) for r in plan.write]
        keep = tuple((q, row + q - pos) for q in range(first, first + count)
                     for pos, n, row in written if pos <= q < pos + n)  # fmt: skip
        return SlotSpan(layer, first, count, read, keep)

    def node_span(self, layer: int, step: Step, node: int) -> SlotSpan:
        """The slots a call of ``layer`` over node ``node`` alone of the begun draft-tree ``step``
        reads and keeps: its parent's slot (the root: the state after ``step.position - 1``) and its
        own (``step.tree_rows(layer)``). ``SlotSpan.first`` is the node's chain position
        (``step.position + chain_index[node]``, its slot's position in the step's layout).
        InvalidArgumentError: not a tree step's node; InvalidStateError: a stale step."""
        plan = step.plan(layer)
        self._check_plan(layer, plan)
        T = int(step.T)
        if not step.is_tree or not 0 <= node < T:
            raise InvalidArgumentError(f"node = {node}: layer {layer}'s step is not a draft tree with nodes [0, {T})")
        P, rows, parent = int(step.position), step.tree_rows(layer), int(step.parents[node])
        if parent < 0:
            read = plan_slot(plan, P - 1) if P > 0 else None
        else:
            read = int(rows[parent])
        first = P + int(step.chain_index[node])
        return SlotSpan(layer, first, 1, read, ((first, int(rows[node])),))

    def read_state(self, layer: int, name: str, span: SlotSpan) -> Optional[torch.Tensor]:
        """The state after ``span.first - 1``: a view of its slot, zeros at position 0, or None
        before ``name``'s first write. InvalidArgumentError: the plan does not hold that state (a
        position inside a plain step, which keeps only its last)."""
        t = self._tensors[self._check_layer(layer)].get(name)
        if t is None:
            return None
        if span.first == 0:
            return torch.zeros_like(t[:, 0] if self.batch_first else t[0])
        return self.slot(layer, name, self._read_slot(span))

    def prepare(self, layer: int, name: str, span: SlotSpan) -> torch.Tensor:
        """The slot of the span's last position, holding the state after ``span.first - 1``: a kernel
        that updates a state in place (transformers' single-token decode kernels) leaves the state
        after the last position there. InvalidStateError: ``name`` not written yet, or a span whose
        last position the step does not keep; InvalidArgumentError: as ``read_state``."""
        target = span.last_slot
        if target is None:
            raise InvalidStateError(
                f"layer {layer}: the step does not keep the state after position {span.first + span.count - 1}"
            )
        view = self.slot(layer, name, target)
        if span.first == 0:
            view.zero_()
        elif (read := self._read_slot(span)) != target:
            view.copy_(self.slot(layer, name, read))
        return view

    def write_states(self, layer: int, name: str, span: SlotSpan, states: torch.Tensor) -> Optional[torch.Tensor]:
        """Store the states after the span's last ``n`` positions (``states``: ``[batch, n, *shape]``)
        that the step keeps, each in its slot; return the view of the last position's slot (None when
        the step does not keep it).

        The first write of ``name`` allocates it (zeros, shape, dtype and device of ``states``);
        later ones must match them. InvalidArgumentError: ``n`` outside ``[1, span.count]``, a
        shape, dtype or device other than the stored one, fewer than 2 dims. Nothing is written
        on an error.
        """
        self._check_layer(layer)
        if states.dim() < 2 or not 1 <= int(states.shape[1]) <= span.count:
            raise InvalidArgumentError(
                f"states {tuple(states.shape)} of layer {layer}: must be [batch, n, *state shape] with n in "
                f"[1, {span.count}] (the positions of the call)"
            )
        n = int(states.shape[1])
        one = states[:, 0]
        t = self._tensors[layer].get(name)
        if t is not None:
            self._check_like(layer, name, t, one)
        else:
            t = self._allocate(layer, name, one)
        start = span.first + span.count - n
        states = states.detach()
        for q, slot in span.keep:
            if q >= start:
                (t[:, slot] if self.batch_first else t[slot]).copy_(states[:, q - start])
        last = span.last_slot
        return None if last is None else self.slot(layer, name, last)

    def read(self, layer: int, name: str, plan: SeqStepPlan, position: int) -> Optional[torch.Tensor]:
        """The state after ``position - 1`` (a view of its slot), zeros at position 0, or None
        before ``name``'s first write.

        ``plan``: ``layer``'s plan of the begun step; ``position`` in ``[P, P + T)`` (the step's
        first position reads ``plan.read``, a later one the slot the step wrote for the position
        before it). Errors as ``span``.
        """
        return self.read_state(layer, name, self.span(layer, plan, position, 1))

    def write(self, layer: int, name: str, plan: SeqStepPlan, first: int, states: torch.Tensor) -> int:
        """Store the states after positions ``first .. first + n - 1`` (``states``: ``[batch, n, *shape]``)
        that ``plan`` keeps, each in its slot; return how many were kept. Errors as ``span`` and
        ``write_states``; nothing is written on an error."""
        if states.dim() < 2:
            raise InvalidArgumentError(f"states {tuple(states.shape)}: must be [batch, n positions, *state shape]")
        span = self.span(layer, plan, first, int(states.shape[1]))
        self.write_states(layer, name, span, states)
        return len(span.keep)

    def apply_copies(self, copies: Sequence[Any]) -> None:
        """Perform ``commit(step, accepted)``'s slot copies ``[src, dst]`` of every State layer,
        in order (entries of other layers are ignored). InvalidArgumentError: not one entry per
        layer, or a slot outside a layer's ``[0, D)``; nothing is copied on an error."""
        if len(copies) != self.cache.n_layers:
            raise InvalidArgumentError(f"copies: {len(copies)} entries, one per layer ({self.cache.n_layers})")
        for layer, D in self._slots.items():
            for src, dst in copies[layer]:
                if not (0 <= src < D and 0 <= dst < D):
                    raise InvalidArgumentError(f"copy [{src}, {dst}] of layer {layer}: slots are [0, {D})")
        for layer in self._slots:
            for src, dst in copies[layer]:
                for name in self._tensors[layer]:
                    self.slot(layer, name, int(dst)).copy_(self.slot(layer, name, int(src)))

    def map_batch(self, layer: int, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """Replace every state tensor of ``layer`` by ``fn`` applied along the batch (beam search
        reorders, ``repeat_interleave``, selections): ``fn`` gets and returns batch-first tensors."""
        named = self._tensors[self._check_layer(layer)]
        for name, t in list(named.items()):
            if self.batch_first:
                named[name] = fn(t)
            else:
                named[name] = fn(t.transpose(0, 1)).transpose(0, 1).contiguous()

    def zero(self) -> None:
        """Zero every slot (the tensors stay allocated)."""
        for named in self._tensors.values():
            for t in named.values():
                t.zero_()

    def release(self) -> None:
        """Drop every tensor (the next write allocates again)."""
        self._tensors = {i: {} for i in self._slots}

    # --- checks ------------------------------------------------------------------------

    def _check_layer(self, layer: int) -> int:
        if layer not in self._slots:
            raise InvalidArgumentError(
                f"layer = {layer}: not a State layer of the cache (its State layers: {list(self._slots)})"
            )
        return layer

    def _read_slot(self, span: SlotSpan) -> int:
        if span.read is None:
            raise InvalidArgumentError(
                f"position = {span.first}: layer {span.layer}'s plan does not keep the state after {span.first - 1} "
                f"(a step begun without verify keeps only its last)"
            )
        return span.read

    def _stored(self, layer: int, name: str) -> torch.Tensor:
        t = self._tensors[self._check_layer(layer)].get(name)
        if t is None:
            raise InvalidStateError(f"layer {layer} holds no state {name!r} yet (its first write allocates it)")
        return t

    def _check_plan(self, layer: int, plan: SeqStepPlan) -> None:
        self._check_layer(layer)
        step = self.cache.active_step
        if step is None or not step.is_current or step.plan(layer) != plan:
            raise InvalidStateError(f"plan of layer {layer}: not the layer's plan of the cache's begun step (stale)")

    def _step_span(self) -> tuple[int, int]:
        step = self.cache.active_step
        assert step is not None  # _check_plan
        return int(step.position), int(step.T)

    def _check_like(self, layer: int, name: str, t: torch.Tensor, one: torch.Tensor) -> None:
        check_like(layer, name, t[:, 0] if self.batch_first else t[0], one)

    def _allocate(self, layer: int, name: str, one: torch.Tensor) -> torch.Tensor:
        D = self._slots[layer]
        shape = (one.shape[0], D, *one.shape[1:]) if self.batch_first else (D, *one.shape)
        t = torch.zeros(shape, dtype=one.dtype, device=one.device)
        self._tensors[layer][name] = t
        return t


__all__ = ["SlotSpan", "TorchStateSlots", "check_like", "plan_slot"]

