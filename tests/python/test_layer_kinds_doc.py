"""docs/layer_kinds.md's Python examples run, and the results their comments
state hold (doc_examples.py says how results are stated)."""

from __future__ import annotations

import pytest

from doc_examples import DOCS, broken_links, python_blocks, run_block

DOC = DOCS / "layer_kinds.md"
BLOCKS = python_blocks(DOC)


def test_the_page_shows_every_kind() -> None:
    sources = "".join(source for _, source in BLOCKS)
    for call in ("Chunked(", "Shared(", "State(", "verify=True", "begin_tree(", "can_rewind("):
        assert call in sources, call


@pytest.mark.parametrize("first_line, source", BLOCKS, ids=[f"line{n}" for n, _ in BLOCKS])
def test_block_runs_and_its_stated_results_hold(first_line: int, source: str) -> None:
    assert run_block(DOC, first_line, source) >= 1, "each example states at least one result"


def test_links_to_other_pages_and_their_sections_resolve() -> None:
    assert not broken_links(DOC)
