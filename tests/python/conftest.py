"""Fixtures shared by the Python tests. Nothing here runs at import or changes
global state: a test opts in by naming a fixture.

Helpers that are not fixtures live in reference.py (`import reference`): the
brute-force model, `Lockstep` (a cache driven alongside it) and `observe`.
The transformers integration's model tests share hf_generate.py (prompts, `generate`,
`max_diff`, the per-model `model` fixture).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sysconfig
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import kvcore

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
