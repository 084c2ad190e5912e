"""Optional imports for the tests: a test that needs a package the core does not
skips, visibly, when that package is *absent*, and fails when it is present but
broken.

``pytest.importorskip(name, exc_type=ImportError)`` skips on any ImportError: a
broken install (a dependency of ExecuTorch missing, a torch that fails to load
its libraries) skipped 92 tests and the run stayed green (issue 43). ``need``
skips only on the ModuleNotFoundError of the named module itself (``name`` or
one of its parent packages: ``executorch`` absent, when the test needs
``executorch.extension.llm.cache.update_and_attend``); any other error
propagates with its traceback, so collection fails and names the cause. Every
skip it makes is then held to the run's skip budget (skip_allowlist.py).
"""

from __future__ import annotations

import importlib
import warnings
from types import ModuleType
from typing import Optional

import pytest


def _absent(name: str, error: ModuleNotFoundError) -> bool:
    """True when `error` says `name` itself (or a package above it) is not installed."""
    missing = error.name
    return missing is not None and (name == missing or name.startswith(missing + "."))


def _import(name: str) -> ModuleType:
    # As pytest.importorskip does: warnings a package raises while importing (ExecuTorch's
    # importlib.resources.read_text, deprecated) are its own, not the test's, and the
    # suite's filterwarnings = error would turn them into collection errors.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return importlib.import_module(name)


def need(name: str, reason: Optional[str] = None) -> ModuleType:
    """The module `name`; skips the calling test (or module, at import time) when it
    is not installed. Any other import error propagates."""
    try:
        return _import(name)
    except ModuleNotFoundError as e:
        if not _absent(name, e):
            raise
        why = f"{reason}: " if reason else ""
        pytest.skip(f"{why}{name} is not installed ({e})", allow_module_level=True)


def maybe(name: str) -> Optional[ModuleType]:
    """The module `name`, or None when it is not installed (for parameter lists built at
    import; pair with ``skip_without``). Any other import error propagates."""
    try:
        return _import(name)
    except ModuleNotFoundError as e:
        if not _absent(name, e):
            raise
        return None


ml_dtypes = maybe("ml_dtypes")
#: Marks the bfloat16 cases: they skip, visibly, without ml_dtypes (the test extra installs it).
needs_ml_dtypes = pytest.mark.skipif(
    ml_dtypes is None, reason='ml_dtypes is not installed: pip install "kvcore[bfloat16]"'
)
#: ml_dtypes.bfloat16, or the name "bfloat16" as a placeholder in parameter lists whose
#: bfloat16 case carries ``needs_ml_dtypes`` (it never runs then).
BFLOAT16: object = ml_dtypes.bfloat16 if ml_dtypes is not None else "bfloat16"
