"""The C++ headers' layers point down only (issue 18, item 5).

Each folder of cpp/include/kvcore is a layer: core/ (with version.h) at the
bottom, then batch/ (its parts/ included), then the byte layers (pool/) and the
registry (registry/), then the adapters, a sequence's records (state/: they
join a cache to its byte layer) and the umbrella kvcore.h. A header may
include its own layer or one below; and core/'s code names no type of a higher
layer (the batch faces are looked up by FaceId and typed in batch/).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

INCLUDE = Path(__file__).resolve().parents[2] / "cpp" / "include"
HEADERS = sorted((INCLUDE / "kvcore").rglob("*.h"))
RANK = {"core": 0, "version.h": 0, "batch": 1, "pool": 2, "registry": 2, "adapters": 3, "state": 3, "kvcore.h": 3}
# Types of the batch layer (and above) that core/ must not name in code.
HIGHER_TYPES = re.compile(r"\b(BatchControl|BatchPlanner|BatchCache|BatchStep\w*|BlockPool|BlockGroup|PagedKVPool)\b")


def rank(path: str) -> int:
    """The layer of a header given as a path below kvcore/."""
    return RANK[path.split("/")[0]]


def code_of(text: str) -> str:
    """The text without its comments and string literals."""
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    text = re.sub(r'"(?:[^"\\\n]|\\.)*"', '""', text)
    return re.sub(r"//[^\n]*", "", text)


@pytest.mark.parametrize("header", HEADERS, ids=lambda p: str(p.relative_to(INCLUDE)))
def test_includes_point_down_only(header: Path) -> None:
    own = str(header.relative_to(INCLUDE / "kvcore"))
    for included in re.findall(r'^#include "kvcore/([^"]+)"', header.read_text(), flags=re.M):
        assert rank(included) <= rank(own), f"{own} includes kvcore/{included}, a higher layer"


def test_core_names_no_higher_type() -> None:
    for header in (INCLUDE / "kvcore" / "core").glob("*.h"):
        found = HIGHER_TYPES.findall(code_of(header.read_text()))
        assert not found, f"{header.name} names {sorted(set(found))}"


def test_the_layering_check_sees_a_forward_declaration() -> None:
    # What main's cache_base.h had: a forward declaration is a name, not an include.
    assert HIGHER_TYPES.findall(code_of("class BatchControl;  // the batch face\n")) == ["BatchControl"]
