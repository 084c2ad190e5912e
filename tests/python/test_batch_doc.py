"""docs/batch.md's Python examples run, and the results their comments state hold.

Every ```python block of the page runs on its own, statement by statement, in
a fresh namespace. A top-level statement whose last line ends in `# -> RESULT`
states a result: for an expression, its value; for an assignment, the value it
assigned. RESULT is a Python expression evaluated in the same namespace, and
the two must be equal (numpy arrays compare as lists). A `# ->` comment
anywhere else (inside a loop, a function, a continued line) is refused, so no
stated result goes unchecked.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "batch.md"
CLAIM = re.compile(r"#\s*->\s*(.+?)\s*$")


def python_blocks() -> list[tuple[int, str]]:
    """(first line number in the page, source) of every ```python block."""
    text = DOC.read_text()
    return [(text.count("\n", 0, m.start(1)) + 1, m.group(1))
            for m in re.finditer(r"^```python\n(.*?)^```", text, flags=re.S | re.M)]


def plain(value: Any) -> Any:
    """numpy arrays and scalars as Python lists and numbers, tuples and lists alike."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, (tuple, list)):
        return [plain(v) for v in value]
    return value


def assigned(target: ast.expr, scope: dict[str, Any]) -> Any:
    if isinstance(target, ast.Name):
        return scope[target.id]
    if isinstance(target, ast.Tuple):
        return tuple(assigned(t, scope) for t in target.elts)
    raise AssertionError(f"a stated result after assigning to {ast.dump(target)}: assign to names only")


def run_block(first_line: int, source: str) -> int:
    """Runs one block statement by statement, checking every stated result; returns how many."""
    lines = source.splitlines()
    tree = ast.parse(source, filename=f"docs/batch.md:{first_line}")
    scope: dict[str, Any] = {"__name__": "batch_doc"}
    checked: set[int] = set()
    for stmt in tree.body:
        end = stmt.end_lineno or stmt.lineno
        claim = CLAIM.search(lines[end - 1])
        where = f"docs/batch.md:{first_line + end - 1}"
        if claim is not None and isinstance(stmt, ast.Expr):
            value = eval(compile(ast.Expression(stmt.value), where, "eval"), scope)
        else:
            exec(compile(ast.Module(body=[stmt], type_ignores=[]), where, "exec"), scope)
            if claim is None:
                continue
            assert isinstance(stmt, ast.Assign) and len(stmt.targets) == 1, f"{where}: state results of expressions or assignments"
            value = assigned(stmt.targets[0], scope)
        expected = eval(claim.group(1), scope)
        assert plain(value) == plain(expected), f"{where}: got {value!r}, the page says {claim.group(1)}"
        checked.add(end)
    stated = {n for n, line in enumerate(lines, start=1) if CLAIM.search(line)}
    unchecked = sorted(first_line + n - 1 for n in stated - checked)
    assert not unchecked, f"results stated where the test cannot check them (docs/batch.md lines {unchecked})"
    return len(checked)


BLOCKS = python_blocks()


def test_the_page_has_its_examples() -> None:
    assert len(BLOCKS) >= 3
    assert any("cache.fork(" in source and "cache.rewind(" in source and "cache.remove(" in source
               and "adopt_prefix(" in source and "release_sequence(" in source for _, source in BLOCKS)


@pytest.mark.parametrize("first_line, source", BLOCKS, ids=[f"line{n}" for n, _ in BLOCKS])
def test_block_runs_and_its_stated_results_hold(first_line: int, source: str) -> None:
    assert run_block(first_line, source) >= 1, "each example states at least one result"


def anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces to hyphens."""
    headings = re.findall(r"^#+ (.+)$", page.read_text(), flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def test_links_to_other_pages_and_their_sections_resolve() -> None:
    links = re.findall(r"\]\(([^)#\s]+\.md)(?:#([^)\s]+))?\)", DOC.read_text())
    assert links
    for target, anchor in links:
        page = DOC.parent / target
        assert page.is_file(), f"docs/batch.md links to a missing page: {target}"
        assert not anchor or anchor in anchors(page), f"docs/batch.md links to a missing section: {target}#{anchor}"
