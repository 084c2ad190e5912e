"""The host tier's eviction order (``Segments``): a segmented LRU (a *probation* segment that
new entries enter and a *protected* one that entries used again move to, its bytes capped at a
fraction of the tier's) over keys whose entries may extend one another, kept so that the next
entry evicted never has a held extension."""

from __future__ import annotations

from collections import OrderedDict
from typing import Generic, Iterator, Optional, Protocol, TypeVar

K = TypeVar("K")


class Sized(Protocol):
    """An entry that knows its bytes."""

    @property
    def nbytes(self) -> int:
        """The entry's bytes, counted against the protected segment's cap."""


V = TypeVar("V", bound=Sized)


class Segments(Generic[K, V]):
    """Entries in two least-recently-used orders, the least recently used first in each:
    ``probation`` (entered by ``add``) and ``protected`` (entered by ``touch``: an entry used
    again), whose bytes are kept at most ``protected_bytes`` by moving its least recently used
    entries back to probation's newest end. ``oldest`` is the next entry to evict: probation's
    least recently used, then protected's. protected_bytes = 0 is one plain LRU order.

    The callers keep one rule that makes ``oldest`` never an entry another held entry extends:
    an entry is added after (newer than) the entries that extend it are, and touched before its
    extensions' parents (a run of blocks is touched from its last to its first)."""

    def __init__(self, protected_bytes: int) -> None:
        self.protected_bytes = protected_bytes
        self._probation: OrderedDict[K, V] = OrderedDict()
        self._protected: OrderedDict[K, V] = OrderedDict()
        self._protected_held = 0

    def __len__(self) -> int:
        """Entries held in both segments."""
        return len(self._probation) + len(self._protected)

    def __contains__(self, key: object) -> bool:
        """Is `key` held (in either segment)?"""
        return key in self._probation or key in self._protected

    def __getitem__(self, key: K) -> V:
        """The entry of `key` (KeyError if not held); no recency moves."""
        got = self._probation.get(key)
        return got if got is not None else self._protected[key]

    def __iter__(self) -> Iterator[K]:
        """Every key, older before newer: probation's, then protected's."""
        yield from list(self._probation)
        yield from list(self._protected)

    def add(self, key: K, value: V) -> None:
        """A new entry, probation's newest."""
        self._probation[key] = value

    def touch(self, key: K) -> None:
        """`key` was used: the newest of protected (moved there from probation)."""
        if key in self._protected:
            self._protected.move_to_end(key)
            return
        value = self._probation.pop(key)
        self._protected[key] = value
        self._protected_held += value.nbytes
        while self._protected_held > self.protected_bytes and self._protected:
            old, moved = self._protected.popitem(last=False)
            self._protected_held -= moved.nbytes
            self._probation[old] = moved

    def refresh(self, key: K) -> None:
        """`key`, if in probation, becomes its newest (after adds of entries that extend it)."""
        if key in self._probation:
            self._probation.move_to_end(key)

    def oldest(self, keep: Optional[set[K]] = None) -> Optional[K]:
        """The next key to evict, None if none; with `keep` (a run just touched, the newest of
        both orders), None once only keys of it are left at either front."""
        for order in (self._probation, self._protected):
            if order:
                key = next(iter(order))
                if keep is None or key not in keep:
                    return key
        return None

    def pop(self, key: K) -> V:
        """Removes `key` and returns its entry (KeyError if not held)."""
        value = self._probation.pop(key, None)
        if value is None:
            value = self._protected.pop(key)
            self._protected_held -= value.nbytes
        return value

    def clear(self) -> None:
        """Forgets every entry."""
        self._probation.clear()
        self._protected.clear()
        self._protected_held = 0
