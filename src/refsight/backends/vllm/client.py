"""A small JSON-over-HTTP client for a vLLM OpenAI server (standard library only).

Every failure becomes a refsight error naming the server, here and only here:
a server that cannot be reached or answers garbage is a
:class:`~refsight.errors.BackendError`; a request it rejects (HTTP 4xx: wrong
embedding width, wrong grid, too many images) or fails (5xx) or a timeout is a
:class:`~refsight.errors.GenerationError` carrying vLLM's own message, but for a prompt over
vLLM's context: the caller's, a :class:`~refsight.errors.ContextLengthError` with vLLM's figures
(llama-server's 400 ``exceed_context_size_error`` on refsight's server, not a 500).
"""

from __future__ import annotations

import http.client
import json
import re
import socket
import threading
import urllib.parse
import weakref
from typing import Any, Callable, Iterator

from ...errors import BackendError, ContextLengthError, GenerationError

__all__ = ["VLLMClient", "DEFAULT_TIMEOUT_S"]

#: vLLM's refusals of a prompt longer than its context (``vllm/renderers/params.py`` and
#: ``entrypoints/serve/utils/api_utils.py``), whose figures become a ContextLengthError's. vLLM itself
#: cuts ``max_tokens`` to the room the prompt leaves, so only the prompt can be over.
_OVER_CONTEXT = (
    re.compile(r"maximum context length is (?P<ctx>\d+) tokens\. However, your prompt contains (?:at least )?"
               r"(?P<prompt>\d+) input tokens"),
    re.compile(r"Input length \((?P<prompt>\d+)\) exceeds model's maximum context length \((?P<ctx>\d+)\)"),
)

#: Seconds one request may take: generous, since a CPU server can queue many requests.
DEFAULT_TIMEOUT_S = 600.0


