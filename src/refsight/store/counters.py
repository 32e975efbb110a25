"""Cache counters buffered in memory and written to the catalog in batches.

A cache hit must not write: a write takes SQLite's cross-process write lock, and hits are
the hot path (every reference of every request). So hits, misses and the encoder time they
saved are added up here, in memory, and flushed to the catalog's persistent counters

- every :data:`FLUSH_INTERVAL_S` seconds, by a daemon thread, when anything changed;
- when someone reads them (:meth:`CounterBuffer.flush` before ``stats``);
- when the store closes.

What a SIGKILL can lose is therefore bounded: at most the counts of the last
:data:`FLUSH_INTERVAL_S` seconds of that one process. Counters are statistics; no
decision depends on them.
"""

from __future__ import annotations

import threading
from collections import defaultdict

from .base import Catalog

__all__ = ["CounterBuffer", "FLUSH_INTERVAL_S"]

#: Longest time a count waits in memory before it is written.
FLUSH_INTERVAL_S = 5.0


class CounterBuffer:
    """Adds to the catalog's counters without writing on every call (thread-safe)."""

    def __init__(self, catalog: Catalog, *, interval_s: float = FLUSH_INTERVAL_S) -> None:
        self._catalog = catalog
        self._interval = interval_s
        self._pending: dict[str, float] = defaultdict(float)
        self._totals: dict[str, float] = defaultdict(float)  # this process's counts, never reset
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = False
        self._thread: threading.Thread | None = None

    def add(self, **amounts: float) -> None:
        """Count ``amounts`` (e.g. ``hits=1, encode_ms_saved=812.5``); written within the flush interval."""
        with self._lock:
            for name, amount in amounts.items():
                self._pending[name] += amount
                self._totals[name] += amount
            if self._thread is None and not self._closed:
                # Started on first use, so an engine that never counts never owns a thread.
                self._thread = threading.Thread(target=self._run, name="refsight-counters", daemon=True)
                self._thread.start()

    def pending(self) -> dict[str, float]:
        """Counts not yet written (for ``stats`` of this process and tests)."""
        with self._lock:
            return dict(self._pending)

    def totals(self) -> dict[str, float]:
        """Everything this process counted since the store opened (hits, misses, ...; flushed or not).

        With replicas on one shared catalog the persistent counters are the deployment's sums;
        these are this replica's own.
        """
        from .base import COUNTER_NAMES

        with self._lock:
            return {name: 0.0 for name in COUNTER_NAMES} | dict(self._totals)

    def flush(self) -> None:
        """Write the pending counts now (one transaction); a failed write keeps them for the next try."""
        with self._lock:
            pending, self._pending = dict(self._pending), defaultdict(float)
        if not pending:
            return
        try:
            self._catalog.bump(**pending)
        except Exception:
            with self._lock:  # put them back: statistics are worth a retry, not a crash
                for name, amount in pending.items():
                    self._pending[name] += amount
            raise

    def _run(self) -> None:
        while not self._wake.wait(self._interval):
            try:
                self.flush()
            except Exception:  # noqa: BLE001 - a busy or closing store: try again next round
                pass

    def close(self) -> None:
        """Flush what is pending and stop the thread. Idempotent."""
        with self._lock:
            self._closed = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=self._interval + 1)
        self.flush()
