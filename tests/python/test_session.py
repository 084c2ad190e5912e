"""kvcore.Session: installs on enter, erases on exit, also when the body raises."""

from __future__ import annotations

import pytest

import kvcore
from kvcore import registry


def config(capacity: int = 16) -> kvcore.CacheConfig:
    return kvcore.CacheConfig(capacity, kvcore.LayerConfig(kvcore.Flat(), n_kv_heads=1, head_dim=4))


def test_installs_on_enter_and_erases_on_exit() -> None:
    session = kvcore.Session("cpu", "sequence", config(8))
    assert not session.active
    with session as s:
        assert s is session and s.active
        key = s.key
        assert key.startswith("cpu/sequence#")
        assert registry.find(key) is s.cache
    assert not session.active
    assert not registry.contains(key)


def test_erases_when_the_body_raises_and_the_exception_propagates() -> None:
    class Boom(Exception):
        pass

    session = kvcore.Session("cpu", "sequence", config())
    with pytest.raises(Boom):
        with session:
            key = session.key
            assert registry.contains(key)
            raise Boom
    assert not registry.contains(key)
    assert not session.active


def test_the_cache_outlives_the_session() -> None:
    with kvcore.Session("cpu", "sequence", config(5)) as s:
        backend_handle = registry.find(s.key)
    assert isinstance(backend_handle, kvcore.SequenceCache)
    with backend_handle.step(5):
        pass
    assert backend_handle.length == 5


def test_two_sessions_have_distinct_keys() -> None:
    with kvcore.Session("cpu", "sequence", config()) as a, kvcore.Session("cpu", "sequence", config()) as b:
        assert a.key != b.key
        assert registry.find(a.key) is a.cache and registry.find(b.key) is b.cache


def test_adopt_installs_an_existing_cache() -> None:
    cache = kvcore.SequenceCache(config(7))
    with kvcore.Session.adopt(cache) as s:
        assert s.key.startswith("session#")
        assert registry.find(s.key) is cache
        key = s.key
    assert not registry.contains(key)
    with kvcore.Session.adopt(cache, prefix="runner") as s:
        assert s.key.startswith("runner#")


def test_adopt_refuses_a_non_cache() -> None:
    with pytest.raises(kvcore.InvalidArgumentError, match="not a kvcore cache"):
        kvcore.Session.adopt(object())  # type: ignore[arg-type]


def test_key_outside_the_block_is_an_invalid_state() -> None:
    session = kvcore.Session("cpu", "sequence", config())
    with pytest.raises(kvcore.InvalidStateError, match="not active"):
        _ = session.key
    with session:
        pass
    with pytest.raises(kvcore.InvalidStateError):
        _ = session.key


def test_entering_an_active_session_again_is_refused_and_changes_nothing() -> None:
    session = kvcore.Session("cpu", "sequence", config())
    with session:
        key = session.key
        before = registry.keys()
        with pytest.raises(kvcore.InvalidStateError, match="already active"):
            session.__enter__()
        assert registry.keys() == before and session.key == key
    assert not registry.contains(key)


def test_a_session_may_be_entered_again_after_exit() -> None:
    session = kvcore.Session("cpu", "sequence", config())
    with session:
        first = session.key
    with session:
        second = session.key
        assert registry.find(second) is session.cache
    assert first != second
    assert not registry.contains(second)


def test_exit_leaves_a_key_someone_else_reused_alone() -> None:
    theirs = kvcore.SequenceCache(config(3))
    with kvcore.Session("cpu", "sequence", config()) as s:
        key = s.key
        registry.erase(key)
        registry.install(key, theirs)
    assert registry.find(key) is theirs
    registry.erase(key)


def test_exit_tolerates_a_key_someone_else_erased() -> None:
    with kvcore.Session("cpu", "sequence", config()) as s:
        registry.erase(s.key)
    assert not s.active


def test_build_errors_raise_at_construction_and_install_nothing() -> None:
    before = registry.keys()
    with pytest.raises(kvcore.NotFoundError, match="'paged'"):
        kvcore.Session("gpu", "paged", config())
    assert registry.keys() == before


def test_a_python_builder_backs_a_session() -> None:
    kvcore.register_builder("py", "session-backed", lambda cfg: kvcore.SequenceCache(cfg))
    try:
        with kvcore.Session("py", "session-backed", config(9)) as s:
            assert s.key.startswith("py/session-backed#")
            assert s.cache.capacity == 9  # type: ignore[attr-defined]
    finally:
        kvcore.unregister_builder("py", "session-backed")
