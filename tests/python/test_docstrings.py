"""help() is useful: every public class, function, method and property of the
kvcore package (the compiled classes included) says what it does in its own
words, beyond the signature pybind11 writes (constructors included); the stubs
carry the same docstrings, so an editor shows them."""

from __future__ import annotations

import ast
import importlib.util
import inspect
from pathlib import Path
from typing import Any

import pytest

import kvcore
from kvcore import registry

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("stub_docs", ROOT / "scripts" / "stub_docs.py")
assert _spec is not None and _spec.loader is not None
stub_docs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(stub_docs)

# Dunders whose meaning is the protocol's: their docstring is the protocol's.
PROTOCOL = {"__eq__", "__hash__", "__iter__", "__repr__", "__enter__", "__exit__"}


def own_words(obj: Any, name: str = "") -> str:
    """The docstring minus the signature paragraphs pybind11 writes (a property's
    getter has only its signature)."""
    return " ".join(stub_docs.own_paragraphs(obj, name))


def public_members(cls: type) -> list[tuple[str, Any]]:
    out = []
    for name, member in vars(cls).items():
        if name.startswith("_") and name not in ("__init__", "__copy__", "__deepcopy__"):
            continue
        if name in PROTOCOL:
            continue
        out.append((name, member))
    return out


CLASSES = sorted(
    {getattr(kvcore, name) for name in kvcore.__all__ if inspect.isclass(getattr(kvcore, name))},
    key=lambda c: c.__name__,
)


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_every_public_class_and_member_explains_itself(cls: type) -> None:
    assert own_words(cls), f"{cls.__name__} has no docstring"
    missing = []
    for name, member in public_members(cls):
        if not own_words(member, name):
            missing.append(name)
    assert not missing, f"{cls.__name__}: members without a docstring: {missing}"


def test_every_public_function_explains_itself() -> None:
    functions = [getattr(kvcore, n) for n in kvcore.__all__ if callable(getattr(kvcore, n))]
    functions += [getattr(registry, n) for n in dir(registry) if not n.startswith("_") and inspect.isfunction(getattr(registry, n))]
    missing = [f.__name__ for f in functions if not inspect.isclass(f) and not own_words(f)]
    assert not missing, f"functions without a docstring: {missing}"


def test_the_stubs_give_every_class_a_docstring() -> None:
    tree = ast.parse((ROOT / "python" / "kvcore" / "_core.pyi").read_text())
    missing = [
        node.name
        for node in tree.body
        if isinstance(node, ast.ClassDef) and not node.name.startswith("_") and not ast.get_docstring(node)
    ]
    assert not missing, f"_core.pyi classes without a docstring: {missing}"


def test_the_stubs_carry_every_docstring_of_the_compiled_module() -> None:
    """An editor reads _core.pyi: each function, method and property there has the
    runtime's docstring (python scripts/stub_docs.py copies them)."""
    _, stale = stub_docs.updated_stubs((ROOT / "python" / "kvcore" / "_core.pyi").read_text())
    assert not stale, f"_core.pyi docstrings that differ from kvcore._core's (run scripts/stub_docs.py): {stale}"


def test_an_overloaded_method_carries_its_docstring_once() -> None:
    """The first @overload of a stub carries the text; stub_docs.py strips a copy from the next."""
    source = (
        "class Step:\n"
        "    @overload\n"
        "    def commit(self) -> None:\n"
        "        \"\"\"old\"\"\"\n"
        "    @overload\n"
        "    def commit(self, accepted: list[int]) -> list[int]:\n"
        "        \"\"\"a copy\"\"\"\n"
    )
    new, changed = stub_docs.updated_stubs(source)
    assert changed == ["Step", "Step.commit", "Step.commit"]  # the class had none
    tree = ast.parse(new)
    first, second = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]
    want = "\n\n".join(" ".join(p.split()) for p in stub_docs.own_paragraphs(kvcore.Step.commit, "commit"))
    assert stub_docs._normalized(ast.get_docstring(first) or "") == want
    assert ast.get_docstring(second) is None
    _, again = stub_docs.updated_stubs(new)
    assert again == []


def test_help_of_the_caches_names_their_errors() -> None:
    for cls in (kvcore.SequenceCache, kvcore.KVPool, kvcore.BatchCache):
        text = own_words(cls) + " ".join(own_words(m, n) for n, m in public_members(cls))
        assert "Error" in text, f"help({cls.__name__}) names no error"
