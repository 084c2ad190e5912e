"""Draft trees through transformers with KVCoreCache (begin_tree, verify_tree, commit_tree).

Tiny random Gemma 2 / Gemma 3 models (window 8, built from configs). A tree's logits
must equal, node by node, a no-cache forward over the history and that node's root
path; after commit_tree (row copies off the main line included) decoding continues
exactly as if the accepted tokens had been fed as a chain, past the window's wrap.
"""

from __future__ import annotations

from typing import Any

import pytest
from needs import need

torch = need("torch", reason="the transformers integration needs torch")
need("transformers", reason="the transformers integration needs transformers")

import kvcore  # noqa: E402
from kvcore.integrations.transformers import KVCoreCache, prefill, verify_tree  # noqa: E402
from hf_generate import model_fixture  # noqa: E402
from test_transformers_cache import MODELS, TOL, VOCAB  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PARENTS = [-1, 0, 0, 1, 2, 3]  # main line 0 1 3 5; 2 4 beside it


def root_path(parents: list[int], node: int) -> list[int]:
    path = []
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]


def no_cache_logits(model: Any, ids: list[int]) -> Any:
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids]), use_cache=False).logits[0, -1].float()


model = model_fixture(MODELS)


@pytest.mark.parametrize("path_end", [5, 4], ids=["main-line", "off-main-line"])
def test_tree_logits_and_commit_equal_recomputation_after_the_window_wraps(model: Any, path_end: int) -> None:
    g = torch.Generator().manual_seed(3)
    history = torch.randint(0, VOCAB, (1, 13), generator=g).tolist()[0]  # past the window of 8
    tokens = torch.randint(0, VOCAB, (len(PARENTS),), generator=g).tolist()
    cache = KVCoreCache(model.config, max_step=6, capacity=64)
    with torch.no_grad():
        prefill(model, cache, torch.tensor([history]))
        rows = verify_tree(model, cache, tokens, PARENTS)
    assert cache.get_seq_length() == len(history)  # verified, not committed
    for node in range(len(PARENTS)):
        ids = history + [tokens[i] for i in root_path(PARENTS, node)]
        assert float((rows[node] - no_cache_logits(model, ids)).abs().max()) <= TOL, node
    path = root_path(PARENTS, path_end)
    cache.commit_tree(path)
    accepted = history + [tokens[i] for i in path]
    assert cache.get_seq_length() == len(accepted)
    on_main_line = path == [0, 1, 3, 5][: len(path)]  # node 0, its first child, that child's first child...
    assert (cache.sequence.commit_copies()[0].shape[0] > 0) == (not on_main_line)
    # Decoding continues exactly: the next tokens' logits equal recomputation without cache.
    more = torch.randint(0, VOCAB, (10,), generator=g).tolist()
    for t in more:
        accepted.append(t)
        with torch.no_grad():
            out = prefill(model, cache, torch.tensor([[t]])).logits[0, -1].float()
        assert float((out - no_cache_logits(model, accepted)).abs().max()) <= TOL


def test_tree_misuse_is_refused_and_changes_nothing(model: Any) -> None:
    cache = KVCoreCache(model.config, max_step=4, capacity=32)
    with torch.no_grad():
        prefill(model, cache, torch.tensor([[1, 2, 3]]))
        with pytest.raises(kvcore.InvalidStateError, match="no verified draft tree"):
            cache.commit_tree([0])
        with pytest.raises(kvcore.InvalidArgumentError, match="5 tokens for 4 parents"):
            verify_tree(model, cache, [1, 2, 3, 4, 5], [-1, 0, 0, 1])
        with pytest.raises(kvcore.InvalidArgumentError, match="must be <= max_step = 4"):
            verify_tree(model, cache, [1] * 5, [-1, 0, 1, 2, 3])
        verify_tree(model, cache, [4, 5, 6], [-1, 0, 0])
        # A verified tree must be committed (or discarded) before another forward.
        with pytest.raises(kvcore.InvalidStateError, match="commit_tree"):
            prefill(model, cache, torch.tensor([[7]]))
        with pytest.raises(kvcore.InvalidArgumentError):
            cache.commit_tree([0, 2, 1])  # not a root path
        assert cache.get_seq_length() == 3
        cache.discard_forward()  # drops the tree: the length stays, a chain forward runs
        out = prefill(model, cache, torch.tensor([[7]])).logits[0, -1].float()
    assert cache.get_seq_length() == 4
    assert float((out - no_cache_logits(model, [1, 2, 3, 7])).abs().max()) <= TOL


def test_a_commit_off_the_main_line_without_its_row_copies_is_caught(
    model: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check above sees a missing copy: with apply_copies disabled, the next logits differ."""
    g = torch.Generator().manual_seed(5)
    history = torch.randint(0, VOCAB, (12,), generator=g).tolist()
    tokens = torch.randint(0, VOCAB, (len(PARENTS),), generator=g).tolist()
    cache = KVCoreCache(model.config, max_step=6, capacity=64)
    monkeypatch.setattr(cache.pool, "apply_copies", lambda copies: None)
    path = root_path(PARENTS, 4)  # 0 2 4: off the main line
    with torch.no_grad():
        prefill(model, cache, torch.tensor([history]))
        verify_tree(model, cache, tokens, PARENTS)
        cache.commit_tree(path)
        out = prefill(model, cache, torch.tensor([[9]])).logits[0, -1].float()
    want = no_cache_logits(model, history + [tokens[i] for i in path] + [9])
    assert float((out - want).abs().max()) > 100 * TOL
