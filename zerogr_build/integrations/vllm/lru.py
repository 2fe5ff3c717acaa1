"""A bounded, thread-safe least-recently-used cache: what every cache of the vLLM integration is.

    cache = Lru(8)
    value = cache.get_or_make(key, lambda: build(...))   # built once per key while it stays cached
    files = Lru(8, max_bytes=64 << 20, weight=lambda ids: ids.nbytes)   # also at most 64 MiB in all

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
    """At most `size` values by key and, with max_bytes, at most max_bytes of weight(value) in all; the least
    recently used one goes first. A value heavier than max_bytes alone is returned but not kept."""

    def __init__(
        self, size: int, max_bytes: int | None = None, weight: Callable[[V], int] | None = None
    ) -> None:
        if size < 1:
            raise ValueError(f"an Lru needs room for at least one entry, got {size}")
        if (max_bytes is None) != (weight is None):
            raise ValueError("an Lru bounded in bytes needs both max_bytes and weight")
        self.size = size
        self.max_bytes = max_bytes
        self._weight = weight
        self._bytes = 0
        self._weights: dict[Hashable, int] = {}
        self._items: OrderedDict[Hashable, V] = OrderedDict()
        self._lock = threading.RLock()

    @property
    def nbytes(self) -> int:
        """The weight of the values kept (0 without max_bytes)."""
        return self._bytes

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
            self._forget(key)
            if self._weight is not None:
                assert self.max_bytes is not None
                weight = int(self._weight(value))
                if weight > self.max_bytes:
                    return value
                self._weights[key] = weight
                self._bytes += weight
            self._items[key] = value
            while len(self._items) > self.size or (
                self.max_bytes is not None and self._bytes > self.max_bytes
            ):
                self._forget(next(iter(self._items)))
            return value

    def _forget(self, key: Hashable) -> None:
        if self._items.pop(key, None) is not None:
            self._bytes -= self._weights.pop(key, 0)

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
