"""A cheap drafter made from a real transformers model: its own first layers (early exit).

``shallow_model(model, k)`` is the model cut after its first ``k`` decoder layers, its
final norm and (tied) LM head kept, every weight shared with the model (nothing
copied, nothing trained: LayerSkip and Draft & Verify draft this way).
``HFEarlyExitDrafter`` runs it greedily through a ``KVCoreCache`` of its own over the
tokens the target committed, rewinding to what they share and feeding the rest, as
``kvcore_demo.early_exit.EarlyExitDrafter`` does for the random model. It never sees
the target's logits. On Gemma 3 270M the LM head (262,144 x 640) is most of a
one-token forward, so a shallow forward costs far more than ``k / layers`` of a
full one: the drafter is a measure of acceptance, not of speed.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any


def shallow_model(model: Any, layers: int) -> Any:
    """`model` (a transformers ``*ForCausalLM`` whose decoder is ``model.model`` with
    ``layers`` and a config with ``num_hidden_layers``/``layer_types``) cut after its
    first `layers` layers: a new module object sharing every weight tensor, with a
    config of its own. Raises ValueError unless 1 <= layers <= the model's layers."""
    import torch

    n = int(model.config.num_hidden_layers)
    if not 1 <= layers <= n:
        raise ValueError(f"draft layers = {layers}: must be in [1, {n}]")
    config = copy.deepcopy(model.config)
    config.num_hidden_layers = layers
    if getattr(config, "layer_types", None) is not None:
        config.layer_types = list(config.layer_types[:layers])
    inner = copy.copy(model.model)
    inner._modules = dict(model.model._modules)  # a module's children live in _modules: copy the dict
    inner.layers = torch.nn.ModuleList(list(model.model.layers[:layers]))
    inner.config = config
    outer = copy.copy(model)
    outer._modules = dict(model._modules)
    outer.model = inner
    outer.config = config
    return outer


class HFEarlyExitDrafter:
    """Drafts from the first `layers` layers of a transformers `model` through a
    ``KVCoreCache`` of its own (`capacity` positions, forwards of at most `max_step`
    tokens, compact rings). Raises ValueError for a depth outside the model's layers."""

    def __init__(self, model: Any, layers: int, capacity: int, max_step: int) -> None:
        from kvcore.integrations.transformers import KVCoreCache

        self.model = shallow_model(model, layers)
        self.layers = layers
        self.cache = KVCoreCache(self.model.config, max_step=max_step, capacity=capacity, mirror_rings=False)
        self.held: list[int] = []  # the tokens the drafter's cache holds, in order
        self.forwards = 0  # shallow forwards run (prefill chunks included)

    def _sync(self, context: Sequence[int]) -> Any:
        """Makes the cache hold exactly `context` (at least one token) and returns the float32
        logits row of its last token: rewinds to the longest common prefix (short of the last
        token, whose row is needed; to nothing when the rings no longer allow that rewind)
        and feeds the rest."""
        n = min(len(self.held), len(context) - 1)
        common = 0
        while common < n and self.held[common] == context[common]:
            common += 1
        if common < len(self.held):
            common = common if self.cache.can_rewind(common) else 0
            if common == 0:
                self.cache.reset()
            else:
                self.cache.rewind(common)
            del self.held[common:]
        return self._feed(context[common:])

    def _feed(self, tokens: Sequence[int]) -> Any:
        """Feeds `tokens` (at least one) in forwards of at most max_step; the logits row of the last."""
        import torch

        from kvcore.integrations.transformers import prefill

        C = self.cache.max_step
        self.forwards += (len(tokens) + C - 1) // C
        with torch.no_grad():
            out = prefill(self.model, self.cache, torch.tensor([list(tokens)]), logits_to_keep=1)
        self.held.extend(tokens)
        return out.logits[0, -1].float()

    def draft(self, context: Sequence[int], depth: int, width: int) -> tuple[list[int], list[list[int]]]:
        """(main, others) for the tokens after `context` (the committed tokens and the step's
        root): main[d] is the drafter's greedy token at depth d + 1 following main[:d],
        others[d] its next `width - 1` choices there, best first. `depth` >= 1 drafts cost
        `depth - 1` one-token shallow forwards after the sync."""
        import torch

        row = self._sync(context)
        main: list[int] = []
        others: list[list[int]] = []
        for d in range(depth):
            ranked = torch.topk(row, width).indices.tolist()
            main.append(int(ranked[0]))
            others.append([int(t) for t in ranked[1:]])
            if d + 1 < depth:
                row = self._feed(main[-1:])
        return main, others


__all__ = ["HFEarlyExitDrafter", "shallow_model"]
