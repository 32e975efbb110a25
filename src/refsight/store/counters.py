"""Persistent counters (:class:`CounterTable`) and the buffer that writes to them in batches.

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

import math
import re
import threading
from collections import defaultdict
from collections.abc import Callable

from ..errors import InvalidInputError
from .base import COUNTER_NAMES, Catalog

__all__ = ["CounterBuffer", "CounterTable", "FLUSH_INTERVAL_S"]

#: Longest time a count waits in memory before it is written.
FLUSH_INTERVAL_S = 5.0
_COUNTER = re.compile(r"[a-z][a-z0-9_]{0,63}")


class CounterTable:
    """The store's ``counters`` table: named totals that every process adds to atomically."""

    def __init__(self, database) -> None:
        self._db = database

    def bump(self, **amounts: float) -> None:
        """Add to persistent counters in one transaction, atomically across processes."""
        rows = []
        for name, amount in amounts.items():
            if not _COUNTER.fullmatch(name):
                raise InvalidInputError(name, "a counter name is lowercase letters, digits and _")
            if isinstance(amount, bool) or not isinstance(amount, (int, float)) or not math.isfinite(amount):
                raise InvalidInputError(amount, f"counter {name!r} needs a finite number")
            rows.append((name, float(amount)))
        if not rows:
            return
        with self._db.write() as conn:
            # value = value + excluded.value happens inside the database under its write lock:
            # no read-modify-write in Python, so no bump from another process is lost.
            conn.executemany(
                "INSERT INTO counters (name, value) VALUES (?, ?) "
                "ON CONFLICT (name) DO UPDATE SET value = counters.value + excluded.value",
                rows,
            )

    def values(self) -> dict[str, float]:
        """Every counter (the standard ones default to 0)."""
        values = {name: 0.0 for name in COUNTER_NAMES}
        values.update(dict(self._db.connection().execute("SELECT name, value FROM counters").fetchall()))
        return values


class CounterBuffer:
    """Adds to the catalog's counters without writing on every call (thread-safe)."""

    def __init__(
        self, catalog: Catalog, *, interval_s: float = FLUSH_INTERVAL_S, also: tuple[Callable[[], None], ...] = ()
    ) -> None:
        self._catalog = catalog
        #: Other buffers written on the same schedule (the packages' last-use times).
        self._also = also
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
        with self._lock:
            return {name: 0.0 for name in COUNTER_NAMES} | dict(self._totals)

    def flush(self) -> None:
        """Write the pending counts now (one transaction); a failed write keeps them for the next try."""
        failure: Exception | None = None
        for flush in self._also:
            try:
                flush()
            except Exception as exc:  # noqa: BLE001 - raised below, once the counters had their chance
                failure = exc
        with self._lock:
            pending, self._pending = dict(self._pending), defaultdict(float)
        if pending:
            try:
                self._catalog.bump(**pending)
            except Exception:
                with self._lock:  # put them back: statistics are worth a retry, not a crash
                    for name, amount in pending.items():
                        self._pending[name] += amount
                raise
        if failure is not None:
            raise failure

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
