"""Running tiny random transformers models, for the KVCoreCache tests (test_transformers_cache.py,
test_transformers_kinds.py, test_transformers_state.py, test_transformers_trees.py): each test
module builds its own models from configs (no download) and compares a run through a
``KVCoreCache`` with transformers' own cache on the same prompt.

Import it after ``need("torch")`` and ``need("transformers")`` (needs.py): it needs torch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pytest
import torch


def random_prompt(n: int, seed: int = 1, batch: int = 1, *, vocab: int) -> torch.Tensor:
    """``[batch, n]`` token ids drawn from ``3..vocab-1`` (past the pad, eos and bos ids), seeded."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (batch, n), generator=g)


def generate(model: Any, ids: torch.Tensor, n: int, **kwargs: Any) -> Any:
    """``model.generate`` of exactly ``n`` new tokens (no early eos), with its logits, without gradients."""
    with torch.no_grad():
        return model.generate(ids, max_new_tokens=n, min_new_tokens=n, output_logits=True, return_dict_in_generate=True,
                              **kwargs)  # fmt: skip


def greedy(model: Any, ids: torch.Tensor, n: int, **kwargs: Any) -> Any:
    """``generate`` without sampling."""
    return generate(model, ids, n, do_sample=False, **kwargs)


def max_diff(a: tuple[torch.Tensor, ...], b: tuple[torch.Tensor, ...]) -> float:
    """The largest absolute difference between two runs' per-step logits (as many steps each)."""
    assert len(a) == len(b)
    return max(float((x - y).abs().max()) for x, y in zip(a, b))


def no_eos(model: Any) -> Any:
    """The model, its generation running its full length: random models hit their eos id early."""
    model.generation_config.eos_token_id = None
    return model


def model_fixture(models: Mapping[str, Callable[[], Any]], name: str = "model") -> Any:
    """A module-scoped fixture ``name`` running each test once per model of ``models`` (name: builder);
    assign it to a module variable of that name in the test module."""

    @pytest.fixture(scope="module", params=sorted(models), name=name)
    def model(request: pytest.FixtureRequest) -> Any:
        return models[request.param]()

    return model
