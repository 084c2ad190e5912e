"""The `Class.__new__(Class)` probe both binding suites run: an object made
without `__init__` has no C++ half, and every use of it, as the object or as
an argument, must raise TypeError ("never initialized") or pybind11's
RuntimeError ("Unable to cast from non-held to held instance") instead of
running on garbage memory.

The probe runs in a child interpreter so that a regression fails the test
instead of killing the test session.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

# Runs after the caller's setup, which defines:
#   fresh() -> (live, cache, step): a live object of every class, by name;
#   calls: {class name: [expressions that work on a live object of it]};
#   uses: [expressions that pass `blank` to kvcore as an argument].
_LOOP = """
failures = []
for name, exprs in calls.items():
    cls = getattr(kvcore._core, name)
    for expr in exprs:
        live, cache, step = fresh()
        eval("live[name]." + expr, {"live": live, "name": name, "step": step})  # works when initialized
        live, cache, step = fresh()
        blank = cls.__new__(cls)
        try:
            eval("blank." + expr, {"blank": blank, "step": step})
        except (TypeError, RuntimeError) as e:
            if "never initialized" not in str(e) and "non-held to held" not in str(e):
                failures.append(f"{name}.{expr}: {type(e).__name__}: {e}")
        else:
            failures.append(f"{name}.{expr}: no error")
    live, cache, step = fresh()
    blank = cls.__new__(cls)
    for use in uses:
        try:
            eval(use, {"kvcore": kvcore, "blank": blank, "cache": cache, "live": live})
        except (TypeError, RuntimeError, kvcore.InvalidArgumentError):
            pass
        else:
            failures.append(f"{use} with a blank {name}: no error")
print("\\n".join(failures) if failures else "ok")
"""


def assert_blank_objects_refuse_every_use(setup: str) -> None:
    """Runs `setup` (see _LOOP for what it defines) and the probe in a child
    interpreter; fails naming every use that did not raise as it must."""
    probe = textwrap.dedent(setup) + _LOOP
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=dict(os.environ),
                            timeout=120)
    assert result.returncode == 0, f"the probe died (exit {result.returncode}): {result.stderr[-2000:]}"
    assert result.stdout.strip() == "ok", result.stdout
