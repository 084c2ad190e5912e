"""The skip budget (skip_allowlist.py, conftest.py) and the import guards (needs.py):
a run with an optional import sabotaged fails, naming the tests it would have skipped.

The sabotage is a ``sitecustomize.py`` put first on a child pytest's PYTHONPATH: a
``sys.meta_path`` finder that makes the named package absent (ModuleNotFoundError of
that package, as when it is not installed) or broken (an ImportError from inside it,
as when one of its own dependencies or libraries is missing). The child runs one or
two test files with ``--skip-budget normal``, as scripts/test.sh does; the same
command without the sabotage is the control.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import skip_allowlist
from needs import _absent

ROOT = Path(__file__).resolve().parents[2]

SABOTAGE = '''
import sys

ABSENT, BROKEN = {absent!r}, {broken!r}


def _under(name, package):
    return name == package or name.startswith(package + ".")


class _Sabotage:
    def find_spec(self, name, path=None, target=None):
        if any(_under(name, p) for p in ABSENT):
            raise ModuleNotFoundError(f"No module named {{name!r}} (sabotaged)", name=name)
        if any(_under(name, p) for p in BROKEN):
            raise ImportError(f"{{name}}: libsabotaged.so: cannot open shared object file (sabotaged)")
        return None


sys.meta_path.insert(0, _Sabotage())
'''


def child_pytest(tmp_path: Path, args: list[str], absent: tuple[str, ...] = (), broken: tuple[str, ...] = ()
                 ) -> subprocess.CompletedProcess[str]:
    """pytest on `args` under the normal run's skip budget, with `absent` and `broken` sabotaged."""
    env = dict(os.environ)
    if absent or broken:
        (tmp_path / "sitecustomize.py").write_text(textwrap.dedent(SABOTAGE.format(absent=absent, broken=broken)))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(tmp_path), env.get("PYTHONPATH")) if p)
    env.pop("PYTEST_ADDOPTS", None)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--skip-budget", "normal", *args]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def unexpected(done: subprocess.CompletedProcess[str]) -> set[str]:
    return set(re.findall(r"^UNEXPECTED SKIP (\S+): ", done.stdout, flags=re.M))


BF16_CASE = "tests/python/test_pool.py::test_update_reads_back_exactly_the_needed_positions"


def test_without_ml_dtypes_the_bfloat16_cases_skip_and_the_budget_fails_naming_them(tmp_path: Path) -> None:
    args = ["tests/python/test_pool.py", "-k", "test_update_reads_back_exactly_the_needed_positions"]
    control = child_pytest(tmp_path, args)
    assert control.returncode == 0, control.stdout + control.stderr
    assert "skips: 0, 0 not on the normal run's budget" in control.stdout

    done = child_pytest(tmp_path, args, absent=("ml_dtypes",))
    assert done.returncode == 1, done.stdout + done.stderr
    assert unexpected(done) == {f"{BF16_CASE}[bfloat16]"}, done.stdout
    assert "4 passed, 1 skipped" in done.stdout  # the other dtypes still ran
    assert "ml_dtypes is not installed" in done.stdout


def test_without_executorch_its_tests_skip_and_the_budget_fails_naming_them(tmp_path: Path) -> None:
    args = ["tests/python/test_executorch_quantized.py", "tests/python/test_quantized_executorch.py",
            "-k", "executorch_quantized or test_qint8_equals_executorchs_quantized_kv_cache_bit_for_bit"]  # fmt: skip
    done = child_pytest(tmp_path, args, absent=("executorch",))
    assert done.returncode == 1, done.stdout + done.stderr
    bit_for_bit = "tests/python/test_quantized_executorch.py::test_qint8_equals_executorchs_quantized_kv_cache_bit_for_bit"
    assert unexpected(done) == {
        "tests/python/test_executorch_quantized.py",  # a module-level skip: the whole file
        *(f"{bit_for_bit}[{dim}]" for dim in (1, 7, 64, 256)),
    }, done.stdout
    assert "is not installed (No module named 'executorch' (sabotaged))" in done.stdout


def test_a_broken_executorch_fails_collection_with_the_cause_instead_of_skipping(tmp_path: Path) -> None:
    done = child_pytest(tmp_path, ["tests/python/test_executorch_quantized.py"], broken=("executorch",))
    assert done.returncode == pytest.ExitCode.INTERRUPTED, done.stdout + done.stderr  # a collection error
    assert "ERROR collecting tests/python/test_executorch_quantized.py" in done.stdout
    assert "libsabotaged.so: cannot open shared object file" in done.stdout
    assert unexpected(done) == set()  # not a skip at all


def test_need_skips_only_on_the_named_module_being_absent() -> None:
    def error(name: str) -> ModuleNotFoundError:
        return ModuleNotFoundError(f"No module named {name!r}", name=name)

    assert _absent("executorch.extension.llm.cache.update_and_attend", error("executorch"))
    assert _absent("executorch.extension.llm", error("executorch.extension.llm"))
    assert _absent("ml_dtypes", error("ml_dtypes"))
    assert not _absent("executorch.extension.llm", error("ruamel"))  # a dependency: broken, not absent
    assert not _absent("ml_dtypes", error("ml_dtypes_extra"))  # a prefix of the name is not its package
    assert not _absent("torch", ModuleNotFoundError("no name"))


def test_the_allowlist_allows_only_what_it_names_in_the_runs_it_names() -> None:
    allowed = skip_allowlist.allowed
    excluded = "tests/python/test_executorch_op.py::TestWindowedSpecOnKVCore::test_window_equal_to_history_stays_fused"
    assert allowed("normal", excluded, "spec kind improved: ...") and allowed("sanitize", excluded, "spec kind")
    wheel = "tests/python/test_packaging.py::test_the_wheel_installs_headers"
    reason = "kvcore is imported from /x/build/asan-python/site/kvcore, not from an installed wheel"
    assert allowed("sanitize", wheel, reason) and not allowed("normal", wheel, reason)
    assert not allowed("sanitize", wheel, "no cmake to build the C++ consumer with")
    gemma = "tests/python/test_gemma_real.py::test_prompt_lookup_drafts_what_followed_the_longest_recurring_tail"
    why = skip_allowlist.LEFT_OUT["sanitize"]["tests/python/test_gemma_real.py"]
    assert allowed("sanitize", gemma, skip_allowlist.left_out_reason("sanitize", why))
    assert not allowed("normal", gemma, skip_allowlist.left_out_reason("sanitize", why))
    assert not allowed("sanitize", gemma, "the real model needs torch")
    for run in skip_allowlist.RUNS:
        assert not allowed(run, "tests/python/test_executorch_quantized.py", "executorch is not installed")
        assert not allowed(run, f"{BF16_CASE}[bfloat16]", "ml_dtypes is not installed")


def test_the_allowed_executorch_exclusions_are_exactly_test_executorch_ops() -> None:
    source = (ROOT / "tests" / "python" / "test_executorch_op.py").read_text()
    excluded = set(re.findall(r'^    \("(\w+)Test", "(test_\w+)"\): \($', source, flags=re.M))
    assert len(excluded) == 4
    listed = {m.groups() for a in skip_allowlist.ALLOWED
              if (m := re.fullmatch(r"tests/python/test_executorch_op\.py::Test(\w+)OnKVCore::(test_\w+)", a.nodeid))}
    assert listed == excluded
