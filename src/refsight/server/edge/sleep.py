"""llama-server's ``--sleep-idle-seconds``: unload the model when no request came for a while, load it at the next.

A served model holds its memory (weights, KV cache, prefix states) while nobody asks anything. With
``sleep_idle_seconds`` set, :class:`SleepWatch` unloads it (:meth:`Service.sleep
<refsight.server.service.Service.sleep>`: memory freed, the store stays open, stored packages and
prefix states stay) once that many seconds passed with no request in flight and no model work
queued, and the next request that may need it loads it again before it runs (the load's seconds are
that request's). As in llama-server, asking how the server is does not wake it: ``/health``,
``/props`` (``is_sleeping``), ``/v1/models`` and ``/metrics`` answer from what was known at load
(:class:`~refsight.server.model_facts.ModelFacts`), and preflights change nothing.

Sleep and wake never overlap a request: one asyncio lock orders them, a request counts as in flight
from before its wake check until its reply (a stream's last byte) is sent, and the watcher unloads
only when nothing is in flight and the work pool is empty.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import anyio.to_thread

__all__ = ["SleepWatch", "SleepMiddleware", "QUIET_PATHS"]

log = logging.getLogger("refsight.server")

#: Paths a request to which neither wakes the model nor counts as activity (llama-server's ``bypass_sleep``).
QUIET_PATHS = frozenset({"/health", "/v1/health", "/props", "/v1/props", "/models", "/v1/models", "/metrics"})


class SleepWatch:
    """When to unload the model (idle ``seconds`` with nothing in flight) and when to load it again."""

    def __init__(self, service: Any, pool: Any, seconds: float) -> None:
        self.service = service
        self.pool = pool
        self.seconds = float(seconds)
        self.in_flight = 0
        self.last_activity = time.monotonic()
        self._lock = asyncio.Lock()

    async def enter(self) -> None:
        """A request that may need the model begins: load it first if it sleeps."""
        async with self._lock:
            self.in_flight += 1
            if self.service.is_sleeping:
                began = time.monotonic()
                try:
                    await anyio.to_thread.run_sync(self.service.wake)
                except BaseException:
                    self.leave()
                    raise
                log.info("refsight: model loaded again after sleep (%.1f s)", time.monotonic() - began)

    def leave(self) -> None:
        """That request's reply is sent: the idle time counts from now."""
        self.in_flight -= 1
        self.last_activity = time.monotonic()

    async def run(self) -> None:
        """Check a few times per idle period, until cancelled (the app's lifespan ends)."""
        period = min(max(self.seconds / 4, 0.05), 5.0)
        while True:
            await asyncio.sleep(period)
            await self.sleep_if_idle()

    async def sleep_if_idle(self) -> bool:
        """Unload the model when it has been idle long enough; True when it was unloaded now."""
        if self.in_flight or self.pool.pending or time.monotonic() - self.last_activity < self.seconds:
            return False
        async with self._lock:
            # Checked again under the lock: a request may have come while we waited for it.
            if self.in_flight or self.pool.pending or time.monotonic() - self.last_activity < self.seconds:
                return False
            slept = await anyio.to_thread.run_sync(self.service.sleep)
        if slept:
            log.info("refsight: idle for %g s: model unloaded (sleeping)", self.seconds)
        return slept


class SleepMiddleware:
    """ASGI middleware: every request but the quiet ones (:data:`QUIET_PATHS`, preflights) goes through
    :meth:`SleepWatch.enter` / :meth:`SleepWatch.leave`."""

    def __init__(self, app: Any, watch: SleepWatch) -> None:
        self.app = app
        self.watch = watch

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http" or scope["method"] == "OPTIONS" or scope["path"] in QUIET_PATHS:
            await self.app(scope, receive, send)
            return
        await self.watch.enter()
        try:
            await self.app(scope, receive, send)
        finally:
            self.watch.leave()
