"""Per-key locks, so concurrent work on the same content-addressed key happens once."""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator

__all__ = ["KeyedLocks"]


class KeyedLocks:
    """One lock per key, created on demand.

    A key's lock lives only while someone holds or waits for it, so a long-running
    server does not accumulate one lock per image it ever saw.
    """

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[str, list] = {}  # key -> [lock, holders and waiters]

    @contextmanager
    def hold(self, key: str) -> Iterator[None]:
        """Hold the lock of ``key`` for the duration of the ``with`` block."""
        with self._guard:
            entry = self._locks.setdefault(key, [threading.Lock(), 0])
            entry[1] += 1
        try:
            with entry[0]:
                yield
        finally:
            with self._guard:
                entry[1] -= 1
                if entry[1] == 0:
                    del self._locks[key]

    def __len__(self) -> int:
        return len(self._locks)
