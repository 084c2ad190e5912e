"""The paths and argument orders of the last release keep working until the release each names
(docs/deprecations.md), with a DeprecationWarning that names it.

pytest runs with warnings as errors, so each test expects its warning.
"""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path

import numpy as np
import pytest
from needs import need

torch = need("torch", reason="the torch byte layers need torch")

import kvcore  # noqa: E402
from kvcore import state  # noqa: E402
from kvcore.torch import TorchKVPool, TorchPagedKVPool  # noqa: E402

# The release the deprecated paths and orders go in: the next minor release (docs/deprecations.md).
REMOVED_IN = "kvcore 0.2.0"

OLD = {
    "kvcore.integrations.torch_pool": ("kvcore.torch.pool", ["TorchKVPool", "LayerPool", "StepLayout", "read_positions"]),
    "kvcore.integrations.torch_paged": ("kvcore.torch.paged", ["TorchPagedKVPool", "TorchPagedKV"]),
    "kvcore.integrations.torch_state": ("kvcore.torch.pool_records", ["export_sequence", "import_sequence"]),
    "kvcore.integrations.torch_paged_state": ("kvcore.torch.paged_records", ["export_sequence", "import_sequence"]),
    "kvcore.integrations.forward_step": ("kvcore.forward_step", ["ForwardStep", "KVStep"]),
    "kvcore.demo": ("kvcore_demo", ["model", "batch"]),
}


@pytest.mark.parametrize("old", sorted(OLD))
def test_an_old_module_path_imports_with_a_deprecation_warning(monkeypatch: pytest.MonkeyPatch, old: str) -> None:
    new, names = OLD[old]
    monkeypatch.delitem(sys.modules, old, raising=False)
    message = f"{old} is deprecated: import {new} (removed in {REMOVED_IN})"
    with pytest.warns(DeprecationWarning, match=re.escape(message)):
        module = importlib.import_module(old)
    for name in names:
        assert getattr(module, name) is not None, name


def test_an_old_demo_submodule_is_the_moved_module(monkeypatch: pytest.MonkeyPatch) -> None:
    """``kvcore.demo.NAME`` is ``kvcore_demo.NAME`` itself (one set of classes), found lazily."""
    import kvcore_demo.batch

    monkeypatch.delitem(sys.modules, "kvcore.demo", raising=False)
    monkeypatch.delitem(sys.modules, "kvcore.demo.batch", raising=False)
    monkeypatch.delitem(sys.modules, "kvcore.demo.model", raising=False)
    monkeypatch.delitem(sys.modules, "kvcore.demo.real_model", raising=False)
    with pytest.warns(DeprecationWarning, match=re.escape(f"kvcore.demo is deprecated: import kvcore_demo (removed in {REMOVED_IN})")):
        old = importlib.import_module("kvcore.demo.batch")
    assert old is kvcore_demo.batch
    from kvcore.demo.model import Model  # noqa: PLC0415

    assert Model is importlib.import_module("kvcore_demo.model").Model
    from kvcore.demo import real_model  # noqa: PLC0415  (moved into the core package)

    assert real_model is importlib.import_module("kvcore.integrations.transformers_models")
    with pytest.raises(ModuleNotFoundError, match="kvcore_demo.no_such_demo"):
        importlib.import_module("kvcore.demo.no_such_demo")
    demo = importlib.import_module("kvcore.demo")
    with pytest.raises(AttributeError, match="'kvcore.demo' has no attribute 'no_such_demo'"):
        demo.no_such_demo  # noqa: B018
    assert not hasattr(demo, "__all__")  # a dunder is never looked up as a submodule
    assert demo.sequence is importlib.import_module("kvcore_demo.sequence")


def test_the_deprecations_go_in_the_next_minor_release() -> None:
    """Past that release the paths must go: this fails once the version reaches it."""
    major, minor, _ = kvcore.__version__.split(".")
    assert REMOVED_IN == f"kvcore {major}.{int(minor) + 1}.0", kvcore.__version__
    table = (Path(__file__).resolve().parents[2] / "docs" / "deprecations.md").read_text()
    for old in OLD:
        assert f"`{old}`" in table, old
    assert table.count(f"| {REMOVED_IN.split()[1]} |") >= len(OLD)


def test_the_old_class_name_is_the_new_class(monkeypatch: pytest.MonkeyPatch) -> None:
    import kvcore.torch.paged as paged

    message = f"TorchPagedKV is deprecated: use kvcore.torch.TorchPagedKVPool (removed in {REMOVED_IN})"
    with pytest.warns(DeprecationWarning, match=re.escape(message)):
        assert paged.TorchPagedKV is TorchPagedKVPool  # type: ignore[attr-defined]
    monkeypatch.delitem(sys.modules, "kvcore.integrations.torch_paged", raising=False)
    with pytest.warns(DeprecationWarning):
        old = importlib.import_module("kvcore.integrations.torch_paged")
    assert old.TorchPagedKV is TorchPagedKVPool


def _batch() -> tuple[TorchPagedKVPool, bytes]:
    """A paged pool and the record of a 3-token sequence exported from another."""
    layers = [kvcore.LayerConfig(kvcore.Flat(), n_kv_heads=1, head_dim=4)]
    cfg = kvcore.CacheConfig(32, layers, max_step=4, batch=kvcore.BatchLimits(block_size=4, max_seqs=2, num_blocks=8))
    src = kvcore.BatchCache(cfg)
    numpy_pool = kvcore.PagedKVPool(src, np.float32)
    src.add_sequence(0)
    with src.step([(0, 3)]) as step:
        numpy_pool.update(0, step, np.ones((3, 1, 4), np.float32), np.ones((3, 1, 4), np.float32))
    return TorchPagedKVPool(kvcore.BatchCache(cfg)), numpy_pool.export_sequence(0)


def test_the_old_argument_order_of_torch_paged_import_warns_and_works() -> None:
    dest, record = _batch()
    message = r"import_sequence\(record, seq\) is deprecated.*\(removed in kvcore 0\.2\.0\)"
    with pytest.warns(DeprecationWarning, match=message):
        dest.import_sequence(record, 1)  # type: ignore[arg-type]
    assert dest.cache.sequence(1).length == 3


@pytest.mark.parametrize("keyword", [False, True])
def test_the_old_argument_order_of_state_import_warns_and_works(keyword: bool) -> None:
    dest, record = _batch()
    message = r"import_sequence\(pool, record, seq\) is deprecated.*\(removed in kvcore 0\.2\.0\)"
    with pytest.warns(DeprecationWarning, match=message):
        if keyword:
            state.import_sequence(dest, record, seq=1)
        else:
            state.import_sequence(dest, record, 1)
    assert dest.cache.sequence(1).length == 3


def test_the_new_argument_order_does_not_warn() -> None:
    dest, record = _batch()
    state.import_sequence(dest, 1, record)
    dest2, _ = _batch()
    dest2.import_sequence(1, record)
    one = TorchKVPool(kvcore.SequenceCache(kvcore.CacheConfig(32, [kvcore.LayerConfig(kvcore.Flat(), 1, 4)], max_step=4)))
    with pytest.raises(kvcore.InvalidArgumentError, match="holds one sequence"):
        state.import_sequence(one, 1, record)
