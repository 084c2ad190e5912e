"""The process-wide cache registry, shared with C++.

A runner installs a cache under a key; a backend (Python, or C++ in this module
or another extension module) finds it by that key. These functions act on the
same C++ registry as ``kvcore::global_caches()``, so a cache installed
here is visible to C++ code and vice versa. All of them are thread-safe.

``Session`` installs a cache for the duration of a ``with`` block and erases it
on exit, also when the block raises.
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import TypeVar, overload

from kvcore import _core
from kvcore._core import CacheBase, CacheConfig
from kvcore._errors import InvalidArgumentError, InvalidStateError, NotFoundError

_Cache = TypeVar("_Cache", bound=CacheBase)

__all__ = [
    "Session",
    "build",
    "builders",
    "has_builder",
    "register_builder",
    "unregister_builder",
    "contains",
    "erase",
    "find",
    "get",
    "install",
    "keys",
    "unique_key",
]


def install(key: str, cache: CacheBase) -> None:
    """Install ``cache`` under ``key``; never overwrites.

    Raises InvalidArgumentError for an empty key or ``cache=None`` and
    AlreadyRegisteredError when the key is taken.
    """
    _core.registry_install(key, cache)


def get(key: str) -> CacheBase | None:
    """The cache under ``key``, or None."""
    return _core.registry_get(key)


@overload
def find(key: str) -> CacheBase: ...
@overload
def find(key: str, kind: type[_Cache]) -> _Cache: ...
def find(key: str, kind: type[CacheBase] = CacheBase) -> CacheBase:
    """The cache under ``key``; NotFoundError when there is none.

    ``kind`` (a CacheBase subclass such as SequenceCache) types the result:
    InvalidArgumentError when the cache is not one. Caches C++ code built without
    RTTI reach Python as plain CacheBase.
    """
    if not (isinstance(kind, type) and issubclass(kind, CacheBase)):
        raise InvalidArgumentError(f"kind = {kind!r}: must be CacheBase or a subclass, such as SequenceCache")
    cache = _core.registry_find(key)
    if not isinstance(cache, kind):
        raise InvalidArgumentError(
            f"kind = {kind.__name__}: the cache under key {key!r} is a {type(cache).__name__}"
        )
    return cache


def contains(key: str) -> bool:
    """Whether a cache is installed under ``key``."""
    return _core.registry_contains(key)


def erase(key: str) -> None:
    """Remove ``key``; NotFoundError when absent. Holders keep the cache alive."""
    _core.registry_erase(key)


def keys() -> list[str]:
    """The installed keys, sorted."""
    return _core.registry_keys()


def unique_key(prefix: str = "cache") -> str:
    """A key ``"prefix#N"`` no installed cache uses, distinct across threads.

    It reserves nothing; ``Session`` picks and installs in one step.
    """
    return _core.registry_unique_key(prefix)


def register_builder(backend: str, kind: str, fn: Callable[[CacheConfig], CacheBase]) -> None:
    """Register ``fn(config) -> cache`` as the builder of ``(backend, kind)``.

    C++ code (``global_builders().build(...)``, from any thread)
    may call it: it takes the GIL itself. Raises InvalidArgumentError for an
    empty name or a non-callable ``fn`` and AlreadyRegisteredError when the pair
    has a builder. kvcore registers ``("cpu", "sequence")`` at import.
    """
    _core.register_builder(backend, kind, fn)


def unregister_builder(backend: str, kind: str) -> None:
    """Remove the builder of ``(backend, kind)``; NotFoundError when absent.

    A build already running with it finishes normally.
    """
    _core.unregister_builder(backend, kind)


def has_builder(backend: str, kind: str) -> bool:
    """Whether ``(backend, kind)`` has a builder."""
    return _core.has_builder(backend, kind)


def builders() -> list[tuple[str, str]]:
    """The registered ``(backend, kind)`` pairs, sorted."""
    return _core.builders()


def build(backend: str, kind: str, config: CacheConfig) -> CacheBase:
    """Build a cache with the builder of ``(backend, kind)``.

    NotFoundError when there is none; InvalidArgumentError when ``config``
    breaks a rule (builders never see such configs). An exception a Python
    builder raises propagates unchanged; a C++ builder's error raises the
    kvcore exception of its code. A builder returning None or a non-cache
    raises InternalError.
    """
    return _core.build(backend, kind, config)


class Session:
    """A cache installed in the registry while a ``with`` block runs.

    ``Session(backend, kind, config)`` builds the cache with the builder of
    ``(backend, kind)`` right away (builder errors raise here);
    ``Session.adopt(cache)`` takes an existing one. Entering installs it under a
    fresh key ``"backend/kind#N"`` (``"session#N"`` when adopted); leaving erases
    that key, also when the block raises. A key someone else erased or reused in
    the meantime is left alone. A session may be entered again after it exited
    (under a new key), but not while it is active.
    """

    def __init__(self, backend: str, kind: str, config: CacheConfig) -> None:
        self._cache: CacheBase = _core.build(backend, kind, config)
        self._prefix = f"{backend}/{kind}"
        self._key: str | None = None

    @classmethod
    def adopt(cls, cache: CacheBase, prefix: str = "session") -> Session:
        """A session for an existing cache, installed under ``"prefix#N"``."""
        if not isinstance(cache, CacheBase):
            raise InvalidArgumentError(
                f"Session.adopt: cache is a {type(cache).__name__}, not a kvcore cache"
            )
        session = cls.__new__(cls)
        session._cache = cache
        session._prefix = prefix
        session._key = None
        return session

    @property
    def cache(self) -> CacheBase:
        """The cache (it outlives the session while anyone holds it)."""
        return self._cache

    @property
    def key(self) -> str:
        """The key while active; InvalidStateError outside the ``with`` block."""
        if self._key is None:
            raise InvalidStateError("the session is not active: use it in a `with` block")
        return self._key

    @property
    def active(self) -> bool:
        """Whether the cache is installed by this session right now."""
        return self._key is not None

    def __enter__(self) -> Session:
        if self._key is not None:
            raise InvalidStateError(f"the session is already active under key {self._key!r}")
        self._key = _core.registry_install_unique(self._prefix, self._cache)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        key, self._key = self._key, None
        if key is None:
            return
        try:
            _core.registry_erase_if_same(key, self._cache)
        except NotFoundError:
            pass  # someone else erased or reused the key: theirs now

    def __repr__(self) -> str:
        state = f"key={self._key!r}" if self._key is not None else "inactive"
        return f"Session({state}, cache={self._cache!r})"
