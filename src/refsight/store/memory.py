"""The memory tier: an LRU of packages bounded by their tensor bytes.

A hit returns the very same :class:`VisualPackage` object (no copy), which is why
packages are treated as immutable. The total of ``package.nbytes`` never exceeds
``max_bytes``: a put evicts least-recently-used packages first, and a package
larger than the whole budget is simply not kept.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Callable, Iterator

from ..errors import InvalidInputError
from ..package import VisualPackage
from .base import PackageStore

__all__ = ["MemoryPackageStore", "EvictCallback"]

#: Called as ``on_evict(key, package)`` for each package pushed out to make room.
EvictCallback = Callable[[str, VisualPackage], None]


class MemoryPackageStore(PackageStore):
    """Thread-safe LRU of packages, at most ``max_bytes`` of tensor data."""

    tier_name = "memory"

    def __init__(self, max_bytes: int, *, on_evict: EvictCallback | None = None) -> None:
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
            raise InvalidInputError(max_bytes, "max_bytes must be a non-negative integer")
        self.max_bytes = max_bytes
        self.on_evict = on_evict
        self._items: OrderedDict[str, tuple[VisualPackage, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        """Tensor bytes currently held (always ≤ ``max_bytes``)."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: str) -> VisualPackage | None:
        """The cached package object itself (marked most recently used), or None."""
        with self._lock:
            item = self._items.get(key)
            if item is None:
                return None
            self._items.move_to_end(key)
            return item[0]

    def put(self, package: VisualPackage) -> int:
        """Cache ``package`` unless it alone exceeds the budget; returns its ``nbytes``."""
        key = package.key
        size = package.nbytes
        evicted: list[tuple[str, VisualPackage]] = []
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            if size <= self.max_bytes:
                while self._bytes + size > self.max_bytes:
                    victim, (victim_pkg, victim_size) = self._items.popitem(last=False)
                    self._bytes -= victim_size
                    evicted.append((victim, victim_pkg))
                self._items[key] = (package, size)
                self._bytes += size
        # Callbacks run outside the lock: they may write counters to SQLite or call
        # back into this store, and must not stall other readers meanwhile.
        if self.on_evict is not None:
            for victim, victim_pkg in evicted:
                self.on_evict(victim, victim_pkg)
        return size

    def contains(self, key: str) -> bool:
        """Whether ``key`` is cached (does not change the LRU order)."""
        return key in self._items

    def delete(self, key: str) -> bool:
        """Drop ``key`` (not counted as an eviction)."""
        with self._lock:
            item = self._items.pop(key, None)
            if item is None:
                return False
            self._bytes -= item[1]
            return True

    def keys(self) -> Iterator[str]:
        """Cached keys, least recently used first."""
        with self._lock:
            return iter(list(self._items))

    def clear(self) -> None:
        """Drop everything (not counted as evictions)."""
        with self._lock:
            self._items.clear()
            self._bytes = 0