class VLLMClient:
    """Talks to one vLLM OpenAI-compatible server at ``base_url`` (``http://host:port``)."""

    def __init__(self, name: str, base_url: str, *, timeout: float = DEFAULT_TIMEOUT_S) -> None:
        self.name = name
        self.base_url = base_url.rstrip("/")
        if self.base_url.endswith("/v1"):
            self.base_url = self.base_url[: -len("/v1")]
        self.timeout = float(timeout)
        self._prefix = urllib.parse.urlsplit(self.base_url).path or ""
        self._local = threading.local()
        self._lock = threading.Lock()
        # Weak: a thread that ends (the server's worker pool retires idle threads) takes its connection with it.
        self._connections: weakref.WeakSet[http.client.HTTPConnection] = weakref.WeakSet()

    def _connection(self, timeout: float) -> http.client.HTTPConnection:
        """This thread's kept-alive connection to the server (a new TCP connection per request cost ~0.6 ms)."""
        connection = getattr(self._local, "connection", None)
        if connection is None:
            parsed = urllib.parse.urlsplit(self.base_url)
            kind = http.client.HTTPSConnection if parsed.scheme == "https" else http.client.HTTPConnection
            connection = self._local.connection = kind(parsed.hostname, parsed.port, timeout=timeout)
            with self._lock:
                self._connections.add(connection)
        connection.timeout = timeout
        if connection.sock is None:
            connection.connect()
            # A body's last short segment must not wait for the previous one's (delayed) ACK: 40 ms per request.
            connection.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        connection.sock.settimeout(timeout)
        return connection

    def _drop_connection(self) -> None:
        connection = getattr(self._local, "connection", None)
        self._local.connection = None
        if connection is not None:
            with self._lock:
                self._connections.discard(connection)
            connection.close()

    def _exchange(self, method: str, path: str, data: bytes | None, timeout: float) -> tuple[int, bytes]:
        """(status, body) over the kept connection; once more on a fresh one if the kept one was closed meanwhile."""
        headers = {"Content-Type": "application/json"} if data is not None else {}
        for attempt in (0, 1):
            reused = getattr(self._local, "connection", None) is not None
            try:
                connection = self._connection(timeout)
                connection.request(method, self._prefix + path, body=data, headers=headers)
                response = connection.getresponse()
                payload = response.read()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError, http.client.CannotSendRequest,
                    http.client.BadStatusLine):
                self._drop_connection()
                if reused and attempt == 0:
                    continue  # the server closed an idle kept-alive connection: nothing was processed
                raise
            except BaseException:
                self._drop_connection()
                raise
            if response.will_close:
                self._drop_connection()
            return response.status, payload
        raise AssertionError("unreachable")

    def _request(self, method: str, path: str, body: Any | None, error: type[BackendError], timeout: float) -> Any:
        data = None if body is None else json.dumps(body).encode()
        try:
            status, payload = self._exchange(method, path, data, timeout)
        except (socket.timeout, TimeoutError) as e:
            raise error(self.name, f"vLLM server at {self.base_url} did not answer within {timeout:g} s ({e})") from None
        except (ConnectionError, OSError, http.client.HTTPException) as e:
            raise BackendError(self.name, f"vLLM server at {self.base_url} is not reachable: {e}") from None
        if not 200 <= status < 300:
            raise self._refusal(status, payload, error)
        try:
            return json.loads(payload)
        except ValueError:
            raise BackendError(self.name, f"vLLM server at {self.base_url} sent non-JSON: {payload[:200]!r}") from None

    def close(self) -> None:
        """Close every kept connection (each thread's)."""
        with self._lock:
            connections = list(self._connections)
            self._connections.clear()
        for connection in connections:
            connection.close()

    def models(self, timeout: float | None = None) -> list[dict[str, Any]]:
        """``GET /v1/models``: the served models (``id``, ``root`` = the model folder or hub id)."""
        answer = self._request("GET", "/v1/models", None, BackendError, timeout or min(self.timeout, 30.0))
        data = answer.get("data") if isinstance(answer, dict) else None
        if not data:
            raise BackendError(self.name, f"vLLM server at {self.base_url} serves no model: {answer!r:.200}")
        return data

    def metrics(self) -> str:
        """``GET /metrics``: the server's Prometheus text."""
        try:
            status, payload = self._exchange("GET", "/metrics", None, min(self.timeout, 30.0))
        except (OSError, http.client.HTTPException) as e:
            raise BackendError(self.name, f"vLLM server at {self.base_url} gave no /metrics: {e}") from None
        if status != 200:
            raise BackendError(self.name, f"vLLM server at {self.base_url} gave no /metrics: HTTP {status}")
        return payload.decode("utf-8", "replace")

    def chat(self, body: dict[str, Any]) -> dict[str, Any]:
        """``POST /v1/chat/completions``; returns the parsed answer."""
        answer = self._request("POST", "/v1/chat/completions", body, GenerationError, self.timeout)
        if not isinstance(answer, dict) or not answer.get("choices"):
            raise GenerationError(self.name, f"vLLM server at {self.base_url} returned no choices: {answer!r:.300}")
        return answer

    def chat_stream(
        self, body: dict[str, Any], on_chunk: Callable[[dict[str, Any]], None], stop_event: threading.Event | None = None
    ) -> bool:
        """``POST /v1/chat/completions`` with ``"stream": true``; ``on_chunk`` gets each parsed SSE event in order.

        The body is read line by line as vLLM sends it. Once ``stop_event`` is set the
        connection is shut (vLLM aborts a request whose client went away) and True is
        returned; False when the stream ended with ``[DONE]``.
        """
        if stop_event is not None and stop_event.is_set():
            return True
        parsed = urllib.parse.urlsplit(self.base_url)
        kind = http.client.HTTPSConnection if parsed.scheme == "https" else http.client.HTTPConnection
        connection = kind(parsed.hostname, parsed.port, timeout=self.timeout)
        watch = _CancelWatch(connection, stop_event)
        try:
            response = self._open_stream(connection, (parsed.path or "") + "/v1/chat/completions", body, watch)
            for event in self._events(response, watch):
                on_chunk(event)
                if stop_event is not None and stop_event.is_set():
                    watch.cancel()  # set by on_chunk's callback itself: stop reading at once
            return watch.cancelled.is_set()
        except (socket.timeout, TimeoutError) as e:
            if watch.cancelled.is_set():
                return True
            raise GenerationError(self.name, f"vLLM server at {self.base_url} did not answer within {self.timeout:g} s ({e})") from None
        except (ConnectionError, OSError, http.client.HTTPException) as e:
            if watch.cancelled.is_set():
                return True
            raise BackendError(self.name, f"vLLM server at {self.base_url} is not reachable: {e}") from None
        finally:
            watch.finish()
            connection.close()

    def _open_stream(self, connection: Any, path: str, body: dict[str, Any], watch: "_CancelWatch") -> Any:
        """Send the request; the response once vLLM accepted it (any other status is a GenerationError)."""
        connection.request(
            "POST", path, body=json.dumps(body).encode(),
            headers={"Content-Type": "application/json", "Accept": "text/event-stream"},
        )
        watch.start()
        response = connection.getresponse()
        if response.status != 200:
            raise self._refusal(response.status, response.read(), GenerationError)
        return response

    def _refusal(self, status: int, payload: bytes, error: type[BackendError]) -> Exception:
        """The refsight error for vLLM's non-2xx answer: a prompt over its context is the caller's
        (:class:`ContextLengthError`), anything else ``error`` with vLLM's message."""
        message = _body_message(payload)
        found = next((m for m in (p.search(message) for p in _OVER_CONTEXT) if m), None) if status == 400 else None
        if found:
            prompt, context = int(found["prompt"]), int(found["ctx"])
            return ContextLengthError("prompt", f"{prompt} tokens do not fit the context of {context} tokens "
                                      f"(vLLM at {self.base_url})", n_prompt_tokens=prompt, n_ctx=context)
        return error(self.name, f"vLLM server at {self.base_url} answered HTTP {status}: {message}")

    def _events(self, response: Any, watch: "_CancelWatch") -> Iterator[dict[str, Any]]:
        """The parsed ``data:`` events of an SSE response, until ``[DONE]`` or a cancel."""
        while not watch.cancelled.is_set():
            raw = response.readline()
            if watch.cancelled.is_set():
                return
            if not raw:
                raise GenerationError(self.name, f"vLLM server at {self.base_url} ended the stream without [DONE]")
            line = raw.decode("utf-8", errors="replace").strip()
            if not line.startswith("data:"):
                continue  # blank separators, comments, other SSE fields
            data = line[len("data:"):].strip()
            if data == "[DONE]":
                return
            try:
                event = json.loads(data)
            except ValueError:
                raise GenerationError(self.name, f"vLLM server at {self.base_url} streamed non-JSON: {data[:200]!r}") from None
            if isinstance(event, dict) and event.get("error"):
                raise GenerationError(self.name, f"vLLM server at {self.base_url} failed mid-stream: {_inner_message(event)}")
            yield event

    def metric_sum(self, name: str) -> float:
        """The sum of a Prometheus counter's samples (``name_total{...} v`` or ``name{...} v``) in ``/metrics``."""
        total = 0.0
        for line in self.metrics().splitlines():
            if line.startswith((name + "_total{", name + "{", name + "_total ", name + " ")):
                total += float(line.rsplit(" ", 1)[1])
        return total


