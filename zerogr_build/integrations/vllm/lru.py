"""A bounded, thread-safe least-recently-used cache: what every cache of the vLLM integration is.

    cache = Lru(8)
    value = cache.get_or_make(key, lambda: build(...))   # built once per key while it stays cached

A request can make a new key (a version, an availability file, a list of ids), so no cache here may grow
with the requests: the oldest entry goes when a new one would pass `size`. A value that is still in use
elsewhere (a request holding its bundle version) lives on through that reference; only the cache forgets it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

V = TypeVar("V")


class Lru(Generic[V]):
    """At most `size` values by key; the least recently used one goes first."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"an Lru needs room for at least one entry, got {size}")
        self.size = size
        self._items: OrderedDict[Hashable, V] = OrderedDict()
        self._lock = threading.RLock()

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: Hashable) -> bool:
        with self._lock:
            return key in self._items

    def peek(self, key: Hashable) -> V | None:
        """The value of `key`, or None, leaving the order alone."""
        with self._lock:
            return self._items.get(key)

    def get(self, key: Hashable) -> V | None:
        """The value of `key` (now the most recently used), or None."""
        with self._lock:
            value = self._items.get(key)
            if value is not None:
                self._items.move_to_end(key)
            return value

    def put(self, key: Hashable, value: V) -> V:
        """Store `value` under `key`, dropping the least recently used entries beyond `size`."""
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self.size:
                self._items.popitem(last=False)
            return value

    def get_or_make(self, key: Hashable, make: Callable[[], V]) -> V:
        """The cached value of `key`, else make() stored under it. make runs outside the lock (it may read
        files), so two threads may both make a missing value; the first stored wins."""
        value = self.get(key)
        if value is not None:
            return value
        made = make()
        with self._lock:
            value = self._items.get(key)
            return value if value is not None else self.put(key, made)


__all__ = ["Lru"]
