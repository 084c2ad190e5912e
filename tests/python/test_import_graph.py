"""The import graph of python/kvcore and python/kvcore_demo: no cycle, no private name imported
across modules, and the core package reaching the demos only from its command line.

Every module's imports are read with ``ast`` (module level, ``if TYPE_CHECKING`` blocks and
imports inside functions alike: a deferred import is still an edge). ``from pkg import sub``
where ``sub`` is a module is an edge to that module; any other ``from mod import name`` an
edge to ``mod``. A cycle fails, so does importing a name with a leading underscore from
another module, except the package's lowest layer: the compiled core (``kvcore._core``)
and the private modules holding what every layer shares (``kvcore._errors``,
``kvcore._paths``, ``kvcore._argparse``), whose names are imported by module.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "python"
PACKAGE = ROOT / "kvcore"
DEMO = ROOT / "kvcore_demo"
LOWEST = {"kvcore._core", "kvcore._errors", "kvcore._paths", "kvcore._argparse"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted([*PACKAGE.rglob("*.py"), *DEMO.rglob("*.py")])}
OURS = ("kvcore", "kvcore_demo")


def imports(name: str) -> list[tuple[str, str, int]]:
    """(imported module, imported name or "", line) for every import in module ``name`` of kvcore."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(alias.name, "", node.lineno) for alias in node.names if alias.name.split(".")[0] in OURS]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolved against the package
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            if base.split(".")[0] not in OURS:
                continue
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                out.append((sub, "", node.lineno) if sub in MODULES or sub in LOWEST else (base, alias.name, node.lineno))
    return out


def graph() -> dict[str, set[str]]:
    return {m: {target for target, _, _ in imports(m) if target in MODULES and target != m} for m in MODULES}


def find_cycle(edges: dict[str, set[str]]) -> list[str]:
    """One cycle of ``edges`` as a path [a, b, ..., a], or [] when there is none."""
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(m: str) -> list[str]:
        state[m] = 1
        path.append(m)
        for n in sorted(edges[m]):
            if state.get(n) == 1:
                return path[path.index(n) :] + [n]
            if n not in state:
                found = visit(n)
                if found:
                    return found
        state[m] = 2
        path.pop()
        return []

    for m in sorted(edges):
        if m not in state:
            found = visit(m)
            if found:
                return found
    return []


def test_the_graph_is_read() -> None:
    edges = graph()
    assert len(MODULES) > 30
    assert "kvcore.torch.pool_records" in edges["kvcore.torch.pool"]
    assert "kvcore.integrations.transformers_batch" in edges["kvcore.integrations.transformers"]  # its __getattr__
    assert "kvcore.integrations.transformers_layers" in edges["kvcore.integrations.transformers"]  # re-exported


def test_the_core_imports_no_demo() -> None:
    """kvcore_demo sits above the core package (issue 41 item 6): no module of kvcore imports it
    but its deprecated path ``kvcore.demo``; the command line names it (``kvcore demo`` runs
    ``kvcore_demo.command``), and no other module does."""
    bad = [f"{m}:{line} imports {target}" for m in MODULES if m.split(".")[0] == "kvcore" and m != "kvcore.demo"
           for target, _, line in imports(m) if target.split(".")[0] == "kvcore_demo"]
    assert not bad, "\n".join(bad)
    assert "kvcore_demo" in {t.split(".")[0] for t, _, _ in imports("kvcore.demo")}  # the rule reads the edge
    naming = sorted(m for m in MODULES if m.split(".")[0] == "kvcore" and m != "kvcore.demo"
                    and '"kvcore_demo.' in MODULES[m].read_text())
    assert naming == ["kvcore.cli"], naming


def test_no_import_cycle() -> None:
    cycle = find_cycle(graph())
    assert not cycle, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_one() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) == []


def test_no_private_name_is_imported_across_modules() -> None:
    bad = []
    for m in MODULES:
        for target, name, line in imports(m):
            private_module = any(part.startswith("_") and part != "__init__" for part in target.split("."))
            if private_module and target not in LOWEST:
                bad.append(f"{m}:{line} imports the private module {target}")
            if name.startswith("_") and target not in LOWEST - {"kvcore._errors", "kvcore._paths", "kvcore._argparse"}:
                bad.append(f"{m}:{line} imports the private name {target}.{name}")
    assert not bad, "\n".join(bad)


def test_state_imports_no_byte_layer_above_the_core() -> None:
    """kvcore.state reaches byte layers through SequencePool: it imports nothing of kvcore but the
    lowest layer and leaves that import nothing else (kvcore.quantized: the formats' row sizes)."""
    leaves = {m for m in MODULES if {t for t, _, _ in imports(m)} <= LOWEST}
    assert "kvcore.quantized" in leaves
    assert {t for t, _, _ in imports("kvcore.state")} <= LOWEST | leaves


# --- the prefix rule (issue 41) ----------------------------------------------------------

NEEDS = ("torch", "transformers")


def libraries(name: str) -> dict[str, bool]:
    """torch / transformers as module ``name`` imports them: {library: imported at module level}
    (False: only inside functions)."""
    tree = ast.parse(MODULES[name].read_text(), str(MODULES[name]))
    found: dict[str, bool] = {}

    def visit(node: ast.AST, in_function: bool) -> None:
        roots = []
        if isinstance(node, ast.Import):
            roots = [alias.name.split(".")[0] for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            roots = [(node.module or "").split(".")[0]]
        for root in roots:
            if root in NEEDS:
                found[root] = found.get(root, False) or not in_function
        inner = in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        for child in ast.iter_child_nodes(node):
            visit(child, inner)

    visit(tree, False)
    return found


def test_what_imports_torch_or_transformers_says_so_in_its_path() -> None:
    """A module that imports torch or transformers has "torch" or "transformers" in its dotted path
    (kvcore.torch.*, kvcore.integrations.transformers_*; ExecuTorch is torch's runtime), and what
    reads config files only does not: kvcore.hf_config imports neither. The demos' imports inside
    functions (the real-model demos, on request) are theirs to make: they leave the core package
    with issue 41's item 6."""
    bad = []
    for m in MODULES:
        found = libraries(m)
        if m.startswith("kvcore_demo."):
            found = {lib: top for lib, top in found.items() if top}
        if found and not any(word in m for word in NEEDS):
            bad.append(f"{m} imports {sorted(found)}")
    assert not bad, "\n".join(bad)
    config_readers = [m for m in MODULES if m.split(".")[:2] == ["kvcore", "hf_config"]]
    assert len(config_readers) > 5
    assert not [m for m in config_readers if libraries(m) or any(word in m for word in NEEDS)]
    assert libraries("kvcore.integrations.transformers_config") == {"transformers": True}  # was hf_layers
    assert libraries("kvcore.integrations.transformers_models") == {"torch": False, "transformers": False}  # the rule reads both
