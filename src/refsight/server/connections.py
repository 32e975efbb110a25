"""Deadlines for a request in arrival: a client that sends its request too slowly is answered 408 and closed.

uvicorn closes idle keep-alive connections (``timeout_keep_alive``) but sets no deadline on a
request that is still arriving: a client that sends one header byte every few seconds
(slowloris), or declares a body and never finishes it, holds its connection, its buffers and
a file descriptor for ever, and a few hundred such clients exhaust the server. The HTTP
protocol of :func:`deadline_protocol` (uvicorn's h11 protocol plus two timers) bounds it:

- the request's head (request line and headers) must arrive within ``header_timeout_s`` of
  the connection opening, or of the first byte of a request on a kept-alive connection;
- the whole request, body included, within ``request_timeout_s`` of that moment;
- at most ``max_incomplete`` connections may be in the middle of sending a request at once;
  one more closes the one that has been at it longest (a client sending at a normal pace is
  long done, so that is the likeliest attacker) instead of refusing the newcomer.

A request that misses its deadline, or is closed for a newer one, gets ``408
request_timeout`` (when no response has started) and the connection is closed. Time spent
after the request has fully arrived (the model's work, a streamed answer) is not bounded
here. :func:`uvicorn_options` gives these settings to uvicorn; ``refsight serve`` and the
test servers both use it.
"""

from __future__ import annotations

import asyncio
import json
from collections import OrderedDict
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from .config import ServerConfig

__all__ = ["deadline_protocol", "uvicorn_options"]

_HEAD, _BODY = "head", "body"


def _timeout_response(seconds: float) -> bytes:
    body = json.dumps({"error": {"code": "request_timeout", "message": (
        f"the request did not arrive in time (the limit is {seconds:g} s); the connection is closed")}}).encode()
    head = (f"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
            "connection: close\r\n\r\n").encode()
    return head + body


class _DeadlineProtocol(H11Protocol):
    """uvicorn's h11 protocol with deadlines on a request in arrival (the limits are set per server class)."""

    header_timeout_s: float
    request_timeout_s: float
    max_incomplete: int
    #: The connections of this server that are sending a request now, oldest first.
    incomplete: OrderedDict[_DeadlineProtocol, None]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._timer: asyncio.TimerHandle | None = None
        self._started: float | None = None  # loop time the request in arrival began
        self._phase = _HEAD

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        """A new connection: its first request's head must arrive within the header deadline."""
        super().connection_made(transport)
        self._begin()

    def data_received(self, data: bytes) -> None:
        """Bytes of a request: start its deadline at its first byte, end it once the request is whole."""
        if self._started is None and self.conn.their_state is h11.IDLE:
            self._begin()
        super().data_received(data)
        self._progress()

    def connection_lost(self, exc: Exception | None) -> None:
        """Whatever the reason, the connection no longer counts as sending a request."""
        self._end()
        super().connection_lost(exc)

    def _begin(self) -> None:
        self._started, self._phase = self.loop.time(), _HEAD
        self._arm(self.header_timeout_s)
        self.incomplete[self] = None
        while len(self.incomplete) > self.max_incomplete:
            oldest = next(iter(self.incomplete))
            oldest._expire(self.header_timeout_s if oldest._phase == _HEAD else self.request_timeout_s)

    def _progress(self) -> None:
        if self._started is None:
            return
        state = self.conn.their_state
        if state is h11.SEND_BODY and self._phase == _HEAD:
            self._phase = _BODY  # the head is in: what is left of the whole request's deadline
            self._arm(self._started + self.request_timeout_s - self.loop.time())
        elif state not in (h11.IDLE, h11.SEND_BODY):
            self._end()  # the request is whole (or the connection is done with requests)

    def _arm(self, seconds: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        limit = self.header_timeout_s if self._phase == _HEAD else self.request_timeout_s
        self._timer = self.loop.call_later(max(seconds, 0.0), self._expire, limit)

    def _end(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._started = None
        self.incomplete.pop(self, None)

    def _expire(self, limit: float) -> None:
        self._end()
        if self.transport is None or self.transport.is_closing():
            return
        # Still in the head, no response of this request can have started (self.cycle may be the last one's).
        if self._phase == _HEAD or self.cycle is None or not self.cycle.response_started:
            self.transport.write(_timeout_response(limit))
        self.transport.close()


def deadline_protocol(*, header_timeout_s: float, request_timeout_s: float, max_incomplete: int) -> type[H11Protocol]:
    """An HTTP protocol class for uvicorn (``http=``) with these limits; one class per server (it counts its own)."""
    return type("RequestDeadlineProtocol", (_DeadlineProtocol,), {
        "header_timeout_s": header_timeout_s, "request_timeout_s": request_timeout_s, "max_incomplete": max_incomplete,
        "incomplete": OrderedDict(),
    })


def uvicorn_options(config: ServerConfig) -> dict[str, Any]:
    """The uvicorn settings that bound connections: the protocol with ``config``'s request deadlines."""
    return {
        "http": deadline_protocol(
            header_timeout_s=config.header_timeout_s, request_timeout_s=config.request_timeout_s,
            max_incomplete=config.max_incomplete_requests,
        ),
        "timeout_keep_alive": 5,
    }
