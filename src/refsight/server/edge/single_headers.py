"""The headers the edge decides by, each given at most once, before anything reads them.

Each check of the edge reads one value of a header: the keyless server's ``Host`` and ``Origin``
rules (:mod:`.origins`), the body's size and framing (``Content-Length``, ``Transfer-Encoding``:
:mod:`.limits` and the HTTP parser) and how it is read (``Content-Type``: :mod:`.json_content`).
Given twice, two readers could take different copies (a mapping of the headers keeps the last, a
header lookup the first): ``Origin: http://evil.example`` then ``Origin: http://localhost`` passed
the origin check on the second while a browser had sent the first. So a request that repeats one of
:data:`SINGLE_HEADERS`, or sends both ``Content-Length`` and ``Transfer-Encoding`` (a body framed two
ways: request smuggling behind a proxy), is refused with 400 ``duplicate_header`` naming it, before
any other middleware runs. ``Authorization`` and ``X-API-Key`` are already refused when repeated, by
the key check itself (401, :func:`~.auth.credential_headers`); ``Cookie`` lines are read as one list
(the first ``refsight_key`` cookie), as RFC 6265 has a client send them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from .http_errors import error_response_for

__all__ = ["SingleHeadersMiddleware", "SINGLE_HEADERS", "header_problem"]

#: Headers a request may give at most once (lower case, as ASGI names them).
SINGLE_HEADERS = (b"host", b"origin", b"content-type", b"content-length", b"transfer-encoding")


def header_problem(headers: list[tuple[bytes, bytes]]) -> str | None:
    """Why these request headers are refused (a header repeated, a body framed two ways), or None."""
    counts = Counter(name.lower() for name, _ in headers)
    for name in SINGLE_HEADERS:
        if counts[name] > 1:
            return f"{name.decode()}: the header is given {counts[name]} times; send it once"
    if counts[b"content-length"] and counts[b"transfer-encoding"]:
        return "content-length: sent with transfer-encoding (the body framed two ways); send one"
    return None


class SingleHeadersMiddleware:
    """ASGI middleware: 400 ``duplicate_header`` for :func:`header_problem`, in the shape of the path's dialect."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        problem = header_problem(scope.get("headers") or []) if scope["type"] == "http" else None
        if problem is None:
            await self.app(scope, receive, send)
            return
        response = error_response_for(scope.get("path", ""), 400, "duplicate_header", problem,
                                      param=problem.partition(":")[0])
        await response(scope, receive, send)
