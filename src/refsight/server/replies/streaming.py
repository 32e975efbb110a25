"""Server-sent events: model work that streams text out of a WorkPool thread, and the ASGI
response that carries it and stops the work when the client goes away.

:func:`stream_in_pool` runs ``func(on_text)`` in a :class:`~refsight.server.edge.limits.WorkPool`
slot (the same bound as every other model call) and yields each piece of text the moment
the worker thread hands it over, then a :class:`Finished` with the function's result.

:class:`EventStreamResponse` sends those events and watches the ASGI ``receive`` channel at
the same time: the ``http.disconnect`` message sets a :class:`threading.Event` that the
backend checks after every token (``stop_event``), so generation ends within a token or
two of the client leaving and the pool slot frees as soon as the worker returns.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Iterable

import anyio
from starlette.requests import Request
from starlette.responses import Response

from ...tools import ToolCall
from ..edge.disconnect import watched, with_client_stop
from ..edge.limits import WorkPool
from .timings import rate

__all__ = [
    "Finished", "stream_in_pool", "open_stream", "stream_error", "EventStreamResponse", "sse_event", "SSE_DONE",
    "ndjson_line", "NDJSON", "answer_events", "PromptProgress", "progress_hook",
]

#: The last event of an OpenAI stream.
SSE_DONE = b"data: [DONE]\n\n"


def sse_event(data: Any) -> bytes:
    """One ``data:`` event holding ``data`` as compact JSON."""
    return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


#: The media type of a stream of JSON lines (Ollama's streams).
NDJSON = "application/x-ndjson"


def ndjson_line(data: Any) -> bytes:
    """One line of an NDJSON stream holding ``data`` as compact JSON."""
    return json.dumps(data, separators=(",", ":")).encode() + b"\n"


def stream_error(error: BaseException) -> dict[str, Any]:
    """The error object of an error after a stream began (OpenAI's shape; details of a crash are not shown)."""
    from ... import RefsightError
    from ..edge.http_errors import ApiError, from_refsight, openai_error_body

    if not isinstance(error, ApiError):
        error = from_refsight(error) if isinstance(error, RefsightError) else ApiError(500, "internal_error", "internal server error")
    return openai_error_body(error.status, error.code, error.message, error.param)["error"]


@dataclass
class Finished:
    """The end of a stream: the worker function's return value."""

    result: Any


@dataclass(frozen=True)
class PromptProgress:
    """llama-server's ``prompt_progress``, an item of a stream of its own: the prompt's ``total`` tokens,
    ``cache`` of them served from a stored prefix state, ``processed`` so far, ``time_ms`` since the first report."""

    total: int
    cache: int
    processed: int
    time_ms: int
    #: ``time_ms`` to the microsecond (the timings' ``prompt_ms``)
    elapsed_ms: float = 0.0

    def to_dict(self) -> dict[str, int]:
        """The ``prompt_progress`` object, as llama-server writes it."""
        return {"total": self.total, "cache": self.cache, "processed": self.processed, "time_ms": self.time_ms}

    def timings(self) -> dict[str, Any]:
        """llama-server's ``timings`` of a progress event (``timings_per_token``): the prompt's so far, no answer yet
        (the first report: all zeros)."""
        prompt_n, prompt_ms = max(self.processed - self.cache, 0), round(self.elapsed_ms, 3)
        per_token, per_second = rate(prompt_n, prompt_ms)
        return {"cache_n": self.cache, "prompt_n": prompt_n, "prompt_ms": prompt_ms, "prompt_per_token_ms": per_token,
                "prompt_per_second": per_second,
                "predicted_n": 0, "predicted_ms": 0.0, "predicted_per_token_ms": 0.0, "predicted_per_second": 0.0}


def progress_hook(send: Callable[[Any], None] | None, wanted: bool | None) -> Callable[[int, int, int], None] | None:
    """The backend's ``on_prompt`` for a stream that asked for ``return_progress`` (None otherwise): each report
    goes into the stream through ``send`` (the stream's own callback, before any text) as a :class:`PromptProgress`."""
    if send is None or not wanted:
        return None
    began: list[float] = []

    def on_prompt(total: int, cached: int, processed: int) -> None:
        now = time.perf_counter()
        if not began:  # time_ms counts from the first report: as the prompt's evaluation starts
            began.append(now)
        elapsed = (now - began[0]) * 1000
        send(PromptProgress(int(total), int(cached), int(processed), int(elapsed), elapsed))

    return on_prompt


async def stream_in_pool(pool: WorkPool, func: Callable[[Callable[[str], None]], Any]) -> AsyncIterator[Any]:
    """Run ``func(on_text)`` in a pool slot; yield each text piece as it comes, then :class:`Finished`.

    An exception of ``func`` (or the pool's 429) is raised from the iterator after the text
    already yielded. Closing the iterator early does not stop ``func``: the caller's
    ``stop_event`` does that; the pool slot stays taken until ``func`` returns.
    """
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()

    def on_text(piece: str) -> None:
        # Called on the worker thread: hand the piece to the event loop, never block the model.
        loop.call_soon_threadsafe(queue.put_nowait, ("text", piece))

    task = asyncio.ensure_future(pool.run(func, on_text))
    # Scheduled after every on_text callback the thread posted before returning, so order holds.
    task.add_done_callback(lambda _: queue.put_nowait(("end", None)))
    while True:
        kind, value = await queue.get()
        if kind == "end":
            break
        yield value
    yield Finished(task.result())


async def open_stream(
    pool: WorkPool, work: Callable[..., Any], request: Request | None = None,
) -> tuple[Any, AsyncIterator[Any], threading.Event]:
    """Start ``work(on_text, stop_event)`` streaming in a pool slot; its first event, the rest, and the stop event.

    The first event is awaited here, before any byte is sent: an error up to the first token (a
    missing reference, a full pool, a bad image) is raised as a plain HTTP error. Until then no
    write can fail, so ``request``'s disconnect is watched instead: a client that leaves while its
    images are fetched or its prompt prefilled stops that work (:func:`~..edge.disconnect.client_stop`).
    """
    stop = threading.Event()
    source = stream_in_pool(pool, lambda on_text: with_client_stop(stop, work, on_text, stop))
    try:
        if request is None:
            first = await source.__anext__()
        else:
            first = await watched(request, stop, source.__anext__)
    except BaseException:
        stop.set()
        raise
    return first, source, stop


def _sse_error(error: dict[str, Any]) -> bytes:
    return sse_event({"error": error})


async def answer_events(
    first: Any, source: AsyncIterator[Any], piece: Callable[[str], bytes], finish: Callable[[Any], Iterable[bytes]],
    error: Callable[[dict[str, Any]], bytes] = _sse_error, progress: Callable[[PromptProgress], bytes] | None = None,
    call: Callable[[ToolCall], bytes] | None = None,
) -> AsyncIterator[bytes]:
    """The one loop of a streamed answer (from :func:`open_stream`): ``piece(text)`` per text piece (``progress``
    per :class:`PromptProgress`, in a stream that asked for them; ``call`` per :class:`~refsight.tools.ToolCall`, in
    a chat that offered tools), then ``finish(result)``'s events; an error after the headers becomes
    ``error(stream_error(e))``, the last event.

    Each wire format brings only its formatters (OpenAI chunks, llama-server events, Ollama's NDJSON lines).
    """
    item = first
    try:
        while not isinstance(item, Finished):
            if isinstance(item, PromptProgress) and progress is not None:
                yield progress(item)
            elif isinstance(item, ToolCall) and call is not None:
                yield call(item)
            else:
                yield piece(item)
            item = await source.__anext__()
    except Exception as e:  # noqa: BLE001 -- after the headers an error can only be an event
        yield error(stream_error(e))
        return
    for event in finish(item.result):
        yield event


class EventStreamResponse(Response):
    """An ASGI ``text/event-stream`` response over an async iterator of encoded events.

    ``stop`` is set when the client disconnects (or the send fails), so the generating
    thread can end early; the event iterator is closed either way. ``media_type``
    :data:`NDJSON` carries JSON lines instead (Ollama's streams), with the same guarantees.
    """

    def __init__(
        self, events: AsyncIterator[bytes], stop: threading.Event, *, status_code: int = 200,
        media_type: str = "text/event-stream",
    ) -> None:
        super().__init__(status_code=status_code, media_type=media_type)
        self.events = events
        self.stop = stop

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        async def watch_disconnect(cancel: anyio.CancelScope) -> None:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    self.stop.set()
                    cancel.cancel()
                    return

        try:
            async with anyio.create_task_group() as group:
                group.start_soon(watch_disconnect, group.cancel_scope)
                await send({
                    "type": "http.response.start",
                    "status": self.status_code,
                    "headers": [
                        (b"content-type", f"{self.media_type}; charset=utf-8".encode()),
                        (b"cache-control", b"no-cache"),
                        (b"x-accel-buffering", b"no"),  # proxies must not buffer the stream
                    ],
                })
                async for event in self.events:
                    await send({"type": "http.response.body", "body": event, "more_body": True})
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                group.cancel_scope.cancel()  # done: stop watching for a disconnect
        except OSError:
            pass  # the client went away while we were writing
        finally:
            self.stop.set()  # harmless after a normal end; stops the model after anything else
            aclose = getattr(self.events, "aclose", None)
            if aclose is not None:
                with anyio.CancelScope(shield=True):
                    await aclose()
