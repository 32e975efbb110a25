"""Limits that keep one client from taking the service down: body size and concurrent model work.

- :class:`BodyLimitMiddleware` refuses a request body over ``max_bytes`` with 413
  before any handler sees it: a declared ``Content-Length`` is checked up front, and
  a chunked body is counted as it arrives, so a lying or absent header does not help.
  A JSON body (or one without a content type, which FastAPI parses as JSON) nested
  deeper than :data:`refsight.inputs.jsonlimits.MAX_JSON_DEPTH` is refused with 400
  ``invalid_input`` in the same pass, before any parser could recurse on it. So is a JSON
  body holding text that is not valid Unicode (a ``\\ud800`` escape with no partner):
  400 naming the field (``metadata key '\\ud800'``, ``messages[0].content``), on every
  route, before any route reads a field of it.
- :class:`WorkPool` runs blocking model work in a bounded set of threads (off the
  event loop). At most ``workers`` jobs run and at most ``queue`` wait; one more is
  refused at once with 429 ``overloaded`` instead of piling up unbounded latency.

Image pixel limits are the library's own (:class:`refsight.IntakeLimits`), applied
by the engines the app builds.
"""

from __future__ import annotations

import json
import re
from typing import Any, Callable, TypeVar

import anyio
import anyio.to_thread

from .. import MAX_JSON_DEPTH, InvalidInputError
from ..inputs.jsonlimits import json_depth
from ..inputs.text import check_text, check_texts
from .errors import ApiError, error_response, error_response_for

__all__ = ["BodyLimitMiddleware", "WorkPool"]

T = TypeVar("T")

#: Bodies up to this size have their JSON depth checked on the event loop (well under a millisecond).
_INLINE_CHECK_BYTES = 1 << 20


class _TooLarge(Exception):
    pass


class BodyLimitMiddleware:
    """ASGI middleware: request bodies over ``max_bytes`` get 413 ``body_too_large``."""

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None:
            try:
                too_large = int(declared) > self.max_bytes
            except ValueError:
                too_large = False  # the server itself rejects a malformed header
            if too_large:
                await self._refuse(scope, receive, send)
                return
        # Buffer the body (it is bounded by the limit) so a chunked body that grows past
        # the limit is refused before the handler has done anything with it.
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._refuse(scope, receive, send)
                return
            chunks.append(chunk)
            more = message.get("more_body", False)
        body = b"".join(chunks)
        problem = await _json_depth_problem(scope, body)
        if problem is not None:
            await error_response(400, "invalid_input", problem)(scope, receive, send)
            return
        invalid = await _invalid_text(scope, body)
        if invalid is not None:
            response = error_response_for(scope.get("path", ""), 400, "invalid_input", str(invalid), param=invalid.input)
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

    async def _refuse(self, scope: dict, receive: Callable, send: Callable) -> None:
        response = error_response(413, "body_too_large", f"request body is over the {self.max_bytes}-byte limit")
        await response(scope, receive, send)


def _is_json(scope: dict) -> bool:
    # FastAPI parses a body without a content type as JSON too, so that counts.
    content_type = dict(scope.get("headers") or []).get(b"content-type", b"").split(b";")[0].strip().lower()
    return not content_type or content_type == b"application/json" or content_type.endswith(b"+json")


async def _json_depth_problem(scope: dict, body: bytes) -> str | None:
    """Why a JSON body is refused for its nesting, or None."""
    if not body or not _is_json(scope):
        return None
    # Milliseconds for ordinary bodies; an adversarial one of brackets takes longer, off the loop.
    if len(body) > _INLINE_CHECK_BYTES:
        depth = await anyio.to_thread.run_sync(lambda: json_depth(body, stop_above=MAX_JSON_DEPTH))
    else:
        depth = json_depth(body, stop_above=MAX_JSON_DEPTH)
    if depth > MAX_JSON_DEPTH:
        return f"request body: JSON nested more than {MAX_JSON_DEPTH} levels deep (the limit is {MAX_JSON_DEPTH})"
    return None


#: A JSON ``\\uD800``-``\\uDFFF`` escape: half of a surrogate pair, or a lone surrogate.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


async def _invalid_text(scope: dict, body: bytes) -> InvalidInputError | None:
    """The error naming the first string of a JSON body that is not valid Unicode, or None.

    Raw UTF-8 cannot hold a lone surrogate, only a ``\\uXXXX`` escape can: a body without
    such an escape is passed at the cost of one scan; one with escapes (emoji sent as pairs
    included) is parsed and its strings checked, field by field.
    """
    if not body or not _is_json(scope) or _SURROGATE_ESCAPE.search(body) is None:
        return None
    if len(body) > _INLINE_CHECK_BYTES:
        return await anyio.to_thread.run_sync(_first_invalid_text, body)
    return _first_invalid_text(body)


def _first_invalid_text(body: bytes) -> InvalidInputError | None:
    try:
        data = json.loads(body)
    except ValueError:
        return None  # not JSON: the route says so in its own words
    items = data.items() if isinstance(data, dict) else [("request body", data)]
    try:
        for field, value in items:
            check_text(field, "request body key")
            check_texts(value, field)
    except InvalidInputError as e:
        return e
    return None


class WorkPool:
    """Runs blocking callables in at most ``workers`` threads with at most ``queue`` waiting."""

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
        """Run ``func(*args)`` in a worker thread; raise 429 ``overloaded`` when the queue is full."""
        if self._pending >= self.workers + self.queue:
            raise ApiError(
                429, "overloaded",
                f"{self._pending} requests are already running or queued (limit {self.workers + self.queue}); retry later",
                headers={"Retry-After": "1"},
            )
        self._pending += 1
        try:
            return await anyio.to_thread.run_sync(func, *args, limiter=self._capacity)
        finally:
            self._pending -= 1

    async def run_light(self, func: Callable[..., T], *args: Any) -> T:
        """Run cheap blocking work (catalog reads, thumbnails) in the shared thread pool, never refused."""
        return await anyio.to_thread.run_sync(func, *args)
