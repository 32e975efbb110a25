"""Limits that keep one client from taking the service down: body size and concurrent model work.

- :class:`BodyLimitMiddleware` refuses a request body over ``max_bytes`` with 413
  before any handler sees it: a declared ``Content-Length`` is checked up front, and
  a chunked body is counted as it arrives, so a lying or absent header does not help.
  A request no route serves (404) or serves with another method (405) is answered
  without its body being read at all. A JSON body (or one without a content type, which
  FastAPI parses as JSON) is decoded and checked once, for every route, before any route
  parses it (:func:`refsight.server.edge.json_content.checked_json_body`): bytes that are not
  UTF-8 (or UTF-16/UTF-32), nesting deeper than :data:`refsight.inputs.jsonlimits.MAX_JSON_DEPTH`,
  more values than :data:`~refsight.server.edge.json_content.MAX_BODY_VALUES` and text that is
  not valid Unicode (a ``\\ud800`` escape with no partner) are 400 ``invalid_input`` naming
  the body or the field (``metadata key '\\ud800'``, ``messages[0].content``); the routes
  then read the body as UTF-8.
- :class:`WorkPool` runs blocking model work in a bounded set of threads (off the
  event loop). At most ``workers`` jobs run and at most ``queue`` wait; one more is
  refused at once with 429 ``overloaded`` instead of piling up unbounded latency.
  It is the only way in to model work: a method marked :func:`model_work` (every
  :class:`~refsight.server.service.Service` method that decodes an image, tokenizes
  or runs the model) runs only inside a :meth:`WorkPool.run` job
  and raises :class:`OutsideWorkPool` anywhere else (the event loop, the shared thread
  pool of :meth:`WorkPool.run_light`), so a route cannot escape the pool's bound (its
  workers, its queue, one decoded image per worker) by accident.

Image pixel limits are the library's own (:class:`refsight.inputs.images.IntakeLimits`), applied
by the engines the app builds.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from contextvars import ContextVar
from typing import Any, Callable, TypeVar

import anyio
import anyio.to_thread
from starlette.routing import Match

from .http_errors import ApiError, error_response, error_response_for
from .gate import flat_routes
from .json_content import checked_json_body, is_json

__all__ = ["BodyLimitMiddleware", "WorkPool", "model_work", "OutsideWorkPool", "is_model_work"]

T = TypeVar("T")

#: Bodies up to this size are decoded and checked on the event loop (about a millisecond at most).
_INLINE_CHECK_BYTES = 1 << 18


class _TooLarge(Exception):
    pass


class BodyLimitMiddleware:
    """ASGI middleware: request bodies over ``max_bytes`` get 413 ``body_too_large``; JSON bodies are checked.

    ``routes``: the app's routes (read at the first request), to answer a path no route serves
    without reading its body.
    """

    def __init__(self, app: Any, max_bytes: int, routes: Callable[[], Iterable[Any]] = tuple) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self._routes_of = routes
        self._matchers: list[Any] | None = None

    def _routed(self, scope: dict) -> bool:
        """Whether a route serves this path and method (else the router answers 404 or 405 unread)."""
        if self._matchers is None:  # routes are all added by the first request
            self._matchers = [matcher for matcher, _ in flat_routes(self._routes_of())]
        return not self._matchers or any(m.matches(scope)[0] is Match.FULL for m in self._matchers)

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self._declared_too_large(scope):
            await self._refuse(scope, receive, send)
            return
        if not self._routed(scope):
            # 404/405 come from the router, which never reads the body: the server discards it unbuffered.
            await self.app(scope, receive, send)
            return
        try:
            body = await self._buffered(receive)
        except _TooLarge:
            await self._refuse(scope, receive, send)
            return
        if body is None:
            return  # the client left
        if body and is_json(scope):
            try:
                body = await _checked(body)
            except ApiError as e:
                response = error_response_for(scope.get("path", ""), e.status, e.code, e.message, param=e.param)
                await response(scope, receive, send)
                return
        replayed = False

        async def replay() -> dict:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # afterwards only a disconnect can arrive

        await self.app(scope, replay, send)

    def _declared_too_large(self, scope: dict) -> bool:
        declared = dict(scope.get("headers") or []).get(b"content-length")
        try:
            return declared is not None and int(declared) > self.max_bytes
        except ValueError:
            return False  # the server itself rejects a malformed header

    async def _buffered(self, receive: Callable) -> bytes | None:
        """The whole body (None: the client left); :class:`_TooLarge` as soon as it grows past the limit.

        Buffered (it is bounded by the limit) so a chunked body that grows past the limit is
        refused before the handler has done anything with it.
        """
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                raise _TooLarge
            chunks.append(chunk)
            more = message.get("more_body", False)
        return b"".join(chunks)

    async def _refuse(self, scope: dict, receive: Callable, send: Callable) -> None:
        response = error_response(413, "body_too_large", f"request body is over the {self.max_bytes}-byte limit")
        await response(scope, receive, send)


async def _checked(body: bytes) -> bytes:
    """:func:`checked_json_body`: milliseconds for ordinary bodies on the loop; a large one off it."""
    if len(body) > _INLINE_CHECK_BYTES:
        return await anyio.to_thread.run_sync(checked_json_body, body)
    return checked_json_body(body)


#: True in a worker thread while it runs a :meth:`WorkPool.run` job (each job's thread sets it for itself).
_IN_WORK_POOL: ContextVar[bool] = ContextVar("refsight_in_work_pool", default=False)


class OutsideWorkPool(RuntimeError):
    """Model work was called outside a :meth:`WorkPool.run` job: a route's mistake (a 500), never a client's."""


def model_work(method: Callable[..., T]) -> Callable[..., T]:
    """Mark ``method`` as model work: it runs only inside a :meth:`WorkPool.run` job, else :class:`OutsideWorkPool`
    naming it (the check is one context-variable read)."""

    @functools.wraps(method)
    def in_work_pool(*args: Any, **kwargs: Any) -> T:
        if not _IN_WORK_POOL.get():
            raise OutsideWorkPool(f"{method.__qualname__} is model work: call it inside WorkPool.run (the work pool's "
                                  "bound), never on the event loop or in run_light")
        return method(*args, **kwargs)

    in_work_pool.model_work = True  # type: ignore[attr-defined]
    return in_work_pool


def is_model_work(method: Any) -> bool:
    """Whether ``method`` is marked :func:`model_work`."""
    return bool(getattr(method, "model_work", False))


def _pool_job(func: Callable[..., T], *args: Any) -> T:
    """``func(*args)`` as a work pool job: model work may run inside it."""
    token = _IN_WORK_POOL.set(True)
    try:
        return func(*args)
    finally:
        _IN_WORK_POOL.reset(token)


class WorkPool:
    """Runs blocking callables in at most ``workers`` threads with at most ``queue`` waiting; the only place
    :func:`model_work` may run."""

    def __init__(self, workers: int, queue: int) -> None:
        self.workers = workers
        self.queue = queue
        self._capacity = anyio.CapacityLimiter(workers)
        self._pending = 0  # running + waiting; only touched on the event loop, so no lock

    @property
    def pending(self) -> int:
        """Jobs running or waiting now."""
        return self._pending

    async def run(self, func: Callable[..., T], *args: Any) -> T:
        """Run ``func(*args)`` in a worker thread, where it may do model work; raise 429 ``overloaded`` when the
        queue is full."""
        if self._pending >= self.workers + self.queue:
            raise ApiError(
                429, "overloaded",
                f"{self._pending} requests are already running or queued (limit {self.workers + self.queue}); retry later",
                headers={"Retry-After": "1"},
            )
        self._pending += 1
        try:
            return await anyio.to_thread.run_sync(_pool_job, func, *args, limiter=self._capacity)
        finally:
            self._pending -= 1

    async def run_light(self, func: Callable[..., T], *args: Any) -> T:
        """Run cheap blocking work (catalog reads, thumbnails under their own bound) in the shared thread pool, never
        refused; no model work (:func:`model_work`) may run here."""
        return await anyio.to_thread.run_sync(func, *args)
