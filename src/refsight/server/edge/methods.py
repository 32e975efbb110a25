"""HEAD is answered like GET, without a body (RFC 9110 §9.3.2).

FastAPI routes declare GET only, so a HEAD request (what monitors, link checkers and
``curl -I`` send) was answered 405. :class:`HeadAsGetMiddleware` runs the GET route and
sends its status and headers, ``Content-Length`` included, with an empty body.
"""

from __future__ import annotations

from typing import Any

__all__ = ["HeadAsGetMiddleware"]


class HeadAsGetMiddleware:
    """ASGI middleware: a HEAD request is routed as GET, and the body of its answer is dropped."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return

        async def without_body(message: dict) -> None:
            if message["type"] == "http.response.body":
                message = {**message, "body": b""}
            await send(message)

        # A copy: the server keeps its own scope, which still says HEAD (so it frames the reply as one).
        await self.app({**scope, "method": "GET"}, receive, without_body)
