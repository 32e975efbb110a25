"""A small JSON-over-HTTP client for a vLLM OpenAI server (standard library only).

Every failure becomes a refsight error naming the server, here and only here:
a server that cannot be reached or answers garbage is a
:class:`~refsight.errors.BackendError`; a request it rejects (HTTP 4xx: wrong
embedding width, wrong grid, too many images) or fails (5xx) or a timeout is a
:class:`~refsight.errors.GenerationError` carrying vLLM's own message.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Callable, Iterator

from ...errors import BackendError, GenerationError

__all__ = ["VLLMClient", "DEFAULT_TIMEOUT_S"]

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

    def _request(self, method: str, path: str, body: Any | None, error: type[BackendError], timeout: float) -> Any:
        url = f"{self.base_url}{path}"
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                payload = response.read()
        except urllib.error.HTTPError as e:
            raise error(self.name, f"vLLM server at {self.base_url} answered HTTP {e.code}: {_message(e)}") from None
        except (socket.timeout, TimeoutError) as e:
            raise error(self.name, f"vLLM server at {self.base_url} did not answer within {timeout:g} s ({e})") from None
        except urllib.error.URLError as e:
            if isinstance(e.reason, (socket.timeout, TimeoutError)):
                raise error(self.name, f"vLLM server at {self.base_url} did not answer within {timeout:g} s") from None
            raise BackendError(self.name, f"vLLM server at {self.base_url} is not reachable: {e.reason}") from None
        except (ConnectionError, OSError) as e:
            raise BackendError(self.name, f"vLLM server at {self.base_url} is not reachable: {e}") from None
        try:
            return json.loads(payload)
        except ValueError:
            raise BackendError(self.name, f"vLLM server at {self.base_url} sent non-JSON: {payload[:200]!r}") from None

    def models(self, timeout: float | None = None) -> list[dict[str, Any]]:
        """``GET /v1/models``: the served models (``id``, ``root`` = the model folder or hub id)."""
        answer = self._request("GET", "/v1/models", None, BackendError, timeout or min(self.timeout, 30.0))
        data = answer.get("data") if isinstance(answer, dict) else None
        if not data:
            raise BackendError(self.name, f"vLLM server at {self.base_url} serves no model: {answer!r:.200}")
        return data

    def metrics(self) -> str:
        """``GET /metrics``: the server's Prometheus text."""
        url = f"{self.base_url}/metrics"
        try:
            with urllib.request.urlopen(url, timeout=min(self.timeout, 30.0)) as response:
                return response.read().decode("utf-8", "replace")
        except (urllib.error.URLError, OSError) as e:
            raise BackendError(self.name, f"vLLM server at {self.base_url} gave no /metrics: {e}") from None

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
            payload = response.read()
            raise GenerationError(self.name, f"vLLM server at {self.base_url} answered HTTP {response.status}: {_body_message(payload)}")
        return response

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


def _message(error: urllib.error.HTTPError) -> str:
    """vLLM's error message out of an HTTP error body (``{"error": {"message": ...}}``)."""
    try:
        body = error.read().decode(errors="replace")
    except OSError:
        return error.reason or ""
    try:
        return _inner_message(json.loads(body))
    except ValueError:
        return body[:1000]
