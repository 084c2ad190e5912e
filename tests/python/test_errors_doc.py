"""docs/errors.md and the code agree.

Every error path that can be enumerated from the sources (each
KVCORE_CHECK_OR_RETURN_ERROR / Status::make / KVCORE_CHECK in the public C++
headers, each raise(...) / Status::make / type_error in the bindings, each
raise in kvcore.registry) must be documented by a row of the table whose
example message it produces and whose error code it returns; every documented
row must come from such a path (no stale rows) unless it documents a check
made by pybind11 or numpy; and every test a row names must exist (gtest
sources) or be collected (pytest).
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "errors.md"

STRING = r'"(?:[^"\\]|\\.)*"'
STRINGS = r"((?:" + STRING + r"\s*)+)"
PRINTF = re.compile(r"%[-+ #0]*(?:\*|\d+)?(?:\.(?:\*|\d+))?(?:hh|h|ll|l|z|j|t|L)?[diouxXeEfgGcsp]")
PY_ERROR_CODE = {
    "InvalidArgumentError": "InvalidArgument",
    "InvalidStateError": "InvalidState",
    "NotFoundError": "NotFound",
    "AlreadyRegisteredError": "RegistrationAlreadyRegistered",
    "CapacityError": "OutOfResources",
    "AllocationError": "MemoryAllocationFailed",
    "InternalError": "Internal",
    "NotSupportedError": "NotSupported",
}


@dataclass(frozen=True)
class Site:
    """One place in the sources that refuses or aborts, as a regex over its message."""

    where: str
    code: str  # an Error name, "abort" (KVCORE_CHECK) or a Python exception name
    pattern: str

    def matches(self, example: str) -> bool:
        return re.match(self.pattern, example) is not None


@dataclass(frozen=True)
class Row:
    line: int
    call: str
    code: str
    example: str  # "" for checks made by pybind11 or numpy
    tests: tuple[str, ...]
    unreachable: str


def unescape(literal: str) -> str:
    return bytes(literal[1:-1], "utf-8").decode("unicode_escape")


def joined(literals: str) -> str:
    return "".join(unescape(m) for m in re.findall(STRING, literals))


def from_printf(fmt: str) -> str:
    """A printf format as a regex; config.h's "layers[i]." prefix is optional
    because LayerConfig(...) reports a layer's error without it."""
    parts = [re.escape(p) for p in PRINTF.split(fmt)]
    pattern = ".*?".join(parts)
    return pattern.replace(re.escape("layers[") + ".*?" + re.escape("]."), r"(?:layers\[.*?\]\.)?", 1)


def from_pieces(pieces: list[str]) -> str:
    return "(?:.*?)".join(re.escape(p) for p in pieces) if pieces else ""


def balanced(src: str, start: int) -> int:
    """Index of the parenthesis closing the one opened just before `start`
    (parentheses inside string literals do not count)."""
    depth, i = 1, start
    while depth:
        if src[i] == '"':
            m = re.match(STRING, src[i:])
            assert m is not None
            i += len(m.group(0))
            continue
        depth += {"(": 1, ")": -1}.get(src[i], 0)
        i += 1
    return i - 1


def top_level_literals(expr: str) -> list[str]:
    """String literals of an expression outside any nested call (so the "shape"
    of `.attr("shape")` is not part of the message)."""
    out, depth, i = [], 0, 0
    while i < len(expr):
        c = expr[i]
        if c == '"':
            m = re.match(STRING, expr[i:])
            assert m is not None
            if depth == 0:
                out.append(unescape(m.group(0)))
            i += len(m.group(0))
            continue
        depth += {"(": 1, ")": -1}.get(c, 0)
        i += 1
    return out


def code_lines(src: str) -> str:
    """The source with comments blanked (line positions kept)."""
    return "\n".join("" if line.strip().startswith(("//", "#define", "///")) else line for line in src.split("\n"))


