"""Errors that middlewares answer (the auth gate, the body limits) in the shape of the path's routes.

Route handlers answer in their dialect's shape already (:func:`~refsight.server.edge.http_errors.error_response_for`);
middlewares that refuse a request before any route runs answer refsight's ``{"error": {"code", "message"}}``.
:class:`ErrorShapeMiddleware` reshapes those bodies on the OpenAI paths (adding ``type`` and ``param``, so
the OpenAI SDK raises its typed exceptions), on Ollama's (``{"error": "message", "code"}``, what
Ollama's clients raise with) and on Anthropic's (``{"type": "error", "error": {"type", "message"}}``),
so a client sees one shape whatever refused its request.
"""

from __future__ import annotations

import json
from typing import Any, Callable

from .http_errors import ANTHROPIC_PATHS, OLLAMA_PATHS, OPENAI_PATHS, anthropic_error_body, ollama_error_body, openai_error_body

__all__ = ["ErrorShapeMiddleware"]


def _openai(data: dict[str, Any], status: int) -> dict[str, Any]:
    error = data["error"]
    error.setdefault("type", openai_error_body(status, "", "")["error"]["type"])
    error.setdefault("param", None)
    return data


def _ollama(data: dict[str, Any], status: int) -> dict[str, Any]:
    return ollama_error_body(data["error"]["code"], data["error"]["message"])


def _anthropic(data: dict[str, Any], status: int) -> dict[str, Any]:
    if data.get("type") == "error":
        return data  # a route's answer, already in Anthropic's shape
    return anthropic_error_body(status, data["error"]["code"], data["error"]["message"])


def _reshaper(path: str) -> Callable[[dict[str, Any], int], dict[str, Any]] | None:
    if path.startswith(OPENAI_PATHS):
        return _openai
    if path.startswith(OLLAMA_PATHS):
        return _ollama
    if path.startswith(ANTHROPIC_PATHS):
        return _anthropic
    return None


class ErrorShapeMiddleware:
    """ASGI middleware: on the OpenAI and Ollama paths, a refsight-shaped JSON error body takes the path's shape."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        reshape = _reshaper(str(scope.get("path", ""))) if scope["type"] == "http" else None
        if reshape is None:
            await self.app(scope, receive, send)
            return
        held: dict[str, Any] = {}
        chunks: list[bytes] = []

        async def shaping_send(message: dict) -> None:
            if message["type"] == "http.response.start":
                content_type = dict(message.get("headers") or []).get(b"content-type", b"")
                if message["status"] >= 400 and content_type.startswith(b"application/json"):
                    held["start"] = message  # an error: hold it until its body is complete
                    return
                await send(message)
                return
            if "start" not in held or message["type"] != "http.response.body":
                await send(message)
                return
            chunks.append(message.get("body", b""))
            if message.get("more_body", False):
                return
            body = _reshaped(b"".join(chunks), held["start"]["status"], reshape)
            start = dict(held.pop("start"))
            start["headers"] = [(k, v) for k, v in start.get("headers") or [] if k.lower() != b"content-length"]
            start["headers"].append((b"content-length", str(len(body)).encode()))
            await send(start)
            await send({"type": "http.response.body", "body": body, "more_body": False})

        await self.app(scope, receive, shaping_send)


def _reshaped(body: bytes, status: int, reshape: Callable[[dict[str, Any], int], dict[str, Any]]) -> bytes:
    """``body`` in the path's shape when it is refsight's error body; anything else unchanged."""
    try:
        data = json.loads(body)
        error = data["error"]
        if isinstance(error, dict) and "code" in error and "message" in error:
            return json.dumps(reshape(data, status)).encode()
    except (ValueError, KeyError, TypeError):
        pass  # not an error body of ours: pass it on unchanged
    return body
