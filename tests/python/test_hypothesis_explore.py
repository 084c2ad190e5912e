"""HYPOTHESIS_PROFILE=explore (hypothesis_profiles.py, conftest.py): the fixed-seed
profiles draw the same examples every run; explore draws fresh ones, prints the
seed, and ``--hypothesis-seed=N`` replays them.

Child pytests run ``test_a_property_that_records_its_examples`` (below), which
writes the integers hypothesis gives it to the file ``KVCORE_EXPLORE_RECORD``
names; in the suite itself it runs as an ordinary (trivial) property test.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

import hypothesis_profiles

ROOT = Path(__file__).resolve().parents[2]
PROFILES = {"dev": {"max_examples": 20, "derandomize": True, "database": None},
            "ci": {"max_examples": 20, "derandomize": True, "database": None},
            "long": {"max_examples": 200}}  # fmt: skip


@hypothesis_profiles.profile_settings(PROFILES)
@given(st.integers(0, 2**62))
def test_a_property_that_records_its_examples(x: int) -> None:
    record = os.environ.get("KVCORE_EXPLORE_RECORD")
    if record:
        with open(record, "a") as f:
            f.write(f"{x}\n")
    assert 0 <= x <= 2**62


def examples(tmp_path: Path, name: str, profile: str, *args: str) -> tuple[list[int], str]:
    record = tmp_path / name
    env = {**os.environ, "HYPOTHESIS_PROFILE": profile, "KVCORE_EXPLORE_RECORD": str(record)}
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
           f"{Path(__file__).relative_to(ROOT)}::test_a_property_that_records_its_examples", *args]  # fmt: skip
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return [int(line) for line in record.read_text().split()], done.stdout


def test_ci_is_derandomized_and_explore_draws_fresh_printed_seeds_that_replay(tmp_path: Path) -> None:
    ci_a, out = examples(tmp_path, "ci_a", "ci")
    ci_b, _ = examples(tmp_path, "ci_b", "ci")
    assert ci_a == ci_b and len(ci_a) >= 20 and "profile explore" not in out  # a fixed seed

    first, out_first = examples(tmp_path, "first", "explore")
    second, out_second = examples(tmp_path, "second", "explore")
    seeds = [re.search(r"hypothesis: profile explore, seed (\d+) \(replay: .*--hypothesis-seed=(\d+)\)", out)
             for out in (out_first, out_second)]  # fmt: skip
    assert all(m and m.group(1) == m.group(2) for m in seeds), out_first + out_second
    assert seeds[0].group(1) != seeds[1].group(1) and first != second  # type: ignore[union-attr]
    assert first != ci_a

    replayed, out = examples(tmp_path, "replayed", "explore", f"--hypothesis-seed={seeds[0].group(1)}")  # type: ignore[union-attr]
    assert replayed == first and f"seed {seeds[0].group(1)} " in out  # type: ignore[union-attr]


def test_explore_is_cis_sizes_without_the_fixed_seed(monkeypatch: object) -> None:
    import pytest

    assert isinstance(monkeypatch, pytest.MonkeyPatch)
    monkeypatch.setenv("HYPOTHESIS_PROFILE", "explore")
    chosen = hypothesis_profiles.profile_settings(PROFILES)
    assert chosen.max_examples == 20 and not chosen.derandomize and chosen.database is None
    monkeypatch.setenv("HYPOTHESIS_PROFILE", "nightly")
    with pytest.raises(ValueError, match=r"must be one of \['ci', 'dev', 'explore', 'long'\]"):
        hypothesis_profiles.profile_settings(PROFILES)
