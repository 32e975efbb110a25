"""Work that stops when its client leaves, for answers that are not streamed.

A stream notices a departed client when a write fails (:mod:`.streaming`); a plain JSON answer
writes nothing until the work is done, so a client that gave up after 0.2 s used to keep a model
worker for the whole generation (issue 38: a 1,024-token chat busy until 8 s, a compare for
minutes). :func:`run_watched` runs the work in the :class:`~refsight.server.limits.WorkPool` with a
``stop_event`` and, beside it, waits on the ASGI ``receive`` channel: ``http.disconnect`` sets
the event. Generation checks it after every decode step (``finish_reason="cancelled"``); a compare
checks it between stages (:func:`stop_between_steps`), raising :class:`ClientGone`, a 499 that
nobody reads.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

import anyio
from starlette.requests import Request

from .errors import ApiError
from .limits import WorkPool

__all__ = ["run_watched", "stop_between_steps", "ClientGone"]

T = TypeVar("T")


class ClientGone(ApiError):
    """The client closed the connection before the answer: the work was stopped (nginx's 499)."""

    def __init__(self) -> None:
        super().__init__(499, "client_closed", "the client closed the connection; the work was stopped")


async def run_watched(pool: WorkPool, request: Request, func: Callable[..., T]) -> T:
    """``func(stop_event=...)`` in a pool slot; the event is set as soon as the client disconnects."""
    stop = threading.Event()

    async def watch() -> None:
        # The body was read before the work starts: the only message left to arrive is the disconnect.
        while (await request.receive())["type"] != "http.disconnect":
            pass
        stop.set()

    error: Exception | None = None
    async with anyio.create_task_group() as group:
        group.start_soon(watch)
        try:
            result = await pool.run(lambda: func(stop_event=stop))
        except Exception as e:  # noqa: BLE001 -- raised below, outside the group (which would wrap it)
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
