"""llama-server's routes read their body as JSON whatever the ``Content-Type`` says.

llama-server parses every POST body as JSON, so its clients (and ``curl -d``, which sends
``application/x-www-form-urlencoded``) often send no JSON media type at all; FastAPI would
then refuse the body (422). :class:`JsonContentMiddleware` marks the body of a POST to one
of those routes as ``application/json`` before routing, so it is parsed (and checked) as
JSON exactly as a correctly labelled one. Other routes keep their own rules (the reference
routes take multipart too, and refuse other types with 415).
"""

from __future__ import annotations

from typing import Any

__all__ = ["JsonContentMiddleware", "JSON_ROUTES"]

#: The POST routes llama-server answers (with and without /v1) whose bodies are JSON whatever their label.
JSON_ROUTES = frozenset({
    "/completion", "/completions", "/v1/completions", "/chat/completions", "/v1/chat/completions",
    "/tokenize", "/detokenize", "/apply-template",
})


class JsonContentMiddleware:
    """ASGI middleware: a POST to :data:`JSON_ROUTES` without a JSON media type is labelled ``application/json``."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"] in JSON_ROUTES:
            # ASGI header names are lower-case bytes; a charset parameter keeps an application/json label as it is.
            labels = [v.split(b";")[0].strip().lower() for k, v in scope["headers"] if k == b"content-type"]
            if labels != [b"application/json"]:
                headers = [(k, v) for k, v in scope["headers"] if k != b"content-type"]
                # A copy: the server keeps its own scope.
                scope = {**scope, "headers": [*headers, (b"content-type", b"application/json")]}
        await self.app(scope, receive, send)
