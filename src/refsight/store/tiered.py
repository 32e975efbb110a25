"""Tiers composed into one store: fastest first (memory), most durable last (disk).

Reads try each tier in order and copy a hit into every faster tier (so the next
read of a hot package costs a dictionary lookup). Writes go to every tier, the
most durable first: if the process dies mid-write, the package is on disk or
nowhere, never only in memory. (Evictions are counted by whoever owns the memory
tier, through its ``on_evict``: the :class:`~refsight.store.Store` counts them.)

Each tier's hits, misses and bytes served (the package's tensor bytes) are counted here,
per process, in :attr:`TieredPackageStore.counts` (``stats`` and ``/metrics`` show them).
A tier that cannot answer (the Redis tier during an outage) answers a miss.
"""

from __future__ import annotations

import threading
from typing import Any, Iterator, Sequence

from ..errors import InvalidInputError
from ..package import VisualPackage
from .base import PackageStore

__all__ = ["TieredPackageStore"]


class TieredPackageStore(PackageStore):
    """``tiers[0]`` is the fastest; ``tiers[-1]`` the durable one."""

    def __init__(self, tiers: Sequence[PackageStore]) -> None:
        if not tiers:
            raise InvalidInputError(tiers, "a tiered store needs at least one tier")
        self.tiers = list(tiers)
        self._lock = threading.Lock()
        #: Per tier name: ``hits``, ``misses`` and ``bytes`` (tensor bytes its hits served), this process.
        self.counts = {tier.name: {"hits": 0, "misses": 0, "bytes": 0} for tier in self.tiers}

    def get(self, key: str) -> VisualPackage | None:
        """The first tier's hit, promoted into the faster tiers; None when no tier has it."""
        for i, tier in enumerate(self.tiers):
            try:
                package = tier.get(key)  # a corrupt disk copy raises here: never served
            except Exception:
                self._count(tier.name, "misses", 1)
                raise
            if package is not None:
                self._count(tier.name, "hits", 1, package.nbytes)
                for faster in self.tiers[:i]:
                    faster.put(package)
                return package
            self._count(tier.name, "misses", 1)
        return None

    def _count(self, tier: str, field: str, n: int, nbytes: int = 0) -> None:
        with self._lock:
            counts = self.counts[tier]
            counts[field] += n
            counts["bytes"] += nbytes

    @property
    def tier_hits(self) -> dict[str, int]:
        """Hits per tier name in this process (the ``hits`` of :meth:`tier_stats`)."""
        with self._lock:
            return {name: counts["hits"] for name, counts in self.counts.items()}

    def tier_stats(self) -> dict[str, dict[str, Any]]:
        """Per tier, fastest first: hits, misses, bytes served, and what the tier tells of itself (``tier_info()``)."""
        with self._lock:
            out = {name: dict(counts) for name, counts in self.counts.items()}
        for tier in self.tiers:
            info = getattr(tier, "tier_info", None)
            if callable(info):
                out[tier.name].update(info())
        return out

    def put(self, package: VisualPackage) -> int:
        """Write to every tier, durable tier first; returns the durable tier's size."""
        size = 0
        for tier in reversed(self.tiers):
            n = tier.put(package)
            if tier is self.tiers[-1]:
                size = n
        return size

    def contains(self, key: str) -> bool:
        """Whether any tier holds ``key``."""
        return any(tier.contains(key) for tier in self.tiers)

    def delete(self, key: str) -> bool:
        """Remove ``key`` from every tier, fastest first (so no stale copy outlives the durable one)."""
        removed = False
        for tier in self.tiers:
            removed = tier.delete(key) or removed
        return removed

    def keys(self) -> Iterator[str]:
        """Every key any tier holds (durable tier first, no duplicates)."""
        seen: set[str] = set()
        for tier in reversed(self.tiers):
            for key in tier.keys():
                if key not in seen:
                    seen.add(key)
                    yield key

    def close(self) -> None:
        """Close every tier."""
        for tier in self.tiers:
            tier.close()
