"""Work that stops when its client leaves, for answers that are not streamed.

A stream notices a departed client when a write fails (:mod:`..replies.streaming`); a plain JSON answer
writes nothing until the work is done, so a client that gave up after 0.2 s used to keep a model
worker for the whole generation (issue 38: a 1,024-token chat busy until 8 s, a compare for
minutes). :func:`run_watched` runs the work in the :class:`~refsight.server.edge.limits.WorkPool` with a
``stop_event`` and, beside it, waits on the ASGI ``receive`` channel: ``http.disconnect`` sets
the event. Generation checks it after every decode step (``finish_reason="cancelled"``); a compare
checks it between stages (:func:`stop_between_steps`), raising :class:`ClientGone`, a 499 that
nobody reads.

The event is also this work's :func:`client_stop` (a context variable of the worker thread, set by
:func:`with_client_stop`), for work deep below the route that must stop with the request without
the event passed through every call: an image fetched by URL (:mod:`..intake.fetch_deadline`).
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import Any, TypeVar

import anyio
from starlette.requests import Request

from .http_errors import ApiError
from .limits import WorkPool

__all__ = ["run_watched", "watched", "stop_between_steps", "ClientGone", "client_stop", "with_client_stop"]

T = TypeVar("T")

_CLIENT_STOP: ContextVar[threading.Event | None] = ContextVar("refsight_client_stop", default=None)


def client_stop() -> threading.Event | None:
    """The event set when the client of the work running on this thread leaves; None outside such work."""
    return _CLIENT_STOP.get()


def with_client_stop(stop: threading.Event, func: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``func(*args, **kwargs)`` with ``stop`` as its :func:`client_stop` (call it on the worker thread)."""
    token = _CLIENT_STOP.set(stop)
    try:
        return func(*args, **kwargs)
    finally:
        _CLIENT_STOP.reset(token)


class ClientGone(ApiError):
    """The client closed the connection before the answer: the work was stopped (nginx's 499)."""

    def __init__(self) -> None:
        super().__init__(499, "client_closed", "the client closed the connection; the work was stopped")


async def run_watched(pool: WorkPool, request: Request, func: Callable[..., T]) -> T:
    """``func(stop_event=...)`` in a pool slot; the event is set as soon as the client disconnects."""
    stop = threading.Event()
    return await watched(request, stop, lambda: pool.run(lambda: with_client_stop(stop, func, stop_event=stop)))


async def watched(request: Request, stop: threading.Event, wait: Callable[[], Awaitable[T]]) -> T:
    """``await wait()``, with ``stop`` set as soon as ``request``'s client disconnects meanwhile."""

    async def watch() -> None:
        # The body was read before the work starts: the only message left to arrive is the disconnect.
        while (await request.receive())["type"] != "http.disconnect":
            pass
        stop.set()

    error: BaseException | None = None
    async with anyio.create_task_group() as group:
        group.start_soon(watch)
        try:
            result = await wait()
        except BaseException as e:  # noqa: BLE001 -- raised below, outside the group (which would wrap it)
            error = e
        finally:
            group.cancel_scope.cancel()
    if error is not None:
        raise error
    return result


def stop_between_steps(stop_event: threading.Event | None, on_step: Callable[..., Any] | None = None) -> Callable[..., Any]:
    """A step callback (``on_stage``) that raises :class:`ClientGone` once ``stop_event`` is set, then calls ``on_step``."""

    def step(*args: Any, **kwargs: Any) -> Any:
        if stop_event is not None and stop_event.is_set():
            raise ClientGone()
        return on_step(*args, **kwargs) if on_step is not None else None

    return step
