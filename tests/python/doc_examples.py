"""Runs a docs page's Python examples and checks the results their comments state.

Every ```python block of a page runs on its own, statement by statement, in
a fresh namespace. A top-level statement whose last line ends in `# -> RESULT`
states a result: for an expression, its value; for an assignment, the value it
assigned. RESULT is a Python expression evaluated in the same namespace, and
the two must be equal (numpy arrays compare as lists). A `# ->` comment
anywhere else (inside a loop, a function, a continued line) is refused, so no
stated result goes unchecked. Used by test_batch_doc.py and
test_layer_kinds_doc.py.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

DOCS = Path(__file__).resolve().parents[2] / "docs"
CLAIM = re.compile(r"#\s*->\s*(.+?)\s*$")


def python_blocks(page: Path) -> list[tuple[int, str]]:
    """(first line number in the page, source) of every ```python block."""
    text = page.read_text()
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


def run_block(page: Path, first_line: int, source: str) -> int:
    """Runs one block statement by statement, checking every stated result; returns how many."""
    name = f"docs/{page.name}"
    lines = source.splitlines()
    tree = ast.parse(source, filename=f"{name}:{first_line}")
    scope: dict[str, Any] = {"__name__": "doc_example"}
    checked: set[int] = set()
    for stmt in tree.body:
        end = stmt.end_lineno or stmt.lineno
        claim = CLAIM.search(lines[end - 1])
        where = f"{name}:{first_line + end - 1}"
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
    assert not unchecked, f"results stated where the test cannot check them ({name} lines {unchecked})"
    return len(checked)


def anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces to hyphens."""
    headings = re.findall(r"^#+ (.+)$", page.read_text(), flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def broken_links(page: Path) -> list[str]:
    """The links of `page` to other pages (and their sections) that do not resolve."""
    bad = []
    for target, anchor in re.findall(r"\]\(([^)#\s]+\.md)(?:#([^)\s]+))?\)", page.read_text()):
        other = page.parent / target
        if not other.is_file():
            bad.append(target)
        elif anchor and anchor not in anchors(other):
            bad.append(f"{target}#{anchor}")
    return bad
