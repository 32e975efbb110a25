"""Tiers composed into one store: fastest first (memory), most durable last (disk).

Reads try each tier in order and copy a hit into every faster tier (so the next
read of a hot package costs a dictionary lookup). Writes go to every tier, the
most durable first: if the process dies mid-write, the package is on disk or
nowhere, never only in memory. (Evictions are counted by whoever owns the memory
tier, through its ``on_evict``: the :class:`~refsight.store.Store` counts them.)
"""

from __future__ import annotations

from typing import Iterator, Sequence

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
        #: Hits per tier in this process (statistics: unlocked increments may rarely lose one).
        self.tier_hits = {getattr(tier, "tier_name", type(tier).__name__): 0 for tier in self.tiers}

    def get(self, key: str) -> VisualPackage | None:
        """The first tier's hit, promoted into the faster tiers; None when no tier has it."""
        for i, tier in enumerate(self.tiers):
            package = tier.get(key)  # a corrupt disk copy raises here: never served
            if package is not None:
                self.tier_hits[getattr(tier, "tier_name", type(tier).__name__)] += 1
                for faster in self.tiers[:i]:
                    faster.put(package)
                return package
        return None

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
