"""The registry capsule from another extension module when kvcore cannot be
imported: kvcore/python_capsule.h reports NotFound naming the reason, and the
probe module (tests/python/capsule_probe, built here the way test_capsule.py
builds it) raises instead of crashing."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROBE_SOURCE = Path(__file__).resolve().parent / "capsule_probe" / "kvcore_capsule_probe.cpp"


@pytest.fixture(scope="module")
def probe_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if cxx is None:
        pytest.skip("no C++ compiler to build the probe extension with")
    out = tmp_path_factory.mktemp("probe") / ("kvcore_capsule_probe" + sysconfig.get_config_var("EXT_SUFFIX"))
    cmd = [
        cxx, "-std=c++17", "-O1", "-shared", "-fPIC", "-pthread", "-fvisibility=hidden", "-fno-exceptions",
        "-fno-rtti", f"-I{ROOT / 'cpp' / 'include'}", f"-I{sysconfig.get_paths()['include']}",
        str(PROBE_SOURCE), "-o", str(out),
    ]  # fmt: skip
    built = subprocess.run(cmd, capture_output=True, text=True)
    if built.returncode != 0:
        pytest.fail(f"building the probe failed:\n{' '.join(cmd)}\n{built.stderr}")
    return out


def test_the_capsule_import_failure_names_the_reason(probe_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import importlib.util, sys
        sys.modules["kvcore"] = None  # importing kvcore now fails
        spec = importlib.util.spec_from_file_location("kvcore_capsule_probe", {str(probe_path)!r})
        probe = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(probe)
        try:
            probe.storage_address()
        except RuntimeError as e:
            print(e)
        else:
            print("no error")
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr[-2000:]
    # NotFound (0x20), the capsule's name and the reason Python gave.
    assert result.stdout.strip() == (
        "kvcore error 0x20: cannot import kvcore._core.registry_storage_v1: "
        'PyCapsule_Import could not import module "kvcore"'
    )
