"""The registry capsule from another extension module when kvcore cannot be
imported: kvcore/adapters/python_capsule.h reports NotFound naming the reason, and the
probe module (tests/python/capsule_probe, built by conftest's probe_path)
raises instead of crashing."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path


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
        "kvcore error 0x20: cannot import kvcore._core.registry_storage_v2: "
        'PyCapsule_Import could not import module "kvcore"'
    )