def cpp_header_sites() -> list[Site]:
    sites = []
    for path in sorted((ROOT / "cpp" / "include" / "kvcore").rglob("*.h")):
        src = code_lines(path.read_text())
        for m in re.finditer(r"KVCORE_CHECK_OR_RETURN_ERROR\(", src):
            quote = src.index('"', m.end())
            code = re.search(r"(\w+)\s*,\s*$", src[m.end() : quote])
            fmt = re.match(STRINGS, src[quote:])
            assert code and fmt, f"{path.name}: cannot read the check at {m.start()}"
            sites.append(Site(path.name, code.group(1), from_printf(joined(fmt.group(1)))))
        for m in re.finditer(r"Status::make\(\s*Error::(\w+),\s*" + STRINGS, src):
            sites.append(Site(path.name, m.group(1), from_printf(joined(m.group(2)))))
        for m in re.finditer(r"KVCORE_CHECK\([^;]*?,\s*" + STRINGS + r"\)", src):
            sites.append(Site(path.name, "abort", from_printf(joined(m.group(1)))))
    return sites


def binding_sites() -> list[Site]:
    sites = []
    for path in sorted((ROOT / "python" / "src").glob("*.[ch]*")):
        src = code_lines(path.read_text())
        for m in re.finditer(r"\braise\(\s*kvcore::Error::(\w+),", src):
            expr = src[m.end() : balanced(src, m.end())].strip()
            pattern = from_pieces(top_level_literals(expr))
            # A message that starts with a value (a name, a number) may start with anything.
            sites.append(Site(path.name, m.group(1), pattern if expr.startswith('"') else ".*?" + pattern))
        for m in re.finditer(r"Status::make\(\s*(?:kvcore::Error::(\w+)|(\w+)),\s*" + STRINGS, src):
            # A variable code (a Python builder's own kvcore error) may be any code.
            sites.append(Site(path.name, m.group(1) or "*", from_printf(joined(m.group(3)))))
        for m in re.finditer(r"throw py::(\w+)_error\(", src):
            name = {"type": "TypeError", "value": "ValueError"}[m.group(1)]
            expr = src[m.end() : balanced(src, m.end())].strip()
            pattern = from_pieces(top_level_literals(expr))
            sites.append(Site(path.name, name, pattern if expr.startswith('"') else ".*?" + pattern))
    return sites


# Python modules whose every raise has a row (test_every_error_path_has_a_row).
PY_COVERED = [ROOT / "python" / "kvcore" / "registry.py", ROOT / "python" / "kvcore" / "torch" / "state_slots.py"]
# Python modules whose rows are checked against their raises (no stale rows), not yet every raise
# documented: kvcore's torch byte layers (their refusals mirror KVPool's and PagedKVPool's), their
# records and kvcore.quantized's format names.
PY_ROWS_ONLY = [ROOT / "python" / "kvcore" / "torch" / f"{name}.py"
                for name in ("pool", "paged", "quantized", "quantized_paged", "pool_records", "paged_records")]
PY_ROWS_ONLY.append(ROOT / "python" / "kvcore" / "quantized.py")


def python_sites(paths: list[Path]) -> list[Site]:
    sites = []
    for path in paths:
        src = path.read_text()
        for m in re.finditer(r"raise (\w+)\(\s*((?:f?\"(?:[^\"\\]|\\.)*\"\s*)+)\)", src):
            text = "".join(re.findall(r'f?"((?:[^"\\]|\\.)*)"', m.group(2)))
            pieces = re.split(r"\{[^}]*\}", text)
            sites.append(Site(path.name, PY_ERROR_CODE.get(m.group(1), m.group(1)), from_pieces(pieces)))
    return sites


def all_sites(covered_only: bool = False) -> list[Site]:
    """Every error path found; ``covered_only``: only those of sources every path of which needs a row."""
    found = cpp_header_sites() + binding_sites() + python_sites(PY_COVERED if covered_only else PY_COVERED + PY_ROWS_ONLY)
    # A format that is only conversions ("%s") relays an error made elsewhere.
    return [s for s in found if re.sub(r"[.*?()|:]", "", s.pattern)]


