"""The README's Python examples run, say what they print, and pass mypy --strict.

The pool example continues the quickstart and needs the step's K/V, so it gets
the smallest prelude that makes it whole; the transformers example needs a
model and is covered by test_transformers*.py instead.
"""

from __future__ import annotations

import code
import os
import re
import subprocess
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import kvcore
from kvcore import registry

README = Path(__file__).resolve().parents[2] / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", README.read_text(), flags=re.S | re.M)


def block(marker: str) -> str:
    found = [b for b in python_blocks() if marker in b]
    assert len(found) == 1, f"README has {len(found)} Python blocks containing {marker!r}"
    return found[0]


QUICKSTART = "cache = kvcore.SequenceCache(cfg)"
POOL = "pool = kvcore.KVPool(cache"
REGISTRY = "from kvcore import registry"
BATCH = "cache = kvcore.BatchCache("

@pytest.fixture
def no_mybackend() -> Iterator[None]:
    yield
    if registry.has_builder("mybackend", "sequence"):
        registry.unregister_builder("mybackend", "sequence")


def test_quickstart_runs_and_its_comments_hold() -> None:
    scope: dict[str, Any] = {}
    exec(block(QUICKSTART), scope)
    cache = scope["cache"]
    comment = re.search(r"# (\d+) ring rows, (\d+) flat rows", block(QUICKSTART))
    assert comment is not None
    assert (cache.rows(0), cache.rows(5)) == (int(comment[1]), int(comment[2]))
    assert cache.length == 0  # the last lines rewind to 60, then clear


def test_pool_example_continues_the_quickstart() -> None:
    scope: dict[str, Any] = {}
    exec(block(QUICKSTART), scope)
    exec(block(POOL), scope)  # runs as pasted after the quickstart: it defines what it uses
    cache, positions, mask = scope["cache"], scope["positions"], scope["mask"]
    assert cache.length == 4
    assert positions.tolist() == [0, 1, 2, 3] and mask.tolist() == [[k <= q for k in range(4)] for q in range(4)]


def test_batch_example_runs_and_its_last_comment_holds() -> None:
    source = block(BATCH)
    scope: dict[str, Any] = {}
    exec(source, scope)
    cache = scope["cache"]
    said = re.search(r"# \((\d+), (\d+), (\d+)\)\n$", source)
    assert said is not None
    assert (scope["hit"], cache.length(1), cache.length(2)) == tuple(int(x) for x in said.groups())
    assert not cache.sequence(0).active  # released at the end
    # Sequences 1 and 2 hold three blocks each, four in all: the prompt's two
    # blocks once, and a copy each of the block they both wrote after the fork.
    # Each group holds them in the one pool every group draws from.
    for group in range(cache.n_groups):
        assert cache.blocks_held(1, group) == cache.blocks_held(2, group) == 3
        assert cache.held_blocks(group) == 2 + 2
    assert cache.num_blocks(0) - cache.free_blocks(0) == (2 + 2) * cache.n_groups


class Console(code.InteractiveConsole):
    """The classic interactive interpreter, keeping its errors instead of printing them."""

    def __init__(self) -> None:
        super().__init__({})
        self.errors: list[str] = []

    def showsyntaxerror(self, filename: str | None = None, **kwargs: Any) -> None:
        self.errors.append(traceback.format_exc())

    def showtraceback(self) -> None:
        self.errors.append(traceback.format_exc())


@pytest.mark.parametrize("markers", [(QUICKSTART,), (QUICKSTART, POOL), (BATCH,), (REGISTRY,)],
                         ids=["quickstart", "pool", "batch", "registry"])
def test_examples_paste_into_the_interactive_interpreter(markers: tuple[str, ...], no_mybackend: None) -> None:
    console = Console()
    for marker in markers:
        for line in block(marker).splitlines():
            console.push(line)
        console.push("")  # the blank line that ends a pasted block
    assert console.errors == []


def test_registry_example_runs_and_leaves_no_key(no_mybackend: None) -> None:
    before = registry.keys()
    exec(block(REGISTRY), {})
    assert registry.keys() == before
    assert registry.has_builder("mybackend", "sequence")


@pytest.mark.parametrize("name", ["quickstart", "batch", "registry"])
def test_examples_pass_mypy_strict(name: str, tmp_path: Path) -> None:
    source = block({"quickstart": QUICKSTART, "batch": BATCH, "registry": REGISTRY}[name])
    path = tmp_path / f"readme_{name}.py"
    path.write_text(source)
    env = dict(os.environ)
    package_root = Path(kvcore.__file__).resolve().parents[1]
    if "site-packages" not in package_root.parts:  # a staged build (scripts/dev.sh): check against it
        env["MYPYPATH"] = str(package_root)
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(path)],
        capture_output=True, text=True, cwd=tmp_path, env=env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
