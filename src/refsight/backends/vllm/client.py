"""A small JSON-over-HTTP client for a vLLM OpenAI server (standard library only).

Every failure becomes a refsight error naming the server, here and only here:
a server that cannot be reached or answers garbage is a
:class:`~refsight.errors.BackendError`; a request it rejects (HTTP 4xx: wrong
embedding width, wrong grid, too many images) or fails (5xx) or a timeout is a
:class:`~refsight.errors.GenerationError` carrying vLLM's own message.
"""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from typing import Any

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

    def chat(self, body: dict[str, Any]) -> dict[str, Any]:
        """``POST /v1/chat/completions``; returns the parsed answer."""
        answer = self._request("POST", "/v1/chat/completions", body, GenerationError, self.timeout)
        if not isinstance(answer, dict) or not answer.get("choices"):
            raise GenerationError(self.name, f"vLLM server at {self.base_url} returned no choices: {answer!r:.300}")
        return answer


def _message(error: urllib.error.HTTPError) -> str:
    """vLLM's error message out of an HTTP error body (``{"error": {"message": ...}}``)."""
    try:
        body = error.read().decode(errors="replace")
    except OSError:
        return error.reason or ""
    try:
        parsed = json.loads(body)
        inner = parsed.get("error", parsed)
        if isinstance(inner, dict):
            return str(inner.get("message") or inner)[:1000]
        return str(inner)[:1000]
    except ValueError:
        return body[:1000]
