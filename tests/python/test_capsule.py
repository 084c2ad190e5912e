"""Another extension module reaches kvcore's registries through the versioned
PyCapsule and kvcore/adapters/python_capsule.h. The probe module (conftest's probe_path)
is built the way an embedded backend is: hidden visibility, no exceptions, no RTTI."""

from __future__ import annotations

import ctypes
import importlib.util
import re
import threading
from pathlib import Path
from types import ModuleType

import pytest

import kvcore
from kvcore import _core, registry

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def probe(probe_path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("kvcore_capsule_probe", probe_path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def config(capacity: int) -> kvcore.CacheConfig:
    return kvcore.CacheConfig(capacity, kvcore.LayerConfig(kvcore.Flat(), n_kv_heads=1, head_dim=4))


def capsule_pointer() -> int:
    get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
    get_pointer.restype = ctypes.c_void_p
    get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    address = get_pointer(_core.registry_storage_v2, b"kvcore._core.registry_storage_v2")
    assert isinstance(address, int)
    return address


def test_the_capsule_name_carries_the_abi_version_of_the_headers() -> None:
    header = (ROOT / "cpp" / "include" / "kvcore" / "registry" / "registry_storage.h").read_text()
    match = re.search(r"kRegistryAbiVersion = (\d+);", header)
    assert match is not None
    version = int(match.group(1))
    assert _core.REGISTRY_ABI_VERSION == version
    assert hasattr(_core, f"registry_storage_v{version}")
    capsule_header = (ROOT / "cpp" / "include" / "kvcore" / "adapters" / "python_capsule.h").read_text()
    assert f'"kvcore._core.registry_storage_v{version}"' in capsule_header


def test_the_probe_uses_the_storage_kvcore_publishes(probe: ModuleType) -> None:
    assert probe.storage_address() == capsule_pointer()


def test_a_cache_installed_from_python_is_found_by_the_other_extension(probe: ModuleType) -> None:
    with kvcore.Session.adopt(kvcore.SequenceCache(config(21)), prefix="to-probe") as s:
        key = s.key
        assert probe.capacity(key) == 21
    assert probe.capacity(key) == -1  # erased on exit


def test_a_cache_installed_by_the_other_extension_is_found_from_python(probe: ModuleType) -> None:
    key = registry.unique_key("from-probe")
    probe.install_sequence(key, 14)
    try:
        found = registry.find(key)
        # Made by code without RTTI: Python sees it as a plain kvcore cache
        # (never a crash), and can still pass it around.
        assert isinstance(found, kvcore.CacheBase)
        assert not isinstance(found, kvcore.SequenceCache)
        with kvcore.Session.adopt(found) as s:
            assert probe.capacity(s.key) == 14
    finally:
        registry.erase(key)
    assert probe.erase(key) == int(kvcore.Error.NotFound)


def test_erasing_in_the_other_extension_is_seen_from_python(probe: ModuleType) -> None:
    key = registry.unique_key("erase-in-probe")
    registry.install(key, kvcore.SequenceCache(config(4)))
    assert probe.erase(key) == int(kvcore.Error.Ok)
    assert not registry.contains(key)


@pytest.mark.parametrize("release_gil", [False, True])
def test_the_other_extension_calls_a_python_builder(probe: ModuleType, release_gil: bool) -> None:
    calls: list[int] = []

    def builder(cfg: kvcore.CacheConfig) -> kvcore.CacheBase:
        calls.append(cfg.capacity)
        return kvcore.SequenceCache(cfg)

    kvcore.register_builder("py", f"for-probe-{release_gil}", builder)
    try:
        assert probe.build_capacity("py", f"for-probe-{release_gil}", 19, release_gil) == 19
    finally:
        kvcore.unregister_builder("py", f"for-probe-{release_gil}")
    assert calls == [19]


def test_a_python_builder_error_reaches_cpp_as_its_code(probe: ModuleType) -> None:
    def invalid(cfg: kvcore.CacheConfig) -> kvcore.CacheBase:
        raise kvcore.InvalidArgumentError("this backend needs head_dim 64")

    def broken(cfg: kvcore.CacheConfig) -> kvcore.CacheBase:
        raise ZeroDivisionError("oops")

    kvcore.register_builder("py", "probe-invalid", invalid)
    kvcore.register_builder("py", "probe-broken", broken)
    try:
        with pytest.raises(RuntimeError, match=r"0x12: .*InvalidArgumentError: this backend needs head_dim 64"):
            probe.build_capacity("py", "probe-invalid", 8, True)
        with pytest.raises(RuntimeError, match=r"0x01: .*ZeroDivisionError: oops"):
            probe.build_capacity("py", "probe-broken", 8, False)
    finally:
        kvcore.unregister_builder("py", "probe-invalid")
        kvcore.unregister_builder("py", "probe-broken")


def test_cpp_threads_without_the_gil_run_a_python_builder_that_uses_the_registry(probe: ModuleType) -> None:
    # Each call takes the GIL from a thread that never had it, and the builder
    # itself goes back into the registries: no deadlock, nothing lost.
    made: list[str] = []
    lock = threading.Lock()

    def builder(cfg: kvcore.CacheConfig) -> kvcore.CacheBase:
        cache = kvcore.build("cpu", "sequence", cfg)
        key = registry.unique_key("threaded-builder")
        registry.install(key, cache)
        registry.erase(key)
        with lock:
            made.append(key)
        return cache

    kvcore.register_builder("py", "threaded", builder)
    try:
        assert probe.build_in_threads("py", "threaded", 6, 4, 50) == 200
    finally:
        kvcore.unregister_builder("py", "threaded")
    assert len(set(made)) == 200


def test_a_builder_of_the_other_extension_builds_for_python(probe: ModuleType) -> None:
    probe.register_builder("probe", "sequence")
    try:
        before = probe.probe_builds()
        cache = kvcore.build("probe", "sequence", config(10))
        assert probe.probe_builds() == before + 1
        assert isinstance(cache, kvcore.CacheBase)
        with kvcore.Session("probe", "sequence", config(12)) as s:
            assert probe.capacity(s.key) == 12
    finally:
        kvcore.unregister_builder("probe", "sequence")
