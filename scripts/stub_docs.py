"""Copies the compiled module's docstrings into its stubs, so editors show them.

pybind11 puts each docstring on the runtime object; an editor reads
python/kvcore/_core.pyi instead. This script gives every class, function,
method and property of the stubs the docstring of the object it stands for
(minus the signature lines pybind11 writes; an overloaded method's text on its
first @overload only), and leaves the rest of the file as it is.

    python scripts/stub_docs.py           rewrite python/kvcore/_core.pyi
    python scripts/stub_docs.py --check   exit 1 naming every stale docstring

Run it against the kvcore being developed (scripts/dev.sh stages one).
tests/python/test_docstrings.py runs the check.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import re
import sys
import textwrap
from pathlib import Path
from typing import Any, Union

STUBS = Path(__file__).resolve().parents[1] / "python" / "kvcore" / "_core.pyi"
WIDTH = 100


# Dunders whose meaning is the protocol's; these three say something of their own.
DOCUMENTED_DUNDERS = {"__init__", "__copy__", "__deepcopy__"}


def own_paragraphs(obj: Any, name: str = "") -> list[str]:
    """The paragraphs of obj's docstring that are not pybind11's signature lines
    ("name(self: T, x: int) -> R", numbered when overloaded); name defaults to
    obj's."""
    doc = inspect.getdoc(obj) or ""
    name = name or getattr(obj, "__name__", "")
    kept = []
    for paragraph in re.split(r"\n\s*\n", doc):
        line = paragraph.strip()
        # A call signature alone ("(self: T) -> R" for a property's getter).
        signature = re.fullmatch(rf"(\d+\. )?({re.escape(name)})?\(.*\)( -> [^:]*)?", line, re.S) is not None
        if line and not signature and line != "Overloaded function.":
            kept.append(line)
    return kept


def _runtime(module: Any, path: list[str]) -> Any:
    """The object a stub definition stands for (a property itself, not its getter)."""
    obj = module
    for i, name in enumerate(path):
        owner = obj
        obj = vars(owner).get(name) if inspect.isclass(owner) else getattr(owner, name, None)
        if obj is None and inspect.isclass(owner):  # inherited: document it where it is defined
            obj = getattr(owner, name, None)
        if isinstance(obj, (staticmethod, classmethod)):
            obj = obj.__func__
        if obj is None:
            raise LookupError(f"_core.pyi names {'.'.join(path[: i + 1])}, which kvcore._core does not have")
    return obj


def _docstring_literal(paragraphs: list[str], indent: str) -> str:
    """A triple-quoted docstring at indent, paragraphs wrapped at WIDTH columns."""
    text = "\n\n".join(" ".join(p.split()) for p in paragraphs).replace("\\", "\\\\").replace('"""', '\\"""')
    if "\n" not in text and len(indent) + len(text) + 6 <= WIDTH:
        return f'{indent}"""{text}"""'
    wrapped = [
        textwrap.fill(p, WIDTH, break_on_hyphens=False, initial_indent=indent + ('"""' if i == 0 else ""), subsequent_indent=indent)
        for i, p in enumerate(text.split("\n\n"))
    ]
    return "\n\n".join(wrapped) + f'\n{indent}"""'


Definition = Union[ast.ClassDef, ast.FunctionDef]


def _definitions(tree: ast.Module) -> list[tuple[list[str], Definition]]:
    """Every public class and every function definition, each with its dotted path
    of class names."""
    found: list[tuple[list[str], Definition]] = []

    def walk(body: list[ast.stmt], path: list[str]) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                found.append(([*path, node.name], node))
                walk(node.body, [*path, node.name])
            elif isinstance(node, ast.FunctionDef):
                found.append(([*path, node.name], node))

    walk(tree.body, [])
    return found


def _normalized(docstring: str) -> str:
    """Paragraphs with their whitespace collapsed: how two docstrings are compared."""
    return "\n\n".join(" ".join(p.split()) for p in docstring.split("\n\n"))


def _class_edit(node: ast.ClassDef, lines: list[str], literal: str) -> tuple[int, int, list[str]]:
    """(start, end, replacement) of `lines` that gives the class the docstring
    `literal`: its docstring statement replaced, or a new one put before its body."""
    first = node.body[0]
    if ast.get_docstring(node) is not None:
        return first.lineno - 1, first.end_lineno or first.lineno, [literal]
    header = lines[first.lineno - 1].encode()[: first.col_offset].decode()
    if header.strip():  # `class C(...): ...`, all on the header's last line
        body = lines[first.lineno - 1].encode()[first.col_offset :].decode().strip()
        kept = [] if body == "..." else [" " * (node.col_offset + 4) + body]
        return node.lineno - 1, first.lineno, [*lines[node.lineno - 1 : first.lineno - 1], header.rstrip(), literal, *kept]
    top = min([first.lineno, *(d.lineno for d in getattr(first, "decorator_list", []))])
    return top - 1, top - 1, [literal, ""]


def updated_stubs(source: str) -> tuple[str, list[str]]:
    """source with every definition's docstring taken from kvcore._core, and the
    dotted names of the definitions whose docstring changed."""
    module = importlib.import_module("kvcore._core")
    lines = source.split("\n")
    changed: list[str] = []
    edits = []
    seen: set[tuple[str, ...]] = set()
    for path, node in _definitions(ast.parse(source)):
        if path[-1].startswith("__") and path[-1] not in DOCUMENTED_DUNDERS:
            continue
        if tuple(path) in seen:  # a later @overload: the first one carries the docstring, once
            if isinstance(node, ast.FunctionDef) and ast.get_docstring(node) is not None:
                changed.append(".".join(path))
                doc = node.body[0]
                indent = " " * (node.col_offset + 4)
                keep = [] if len(node.body) > 1 else [indent + "..."]
                edits.append((doc.lineno - 1, doc.end_lineno or doc.lineno, keep))
            continue
        seen.add(tuple(path))
        paragraphs = own_paragraphs(_runtime(module, path), path[-1])
        if not paragraphs:
            continue  # a protocol dunder: its meaning is the protocol's
        wanted = "\n\n".join(" ".join(p.split()) for p in paragraphs)
        have = ast.get_docstring(node)
        if have is not None and _normalized(have) == wanted:
            continue
        changed.append(".".join(path))
        indent = " " * (node.col_offset + 4)
        if isinstance(node, ast.ClassDef):
            edits.append(_class_edit(node, lines, _docstring_literal(paragraphs, indent)))
            continue
        first = node.body[0]
        # The signature: from the `def` line up to the body (col_offset counts UTF-8 bytes).
        before = lines[first.lineno - 1].encode()[: first.col_offset].decode()
        if before.strip():  # the body starts on the signature's last line: `) -> R: ...`
            head = [*lines[node.lineno - 1 : first.lineno - 1], before.rstrip()]
        else:
            head = lines[node.lineno - 1 : first.lineno - 1]
        edits.append((node.lineno - 1, node.end_lineno or node.lineno, [*head, _docstring_literal(paragraphs, indent)]))
    for start, end, replacement in sorted(edits, reverse=True):
        lines[start:end] = replacement
    return "\n".join(lines), changed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a docstring is stale")
    args = parser.parse_args()
    source = STUBS.read_text()
    new, changed = updated_stubs(source)
    if args.check:
        for name in changed:
            print(f"{STUBS.name}: {name}: docstring differs from kvcore._core's", file=sys.stderr)
        return 1 if changed else 0
    STUBS.write_text(new)
    print(f"{STUBS.name}: {len(changed)} docstrings updated")
    return 0


if __name__ == "__main__":
    sys.exit(main())
