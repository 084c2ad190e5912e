"""Deprecated: the demos moved out of the core package, to ``kvcore_demo``.

``kvcore.demo`` and its submodules (``kvcore.demo.batch``, ``kvcore.demo.model``, ...) keep
working until kvcore 0.2.0, where this path is removed, and warn (DeprecationWarning) when
imported; import ``kvcore_demo`` (``kvcore_demo.batch``, ...) instead (docs/deprecations.md);
``kvcore.demo.real_model`` is now ``kvcore.integrations.transformers_models``.
``kvcore demo`` on the command line is unchanged. A submodule imported through this path is
the very module object of ``kvcore_demo`` (one set of classes), not a copy.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings
from collections.abc import Sequence

import kvcore_demo

warnings.warn(
    "kvcore.demo is deprecated: import kvcore_demo (removed in kvcore 0.2.0)",
    DeprecationWarning,
    stacklevel=2,
)

__doc__ = (__doc__ or "") + "\n" + (kvcore_demo.__doc__ or "")


# Modules that left the demos for the core package: their old names under kvcore.demo.
_MOVED = {"real_model": "kvcore.integrations.transformers_models"}


class _MovedDemo(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``kvcore.demo.NAME`` as the module ``kvcore_demo.NAME`` (imported once, shared)."""

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
                  ) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith(__name__ + "."):
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        name = spec.name[len(__name__) + 1:]
        return importlib.import_module(_MOVED.get(name, f"kvcore_demo.{name}"))

    def exec_module(self, module: types.ModuleType) -> None:
        """Nothing to run: the module ran when kvcore_demo imported it."""


if not any(isinstance(finder, _MovedDemo) for finder in sys.meta_path):
    sys.meta_path.insert(0, _MovedDemo())


def __getattr__(name: str) -> object:
    """``kvcore.demo.NAME``: the attribute (or submodule) ``NAME`` of ``kvcore_demo``.
    AttributeError: neither exists (a dunder name is never a submodule)."""
    if hasattr(kvcore_demo, name):
        return getattr(kvcore_demo, name)
    if not name.startswith("__"):
        try:
            return importlib.import_module(_MOVED.get(name, f"kvcore_demo.{name}"))
        except ModuleNotFoundError:
            pass
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
