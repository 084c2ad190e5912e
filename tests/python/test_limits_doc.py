"""One source for the size test's limits (issue 43, item 4).

tests/cpp/text_size_check.sh sets the .text limits of the planner-only and the
sequence-only registry + session runners; docs/registry.md and bench/README.md
state them, and tests/cpp/CMakeLists.txt points at the script instead of
repeating them. Before this test the script enforced 13,500 / 21,500 B while
the docs and the CMake comment promised 10,000 / 20,000 B.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def limits() -> tuple[int, int]:
    script = (ROOT / "tests" / "cpp" / "text_size_check.sh").read_text()
    planner = re.search(r"^PLANNER_LIMIT=(\d+)$", script, flags=re.M)
    session = re.search(r"^SESSION_LIMIT=(\d+)$", script, flags=re.M)
    assert planner and session
    return int(planner.group(1)), int(session.group(1))


def test_the_docs_state_the_limits_the_size_test_enforces() -> None:
    planner, session = limits()
    registry = (ROOT / "docs" / "registry.md").read_text()
    assert f"holds the first under\n{session:,} B and the planner-only runner under {planner:,} B" in registry
    bench = (ROOT / "bench" / "README.md").read_text()
    assert f"({planner:,} B and {session:,} B since the five layer kinds" in bench
    assert f"the planner alone under {planner:,} B; registry + session with sequence builders under {session:,} B" in bench


def test_no_other_limit_is_stated_where_the_size_test_is_described() -> None:
    planner, session = limits()
    cmake = (ROOT / "tests" / "cpp" / "CMakeLists.txt").read_text()
    size_test = cmake[cmake.index("# Size test:"):cmake.index("add_test(NAME text_size")]
    assert not re.search(r"\d,\d{3}", size_test), size_test  # it points at the script instead
    for doc in ("docs/registry.md", "bench/README.md"):
        text = (ROOT / doc).read_text()
        for stated in re.findall(r"under ([\d,]+) B", text):
            assert int(stated.replace(",", "")) in (planner, session), (doc, stated)


def test_the_measured_sizes_the_docs_give_are_under_the_limits() -> None:
    planner, session = limits()
    script = (ROOT / "tests" / "cpp" / "text_size_check.sh").read_text()
    measured = re.search(r"planner ([\d,]+) B, session\n# ([\d,]+) B, so the limits leave ([\d,]+) B \([^)]*\) and ([\d,]+) B", script)
    assert measured, "the script's header states the measured sizes and the room left"
    p, s, room_p, room_s = (int(g.replace(",", "")) for g in measured.groups())
    assert (planner - p, session - s) == (room_p, room_s)
    registry = (ROOT / "docs" / "registry.md").read_text()
    assert f"is {s:,} B and has no `BatchCache` symbol" in registry and f"runner\n(`bench/planner_runner.cpp`) {p:,} B" in registry
    assert f"leaving {room_p} B and {room_s} B of room" in registry