def rows() -> list[Row]:
    out = []
    for number, line in enumerate(DOC.read_text().split("\n"), start=1):
        if not line.startswith("| ") or line.startswith("| call |"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        assert len(cells) == 5, f"docs/errors.md:{number}: a row needs 5 cells, has {len(cells)}"
        call, _, error, message, proof = cells
        code = re.match(r"`([^`]+)`", error)
        assert code, f"docs/errors.md:{number}: the error cell must start with the code in backticks"
        example = re.fullmatch(r"(`+) ?(.*?) ?\1", message)  # ``a `b` c`` holds a backtick
        assert example or message == "—", f"docs/errors.md:{number}: the message cell is one `example` or —"
        unreachable = proof[len("unreachable:") :].strip() if proof.startswith("unreachable:") else ""
        tests = tuple(re.findall(r"`([^`]+)`", proof)) if not unreachable else ()
        assert tests or unreachable, f"docs/errors.md:{number}: name a test, or say why none can reach it"
        out.append(Row(number, call, code.group(1), example.group(2) if example else "", tests, unreachable))
    return out


def agree(site: Site, row: Row) -> bool:
    return bool(row.example) and site.code in (row.code, "*") and site.matches(row.example)


def test_the_sources_have_error_paths_to_check() -> None:
    sites = all_sites()
    # A broken extraction would find few sites and prove little.
    assert len([s for s in sites if s.where.endswith(".h") and s.where not in ("errors.h",)]) >= 60
    assert len([s for s in sites if s.where.endswith(".cpp")]) >= 20
    assert len([s for s in sites if s.where == "registry.py"]) >= 3


def test_every_error_path_has_a_row() -> None:
    table = rows()
    missing = [f"{s.where}: {s.code} {s.pattern}" for s in all_sites(covered_only=True) if not any(agree(s, r) for r in table)]
    assert not missing, "error paths docs/errors.md does not document:\n" + "\n".join(missing)


def test_every_row_is_an_error_path() -> None:
    sites = all_sites()
    stale = [f"docs/errors.md:{r.line}: {r.code} {r.example!r}" for r in rows() if r.example and not any(agree(s, r) for s in sites)]
    assert not stale, "rows no source produces (wrong example or code):\n" + "\n".join(stale)


def test_rows_without_an_example_are_pybind11_or_numpy_checks() -> None:
    for row in rows():
        if not row.example:
            assert row.code in ("TypeError", "ValueError", "False", "precondition"), f"docs/errors.md:{row.line}"


def test_every_named_gtest_exists() -> None:
    sources = "\n".join(p.read_text() for p in (ROOT / "tests").rglob("*.cpp"))
    defined = set(re.findall(r"^TEST(?:_F|_P)?\((\w+),\s*(\w+)\)", sources, re.M))
    named = {t for r in rows() for t in r.tests if "::" not in t}
    missing = sorted(t for t in named if tuple(t.split(".")) not in defined)
    assert not missing, f"gtests named in docs/errors.md that do not exist: {missing}"


def test_every_named_pytest_is_collected() -> None:
    # The table names tests relative to tests/python; pytest reports them from the root.
    named = {"tests/python/" + t for r in rows() for t in r.tests if "::" in t}
    files = sorted({t.split("::")[0] for t in named})
    assert all((ROOT / f).is_file() for f in files), files
    collected = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *files],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert collected.returncode == 0, collected.stdout[-3000:] + collected.stderr[-3000:]
    ids = set(collected.stdout.split("\n"))
    functions = {i.split("[")[0] for i in ids}
    missing = sorted(t for t in named if t not in (ids if "[" in t else functions))
    assert not missing, f"pytest ids named in docs/errors.md that are not collected: {missing}"


@pytest.mark.parametrize(
    "fmt, example, ok",
    [
        ("T = %d: a step needs 1 <= T <= max_step = %d", "T = 0: a step needs 1 <= T <= max_step = 4", True),
        ("T = %d: a step needs 1 <= T <= max_step = %d", "T = 0: a step needs T <= 4", False),
        ("layers[%d].head_dim = %d: must be >= 1", "head_dim = 0: must be >= 1", True),
        ("install(key '%.*s'): cache is null", "install(key 'a'): cache is null", True),
    ],
)
def test_the_format_matching_itself(fmt: str, example: str, ok: bool) -> None:
    assert Site("x", "c", from_printf(fmt)).matches(example) is ok
