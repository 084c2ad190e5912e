"""kvcore.registry and the builder registry from Python: the same C++ registries
C++ code sees through global()."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

import kvcore
from kvcore import registry


def config(capacity: int = 16) -> kvcore.CacheConfig:
    return kvcore.CacheConfig(capacity, kvcore.LayerConfig(kvcore.Ring(4), n_kv_heads=1, head_dim=4), max_step=4)


@pytest.fixture
def clean_keys() -> Iterator[list[str]]:
    """Keys a test installs; erased afterwards so tests stay independent."""
    keys: list[str] = []
    yield keys
    for key in keys:
        if registry.contains(key):
            registry.erase(key)


@pytest.fixture
def clean_builders() -> Iterator[list[tuple[str, str]]]:
    pairs: list[tuple[str, str]] = []
    yield pairs
    for backend, kind in pairs:
        if registry.has_builder(backend, kind):
            kvcore.unregister_builder(backend, kind)


# --- caches by key ----------------------------------------------------------------


def test_install_get_find_erase(clean_keys: list[str]) -> None:
    cache = kvcore.SequenceCache(config())
    key = registry.unique_key("test")
    clean_keys.append(key)
    registry.install(key, cache)
    assert registry.contains(key)
    assert registry.get(key) is cache
    assert registry.find(key) is cache
    assert key in registry.keys()
    registry.erase(key)
    assert registry.get(key) is None
    assert not registry.contains(key)


def test_find_with_a_kind_types_the_cache_or_refuses_and_changes_nothing(clean_keys: list[str]) -> None:
    class Subclass(kvcore.SequenceCache):
        pass

    cache = kvcore.SequenceCache(config())
    key = registry.unique_key("typed")
    clean_keys.append(key)
    registry.install(key, cache)
    assert registry.find(key, kvcore.SequenceCache) is cache
    assert registry.find(key, kvcore.CacheBase) is cache
    with pytest.raises(kvcore.InvalidArgumentError, match=f"kind = Subclass: the cache under key '{key}' is a SequenceCache"):
        registry.find(key, Subclass)
    for bad in (int, "SequenceCache", None):
        with pytest.raises(kvcore.InvalidArgumentError, match="must be CacheBase or a subclass"):
            registry.find(key, bad)  # type: ignore[arg-type]
    assert registry.find(key) is cache  # still installed
    with pytest.raises(kvcore.NotFoundError, match="absent"):
        registry.find(registry.unique_key("absent"), kvcore.SequenceCache)


def test_duplicate_key_is_refused_and_keeps_the_first(clean_keys: list[str]) -> None:
    first, second = kvcore.SequenceCache(config(8)), kvcore.SequenceCache(config(9))
    key = registry.unique_key("dup")
    clean_keys.append(key)
    registry.install(key, first)
    with pytest.raises(kvcore.AlreadyRegisteredError, match=key) as info:
        registry.install(key, second)
    assert isinstance(info.value, ValueError)
    assert info.value.code == kvcore.Error.RegistrationAlreadyRegistered
    assert registry.get(key) is first


def test_missing_key_is_not_found() -> None:
    key = registry.unique_key("absent")
    assert registry.get(key) is None
    with pytest.raises(kvcore.NotFoundError, match=key):
        registry.find(key)
    with pytest.raises(KeyError):
        registry.erase(key)


def test_empty_key_or_none_cache_is_invalid_and_changes_nothing() -> None:
    before = registry.keys()
    with pytest.raises(kvcore.InvalidArgumentError, match="key is empty"):
        registry.install("", kvcore.SequenceCache(config()))
    with pytest.raises(kvcore.InvalidArgumentError, match="None"):
        registry.install(registry.unique_key("none"), None)  # type: ignore[arg-type]
    with pytest.raises(kvcore.InvalidArgumentError):
        registry.erase("")
    assert registry.keys() == before


def test_keys_are_sorted(clean_keys: list[str]) -> None:
    stem = registry.unique_key("sorted")
    for suffix in ("c", "a", "b"):
        clean_keys.append(f"{stem}/{suffix}")
        registry.install(f"{stem}/{suffix}", kvcore.SequenceCache(config()))
    mine = [k for k in registry.keys() if k.startswith(stem + "/")]
    assert mine == [f"{stem}/a", f"{stem}/b", f"{stem}/c"]
    assert registry.keys() == sorted(registry.keys())


def test_a_holder_keeps_the_cache_after_erase(clean_keys: list[str]) -> None:
    key = registry.unique_key("held")
    registry.install(key, kvcore.SequenceCache(config(12)))
    held = registry.find(key)
    registry.erase(key)
    assert isinstance(held, kvcore.SequenceCache)
    with held.step(3):
        pass
    assert held.length == 3 and held.capacity == 12


def test_unique_keys_across_8_threads_of_10000() -> None:
    made: list[list[str]] = [[] for _ in range(8)]

    def work(out: list[str]) -> None:
        for _ in range(10000):
            out.append(registry.unique_key("py-threads"))

    threads = [threading.Thread(target=work, args=(out,)) for out in made]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    all_keys = [k for out in made for k in out]
    assert len(set(all_keys)) == 80000
    assert all(k.startswith("py-threads#") for k in all_keys)


def test_unique_key_skips_installed_keys(clean_keys: list[str]) -> None:
    key = registry.unique_key("skip")
    clean_keys.append(key)
    registry.install(key, kvcore.SequenceCache(config()))
    assert all(registry.unique_key("skip") != key for _ in range(100))


def test_concurrent_install_erase_get_loses_nothing() -> None:
    stem = registry.unique_key("py-stress")
    errors: list[BaseException] = []

    def work(t: int) -> None:
        try:
            for k in range(300):
                cache = kvcore.SequenceCache(config(8 + t))
                registry.install(f"{stem}/{t}/{k}", cache)
                other = registry.get(f"{stem}/{(t + 1) % 8}/{k}")
                assert other is None or other.capacity == 8 + (t + 1) % 8  # type: ignore[attr-defined]
                if k % 2:
                    registry.erase(f"{stem}/{t}/{k}")
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []
    mine = [k for k in registry.keys() if k.startswith(stem + "/")]
    assert sorted(mine) == sorted(f"{stem}/{t}/{k}" for t in range(8) for k in range(0, 300, 2))
    for key in mine:
        t = int(key.split("/")[-2])
        assert registry.find(key).capacity == 8 + t  # type: ignore[attr-defined]
        registry.erase(key)


# --- builders ----------------------------------------------------------------------


def test_default_cpu_sequence_builder_is_registered() -> None:
    assert ("cpu", "sequence") in registry.builders()
    cache = kvcore.build("cpu", "sequence", config(20))
    assert isinstance(cache, kvcore.SequenceCache)  # made by C++, typed in Python
    assert cache.capacity == 20 and cache.max_step == 4


def test_a_cache_built_and_installed_by_cpp_is_the_same_python_object() -> None:
    with kvcore.Session("cpu", "sequence", config(11)) as session:
        found = registry.find(session.key)
        assert found is session.cache
        assert isinstance(found, kvcore.SequenceCache) and found.capacity == 11


def test_python_builder_register_build_unregister(clean_builders: list[tuple[str, str]]) -> None:
    seen: list[int] = []

    def builder(cfg: kvcore.CacheConfig) -> kvcore.CacheBase:
        seen.append(cfg.capacity)
        return kvcore.SequenceCache(cfg)

    clean_builders.append(("py", "seq"))
    kvcore.register_builder("py", "seq", builder)
    assert registry.has_builder("py", "seq")
    cache = kvcore.build("py", "seq", config(13))
    assert isinstance(cache, kvcore.SequenceCache) and cache.capacity == 13
    assert seen == [13]
    kvcore.unregister_builder("py", "seq")
    assert not registry.has_builder("py", "seq")
    with pytest.raises(kvcore.NotFoundError, match="'py'"):
        kvcore.build("py", "seq", config())


def test_duplicate_and_missing_builders(clean_builders: list[tuple[str, str]]) -> None:
    clean_builders.append(("py", "dup"))
    kvcore.register_builder("py", "dup", kvcore.SequenceCache)
    with pytest.raises(kvcore.AlreadyRegisteredError):
        kvcore.register_builder("py", "dup", kvcore.SequenceCache)
    with pytest.raises(kvcore.NotFoundError):
        kvcore.unregister_builder("py", "never-registered")
    with pytest.raises(kvcore.NotFoundError, match="'never-registered'"):
        kvcore.build("py", "never-registered", config())


def test_bad_builder_arguments_change_nothing() -> None:
    before = registry.builders()
    with pytest.raises(kvcore.InvalidArgumentError, match="not a callable"):
        kvcore.register_builder("py", "x", 42)  # type: ignore[arg-type]
    with pytest.raises(kvcore.InvalidArgumentError, match="backend_id is empty"):
        kvcore.register_builder("", "x", kvcore.SequenceCache)
    with pytest.raises(kvcore.InvalidArgumentError, match="kind is empty"):
        kvcore.register_builder("py", "", kvcore.SequenceCache)
    assert registry.builders() == before


def test_a_builder_exception_propagates_unchanged(clean_builders: list[tuple[str, str]]) -> None:
    boom = ValueError("boom")

    def builder(cfg: kvcore.CacheConfig) -> kvcore.CacheBase:
        raise boom

    clean_builders.append(("py", "raises"))
    kvcore.register_builder("py", "raises", builder)
    with pytest.raises(ValueError) as info:
        kvcore.build("py", "raises", config())
    assert info.value is boom


def test_a_builder_kvcore_error_keeps_its_class(clean_builders: list[tuple[str, str]]) -> None:
    def builder(cfg: kvcore.CacheConfig) -> kvcore.CacheBase:
        raise kvcore.CapacityError("no device memory for this cache")

    clean_builders.append(("py", "capacity"))
    kvcore.register_builder("py", "capacity", builder)
    with pytest.raises(kvcore.CapacityError, match="no device memory"):
        kvcore.build("py", "capacity", config())


@pytest.mark.parametrize("result", [None, 42, "cache"])
def test_a_builder_returning_no_cache_is_internal(clean_builders: list[tuple[str, str]], result: object) -> None:
    clean_builders.append(("py", "wrong"))
    kvcore.register_builder("py", "wrong", lambda cfg: result)  # type: ignore[arg-type,return-value]
    with pytest.raises(kvcore.InternalError, match="not a kvcore cache"):
        kvcore.build("py", "wrong", config())


def test_a_builder_may_use_the_registries_itself(clean_builders: list[tuple[str, str]], clean_keys: list[str]) -> None:
    # The builder runs outside the registry locks, with the GIL: it may install,
    # erase, register and build (nested) without deadlocking.
    def outer(cfg: kvcore.CacheConfig) -> kvcore.CacheBase:
        inner_cache = kvcore.build("cpu", "sequence", cfg)
        key = registry.unique_key("from-builder")
        clean_keys.append(key)
        registry.install(key, inner_cache)
        assert registry.find(key) is inner_cache
        kvcore.register_builder("py", "registered-inside", kvcore.SequenceCache)
        clean_builders.append(("py", "registered-inside"))
        return inner_cache

    clean_builders.append(("py", "outer"))
    kvcore.register_builder("py", "outer", outer)
    cache = kvcore.build("py", "outer", config(17))
    assert isinstance(cache, kvcore.SequenceCache) and cache.capacity == 17
    assert registry.has_builder("py", "registered-inside")


def test_a_nested_build_error_reaches_the_right_caller(clean_builders: list[tuple[str, str]]) -> None:
    inner_error = KeyError("inner")

    def inner(cfg: kvcore.CacheConfig) -> kvcore.CacheBase:
        raise inner_error

    def outer(cfg: kvcore.CacheConfig) -> kvcore.CacheBase:
        with pytest.raises(KeyError) as info:
            kvcore.build("py", "nested-inner", cfg)
        assert info.value is inner_error
        return kvcore.SequenceCache(cfg)  # the outer build still succeeds

    clean_builders.extend([("py", "nested-inner"), ("py", "nested-outer")])
    kvcore.register_builder("py", "nested-inner", inner)
    kvcore.register_builder("py", "nested-outer", outer)
    assert kvcore.build("py", "nested-outer", config(9)).capacity == 9  # type: ignore[attr-defined]


def test_a_builder_may_unregister_itself_while_running(clean_builders: list[tuple[str, str]]) -> None:
    def builder(cfg: kvcore.CacheConfig) -> kvcore.CacheBase:
        kvcore.unregister_builder("py", "once")
        return kvcore.SequenceCache(cfg)

    clean_builders.append(("py", "once"))
    kvcore.register_builder("py", "once", builder)
    assert kvcore.build("py", "once", config(6)).capacity == 6  # type: ignore[attr-defined]
    assert not registry.has_builder("py", "once")


def test_python_builders_from_many_python_threads(clean_builders: list[tuple[str, str]]) -> None:
    clean_builders.append(("py", "threads"))
    kvcore.register_builder("py", "threads", kvcore.SequenceCache)
    results: list[int] = []
    lock = threading.Lock()

    def work(capacity: int) -> None:
        for _ in range(50):
            c = kvcore.build("py", "threads", config(capacity))
            with lock:
                results.append(c.capacity)  # type: ignore[attr-defined]

    threads = [threading.Thread(target=work, args=(10 + t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == sorted(10 + t for t in range(8) for _ in range(50))
