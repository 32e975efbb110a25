"""Locks: per key, so concurrent work on the same content-addressed key happens once; and
readers-writer, so searches can overlap while changes run alone."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["KeyedLocks", "ReadWriteLock"]


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


class ReadWriteLock:
    """Many readers at once, or one writer alone; not reentrant.

    A writer that is waiting holds back readers that arrive after it, so a steady stream of
    readers cannot starve it.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._readers = 0
        self._writing = False
        self._writers_waiting = 0

    @contextmanager
    def reading(self) -> Iterator[None]:
        """Hold the lock shared for the duration of the ``with`` block."""
        with self._cond:
            while self._writing or self._writers_waiting:
                self._cond.wait()
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                if not self._readers:
                    self._cond.notify_all()

    @contextmanager
    def writing(self) -> Iterator[None]:
        """Hold the lock exclusively for the duration of the ``with`` block."""
        with self._cond:
            self._writers_waiting += 1
            while self._writing or self._readers:
                self._cond.wait()
            self._writers_waiting -= 1
            self._writing = True
        try:
            yield
        finally:
            with self._cond:
                self._writing = False
                self._cond.notify_all()
