"""Package use, tracked without writing on reads: the last-use times the byte quota evicts by.

A hit must not write (policy 3: a write takes SQLite's cross-process lock). So each use is
noted here, in memory, as ``key → latest time``, and written to the package index in one
transaction with the counters (:class:`~refsight.store.counters.CounterBuffer` flushes it every
few seconds, on ``stats`` and on close), and right before an eviction decides what is least
recently used. A SIGKILL loses at most the last flush interval of this process's uses: those
packages merely look a few seconds older to the quota.

:class:`PinnedKeys` holds the packages running requests use, so the quota never evicts them.
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from .base import PackageIndex

__all__ = ["UsageBuffer", "PinnedKeys"]


class UsageBuffer:
    """Last-use times noted in memory, written to a :class:`PackageIndex` on :meth:`flush` (thread-safe)."""

    def __init__(self, index: PackageIndex) -> None:
        self._index = index
        self._pending: dict[str, float] = {}
        self._lock = threading.Lock()

    def note(self, key: str, when: float | None = None) -> None:
        """Record a use of ``key`` now (or at ``when``)."""
        when = time.time() if when is None else when
        with self._lock:
            if self._pending.get(key, 0.0) < when:
                self._pending[key] = when

    def flush(self) -> None:
        """Write the noted uses (one transaction); a failed write keeps them for the next try."""
        with self._lock:
            pending, self._pending = self._pending, {}
        if not pending:
            return
        try:
            self._index.touch(pending)
        except Exception:
            with self._lock:
                for key, when in pending.items():
                    if self._pending.get(key, 0.0) < when:
                        self._pending[key] = when
            raise


class PinnedKeys:
    """Package keys that running requests of this process hold: never evicted while held.

    A request opens a :meth:`scope`; every package looked up inside it (:meth:`note`) stays
    pinned until the scope ends. Scopes follow the context (a ``contextvars`` variable), so
    concurrent requests on other threads keep their own.
    """

    def __init__(self) -> None:
        self._counts: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._scope: contextvars.ContextVar[set[str] | None] = contextvars.ContextVar("refsight_pins", default=None)

    @contextmanager
    def scope(self) -> Iterator[None]:
        """Pin every key noted inside the ``with`` block until it ends (nested scopes join the outer one)."""
        if self._scope.get() is not None:
            yield
            return
        held: set[str] = set()
        token = self._scope.set(held)
        try:
            yield
        finally:
            self._scope.reset(token)
            self._release(held)

    @contextmanager
    def holding(self, keys: Iterable[str]) -> Iterator[None]:
        """Pin ``keys`` for the ``with`` block, whatever the scope."""
        keys = set(keys)
        with self._lock:
            self._counts.update(keys)
        try:
            yield
        finally:
            self._release(keys)

    def note(self, key: str) -> None:
        """Pin ``key`` until the current scope ends (no scope: nothing to pin)."""
        held = self._scope.get()
        if held is None or key in held:
            return
        held.add(key)
        with self._lock:
            self._counts[key] += 1

    def _release(self, keys: Iterable[str]) -> None:
        with self._lock:
            for key in keys:
                self._counts[key] -= 1
                if self._counts[key] <= 0:
                    del self._counts[key]

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._counts

    def __len__(self) -> int:
        with self._lock:
            return len(self._counts)
