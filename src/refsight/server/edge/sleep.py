"""llama-server's ``--sleep-idle-seconds``: unload the model when no request came for a while, load it at the next.

A served model holds its memory (weights, KV cache, prefix states) while nobody asks anything. With
``sleep_idle_seconds`` set, :class:`SleepWatch` unloads it (:meth:`Service.sleep
<refsight.server.service.Service.sleep>`: memory freed, the store stays open, stored packages and
prefix states stay) once that many seconds passed with no request in flight and no model work
queued, and the next request that may need it loads it again before it runs (the load's seconds are
that request's). Only a request whose route may need the model wakes it, decided from the app's route
table (:func:`wakes`): a route that takes the service (the only door to the model) and is not marked
:func:`needs_no_model`. So a path no route serves (404, 405), a route that never holds the service
(``/api/version``, the page, the refused Ollama routes, the docs) and a preflight never wake it, and
neither does asking how the server is: ``/health``, ``/healthz``, ``/props`` (``is_sleeping``),
``/slots``, ``/v1/models``, Ollama's ``/api/tags``, ``/api/ps`` and ``/api/show`` answer from what was
known at load (:class:`~refsight.server.model_facts.ModelFacts`), as llama-server answers them (its
``bypass_sleep``), ``/v1/stats`` and a reference's ``/image`` and ``/thumbnail`` from the store, and
``/metrics`` holds no service. Such requests are not activity either: a load balancer polling
``/health`` never keeps the model awake.

Sleep and wake never overlap a request: one asyncio lock orders them, a request counts as in flight
from before its wake check until its reply (a stream's last byte) is sent, and the watcher unloads
only when nothing is in flight and the work pool is empty.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import anyio.to_thread
from starlette.routing import Match

from .gate import dependency_calls, flat_routes

__all__ = ["SleepWatch", "SleepMiddleware", "needs_no_model", "wakes"]

log = logging.getLogger("refsight.server")

F = TypeVar("F", bound=Callable[..., Any])


def needs_no_model(endpoint: F) -> F:
    """Mark a route's ``endpoint`` as answered without the model (from what was known at load, the config or the
    store alone): a request to it neither wakes a sleeping model nor counts as activity (llama-server's
    ``bypass_sleep``). Only for a route that never reaches the backend: one that did would load it unwatched."""
    endpoint.needs_no_model = True  # type: ignore[attr-defined]
    return endpoint


def _takes_service(route: Any) -> bool:
    """Whether ``route``'s dependencies hand it the service (``deps.ServiceDep``: its call names the state it reads)."""
    return any(getattr(call, "app_state", None) == "service" for call in dependency_calls(route))


def wakes(route: Any) -> bool:
    """Whether a request to ``route`` may need the model: it takes the service and is not :func:`needs_no_model`."""
    return _takes_service(route) and not getattr(getattr(route, "endpoint", None), "needs_no_model", False)


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
    """ASGI middleware: a request whose route :func:`wakes` the model goes through :meth:`SleepWatch.enter` /
    :meth:`SleepWatch.leave`; every other one (no route, a route without the model, a preflight) passes straight on.

    ``routes``: the app's routes (read at the first request, when every router is included).
    """

    def __init__(self, app: Any, watch: SleepWatch, routes: Callable[[], Iterable[Any]] = tuple) -> None:
        self.app = app
        self.watch = watch
        self._routes_of = routes
        self._waking: list[tuple[Any, bool]] | None = None

    def _wakes(self, scope: dict) -> bool:
        if self._waking is None:
            self._waking = [(matcher, wakes(route)) for matcher, route in flat_routes(self._routes_of())]
        for matcher, waking in self._waking:
            if matcher.matches(scope)[0] is Match.FULL:
                return waking
        return False  # no route serves it (404, 405): nothing runs

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http" or scope["method"] == "OPTIONS" or not self._wakes(scope):
            await self.app(scope, receive, send)
            return
        await self.watch.enter()
        try:
            await self.app(scope, receive, send)
        finally:
            self.watch.leave()
