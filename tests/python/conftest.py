"""Fixtures shared by the Python tests. Nothing here runs at import or changes
global state: a test opts in by naming a fixture.

Helpers that are not fixtures live in reference.py (`import reference`): the
brute-force model, `Lockstep` (a cache driven alongside it) and `observe`.
The transformers integration's model tests share hf_generate.py (prompts, `generate`,
`max_diff`, the per-model `model` fixture).

The skip budget (``--skip-budget RUN``, skip_allowlist.py) and the seed of the
random hypothesis profiles (hypothesis_profiles.py) are the hooks below.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sysconfig
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import hypothesis_profiles
import kvcore
import skip_allowlist

MakeCache = Callable[..., kvcore.SequenceCache]


def layer(policy: kvcore.LayerPolicy, n_kv_heads: int = 1, head_dim: int = 8) -> kvcore.LayerConfig:
    return kvcore.LayerConfig(policy, n_kv_heads=n_kv_heads, head_dim=head_dim)


@pytest.fixture
def make_cache() -> MakeCache:
    """make_cache(*policies, capacity=64, max_step=None): a SequenceCache with one
    layer per policy (n_kv_heads=1, head_dim=8)."""

    def make(*policies: kvcore.LayerPolicy, capacity: int = 64, max_step: int | None = None) -> kvcore.SequenceCache:
        cfg = kvcore.CacheConfig(capacity, [layer(p) for p in policies], max_step=max_step)
        return kvcore.SequenceCache(cfg)

    return make


@pytest.fixture
def mixed_cache(make_cache: MakeCache) -> kvcore.SequenceCache:
    """Gemma-3-style: five Ring(window=4, sinks=1) layers and one Flat layer,
    capacity 64, max_step 3 (ring layers hold 1 + 4 + 3 - 1 = 7 rows)."""
    ring = kvcore.Ring(window=4, sinks=1)
    return make_cache(ring, ring, ring, ring, ring, kvcore.Flat(), capacity=64, max_step=3)


@pytest.fixture(scope="session")
def probe_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/python/capsule_probe built the way an embedded backend is: hidden
    visibility, no exceptions, no RTTI. Skips when there is no C++ compiler."""
    root = Path(__file__).resolve().parents[2]
    source = Path(__file__).resolve().parent / "capsule_probe" / "kvcore_capsule_probe.cpp"
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if cxx is None:
        pytest.skip("no C++ compiler to build the probe extension with")
    out = tmp_path_factory.mktemp("probe") / ("kvcore_capsule_probe" + sysconfig.get_config_var("EXT_SUFFIX"))
    cmd = [
        cxx, "-std=c++17", "-O1", "-shared", "-fPIC", "-pthread",
        "-fvisibility=hidden", "-fno-exceptions", "-fno-rtti",
        "-Wall", "-Wextra", "-Werror",
        f"-I{root / 'cpp' / 'include'}", f"-I{sysconfig.get_paths()['include']}",
        str(source), "-o", str(out),
    ]  # fmt: skip
    built = subprocess.run(cmd, capture_output=True, text=True)
    if built.returncode != 0:
        pytest.fail(f"building the probe failed:\n{' '.join(cmd)}\n{built.stderr}")
    return out


@pytest.fixture(scope="module")
def one_torch_thread() -> Iterator[None]:
    """torch on one thread for a module's tests, restored after: on two shared cores,
    threads only add contention to the tiny models' matmuls. A module opts in with
    ``pytestmark = pytest.mark.usefixtures("one_torch_thread")``."""
    import torch  # only the modules that ask need torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# --- the skip budget (skip_allowlist.py) ---------------------------------------------

_SKIPS: list[tuple[str, str]] = []  # (node id, reason), in the order pytest reported them


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--skip-budget", choices=skip_allowlist.RUNS, default=None, metavar="RUN",
        help="list every skip and fail the run on one that tests/python/skip_allowlist.py does not "
             "allow for RUN (normal, sanitize); scripts/test.sh passes it",
    )  # fmt: skip


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    run = config.getoption("--skip-budget")
    for path, why in skip_allowlist.LEFT_OUT.get(run, {}).items() if run else ():
        for item in items:
            if item.nodeid == path or item.nodeid.startswith(path + "::"):
                item.add_marker(pytest.mark.skip(reason=skip_allowlist.left_out_reason(run, why)))


def _skip_reason(report: pytest.CollectReport | pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:  # (path, line, "Skipped: reason")
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.skipped:  # a module-level skip: the whole file's tests are not even collected
        _SKIPS.append((report.nodeid, _skip_reason(report)))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):
        _SKIPS.append((report.nodeid, _skip_reason(report)))


def _unexpected(config: pytest.Config) -> list[tuple[str, str]]:
    run = config.getoption("--skip-budget")
    return [s for s in _SKIPS if not skip_allowlist.allowed(run, *s)] if run else []


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    # (NO_TESTS_COLLECTED too: a file whose module-level skip left nothing to run.)
    if _unexpected(session.config) and exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    explore = _explore_line(config)
    if explore:  # at the end too, beside the failures it replays
        terminalreporter.write_sep("=", explore)
    run = config.getoption("--skip-budget")
    if not _SKIPS and not run:
        return
    unexpected = _unexpected(config)
    tr = terminalreporter
    title = f"skips: {len(_SKIPS)}" + (f", {len(unexpected)} not on the {run} run's budget" if run else "")
    tr.write_sep("=", title, red=bool(unexpected), green=bool(run) and not unexpected)
    for nodeid, reason in _SKIPS:
        mark = "UNEXPECTED " if (nodeid, reason) in unexpected else ""
        tr.write_line(f"{mark}SKIP {nodeid}: {reason}")
    if unexpected:
        tr.write_line(f"FAILED: {len(unexpected)} skip(s) not allowed for the {run} run by "
                      "tests/python/skip_allowlist.py: install what they need, fix the import, "
                      "or add an entry saying why the skip is expected")  # fmt: skip


# --- a fresh, printed seed for HYPOTHESIS_PROFILE=explore (hypothesis_profiles.py) ---------


def _explore_seed(config: pytest.Config) -> str | None:
    if os.environ.get("HYPOTHESIS_PROFILE") != hypothesis_profiles.EXPLORE:
        return None
    seed = config.getoption("hypothesis_seed", None)
    return None if seed is None else str(seed)


@pytest.hookimpl(tryfirst=True)  # before hypothesis's own pytest_configure reads --hypothesis-seed
def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get("HYPOTHESIS_PROFILE") == hypothesis_profiles.EXPLORE and config.getoption(
        "hypothesis_seed", None
    ) is None:
        config.option.hypothesis_seed = str(secrets.randbits(32))


def _explore_line(config: pytest.Config) -> str | None:
    seed = _explore_seed(config)
    if seed is None:
        return None
    return (f"hypothesis: profile explore, seed {seed} (replay: HYPOTHESIS_PROFILE=explore pytest ... "
            f"--hypothesis-seed={seed})")


def pytest_report_header(config: pytest.Config) -> str | None:
    return _explore_line(config)
