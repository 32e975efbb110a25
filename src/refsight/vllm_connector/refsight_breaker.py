"""A remote tier's health: in use, or backing off after a failure and found again by one probe at a time.

refsight's Redis tier (:mod:`refsight.store.redis_tier`) and its S3 client (:mod:`refsight_objects`)
meet an outage the same way, through this one class. It lives in this folder, standard library
only, because the S3 client runs in two places: inside refsight, and inside vLLM's own environment
(refsight's encoder-cache connector), where refsight is not installed and only this folder is on
``PYTHONPATH``. Here both can import it; refsight imports it as
``refsight.vllm_connector.refsight_breaker``, the connector as the top-level ``refsight_breaker``.

- **Healthy**: every call goes out.
- **Backing off**: a call that got no answer (refused connection, timeout) starts a back-off of
  ``min_backoff_s``; until it has passed, every call is skipped at once (no network), counted.
- **Probing**: the first call after the back-off goes out alone while the others
  keep skipping. Its success makes the tier healthy again (the back-off starts over from
  ``min_backoff_s``); its failure backs off again, twice as long, up to ``max_backoff_s``.

Counts (``errors``: calls that failed; ``skipped``: calls not made while backing off; ``outages``:
times the tier went from healthy to backing off) and one log line when the tier goes down (the
error, what serves meanwhile, when it is tried again) and one when it is back.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

__all__ = ["Breaker"]


class Breaker:
    """The health of one remote tier named ``name`` (for log lines); thread-safe."""

    def __init__(
        self, name: str, *, logger: logging.Logger, meanwhile: str = "", min_backoff_s: float = 0.5,
        max_backoff_s: float = 30.0, clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.min_backoff_s, self.max_backoff_s = min_backoff_s, max_backoff_s
        self._log, self._meanwhile, self._clock = logger, meanwhile, clock
        self._lock = threading.Lock()
        self._backoff = min_backoff_s
        self._retry_at: float | None = None  # None: healthy
        self._probing = False
        self.counts = {"errors": 0, "skipped": 0, "outages": 0}

    @property
    def available(self) -> bool:
        """Whether the tier is in use now (not backing off after a failure)."""
        return self._retry_at is None

    def allow(self) -> bool:
        """Whether a call may go out now (healthy, or this caller alone probes); a call not let out is counted skipped."""
        with self._lock:
            if self._retry_at is None:
                return True
            if self._probing or self._clock() < self._retry_at:
                self.counts["skipped"] += 1
                return False
            self._probing = True  # this caller probes; the others keep skipping meanwhile
            return True

    def due(self) -> bool:
        """Whether :meth:`allow` would let a call out now; takes no probe and counts nothing (a caller that would
        prepare costly work for a call first asks this, and :meth:`skip` when not)."""
        with self._lock:
            return self._retry_at is None or (not self._probing and self._clock() >= self._retry_at)

    def skip(self) -> None:
        """Count a call the caller did not make because the tier is backing off."""
        with self._lock:
            self.counts["skipped"] += 1

    def retry_in(self) -> float:
        """Seconds until the tier is tried again (0 when healthy or due)."""
        with self._lock:
            return 0.0 if self._retry_at is None else max(0.0, self._retry_at - self._clock())

    def succeeded(self) -> None:
        """The tier answered: healthy (again)."""
        with self._lock:
            was_down = self._retry_at is not None
            self._retry_at, self._probing, self._backoff = None, False, self.min_backoff_s
        if was_down:
            self._log.warning("refsight: %s is reachable again", self.name)

    def refused(self) -> None:
        """The tier answered but refused the call (e.g. Redis out of memory): reachable, so no back-off; an error."""
        with self._lock:
            self.counts["errors"] += 1
        self.succeeded()

    def failed(self, exc: BaseException) -> None:
        """The tier did not answer: start backing off (or back off twice as long after a failed probe)."""
        with self._lock:
            self.counts["errors"] += 1
            first = self._retry_at is None
            if first:
                self.counts["outages"] += 1
            elif self._probing:
                self._backoff = min(self._backoff * 2, self.max_backoff_s)
            if first or self._probing:
                self._retry_at = self._clock() + self._backoff
            self._probing = False
            backoff = self._backoff
        if first:
            meanwhile = f"{self._meanwhile}, " if self._meanwhile else ""
            self._log.warning("refsight: %s failed (%s); %sretrying in %.1f s", self.name, exc, meanwhile, backoff)

    def info(self) -> dict[str, Any]:
        """The counts and ``available``."""
        with self._lock:
            return {**self.counts, "available": self._retry_at is None}