class _CancelWatch:
    """Shuts a streaming connection's socket as soon as the stop event is set.

    A thread waits on the event, so a read blocked on the next token returns at once
    (vLLM then aborts the request); :attr:`cancelled` says it happened.
    """

    def __init__(self, connection: Any, stop_event: threading.Event | None) -> None:
        self.connection = connection
        self.stop_event = stop_event
        self.cancelled = threading.Event()
        self._finished = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Begin watching (once the request is sent)."""
        if self.stop_event is not None:
            self._thread = threading.Thread(target=self._watch, name="refsight-vllm-cancel", daemon=True)
            self._thread.start()

    def cancel(self) -> None:
        """Mark the stream cancelled (the event was seen by the reader itself)."""
        self.cancelled.set()

    def _watch(self) -> None:
        assert self.stop_event is not None
        while not self._finished.is_set():
            if self.stop_event.wait(0.05):
                self.cancelled.set()
                sock = self.connection.sock
                if sock is not None:
                    try:
                        sock.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                return

    def finish(self) -> None:
        """Stop watching and wait for the thread."""
        self._finished.set()
        if self._thread is not None and self._thread.is_alive():
            self._thread.join()


def _inner_message(parsed: Any) -> str:
    """The message of an OpenAI error object (``{"error": {"message": ...}}``)."""
    inner = parsed.get("error", parsed) if isinstance(parsed, dict) else parsed
    if isinstance(inner, dict):
        return str(inner.get("message") or inner)[:1000]
    return str(inner)[:1000]


def _body_message(payload: bytes) -> str:
    body = payload.decode(errors="replace")
    try:
        return _inner_message(json.loads(body))
    except ValueError:
        return body[:1000]
