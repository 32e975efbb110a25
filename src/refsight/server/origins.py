"""Who may reach the server from a browser: ``Host`` and ``Origin`` checks, and opt-in CORS.

A server without API keys listens on loopback, but a web page in the user's browser can
still reach it: by DNS rebinding (a hostile name that resolves to 127.0.0.1, so the
browser sends ``Host: attacker.example``) or by a cross-site "simple" request (a form
``POST`` needs no preflight). So, **without keys**:

- the ``Host`` header must name loopback (``localhost``, ``127.0.0.1``, ``[::1]``), the bound
  ``--host``, or a name of ``--allowed-hosts``; anything else is 403 ``host_not_allowed``;
- a state-changing request (not GET/HEAD/OPTIONS) whose ``Origin`` is neither such a name nor
  one of ``--cors-origins`` is 403 ``origin_not_allowed``.

With keys a browser page cannot present them by itself (no cookie is accepted without the
page's own login), so nothing changes for API clients.

**CORS is opt-in** (``--cors-origins``, as llama-server's flag: a comma-separated list, ``*`` for
any origin): a listed origin gets ``Access-Control-Allow-Origin`` on every reply, and a
preflight ``OPTIONS`` is answered 200 before the key check, as llama-server answers it;
an origin not listed gets no CORS header, so its page cannot read a reply.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import urlsplit

from starlette.responses import Response

from .errors import error_response
from .tenants import Tenants, is_loopback

__all__ = ["OriginGuardMiddleware", "host_name"]

#: Methods that change nothing: a foreign Origin may send them (the browser withholds the reply without CORS).
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_PREFLIGHT_HEADERS = (b"access-control-request-method", b"access-control-request-headers")


def host_name(value: str) -> str:
    """The host of a ``Host`` header or an origin's netloc, lower-case, without port or IPv6 brackets."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1:value.find("]")] if "]" in value else value[1:]
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


class OriginGuardMiddleware:
    """ASGI middleware: the ``Host``/``Origin`` rules of a keyless server and opt-in CORS (see the module)."""

    def __init__(
        self, app: Any, tenants: Tenants, host: str, allowed_hosts: Iterable[str] = (), cors_origins: Iterable[str] = ()
    ) -> None:
        self.app = app
        self.tenants = tenants
        self.names = frozenset({host_name(host), *(host_name(name) for name in allowed_hosts)})
        self.cors = frozenset(origin.strip().rstrip("/").lower() for origin in cors_origins if origin.strip())

    def _own(self, name: str) -> bool:
        return name in self.names or is_loopback(name) or name.endswith(".localhost")

    def _cors_allows(self, origin: str) -> bool:
        return "*" in self.cors or origin.rstrip("/").lower() in self.cors

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        origin = headers.get(b"origin", b"").decode("latin-1")
        if not self.tenants.enabled:
            problem = self._keyless_problem(scope["method"], headers.get(b"host", b"").decode("latin-1"), origin)
            if problem is not None:
                await error_response(403, *problem)(scope, receive, send)
                return
        allowed = bool(origin) and self._cors_allows(origin)
        if scope["method"] == "OPTIONS" and any(h in headers for h in _PREFLIGHT_HEADERS):
            # A preflight carries no credentials: answered before the key check, as llama-server does.
            extra = _preflight_headers(headers) if allowed else {}
            await _empty(200, {**self._cors_headers(origin), **extra} if allowed else {})(scope, receive, send)
            return
        if not allowed:
            await self.app(scope, receive, send)
            return
        cors = [(k.lower().encode(), v.encode()) for k, v in self._cors_headers(origin).items()]

        async def send_with_cors(message: dict) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *cors]}
            await send(message)

        await self.app(scope, receive, send_with_cors)

    def _keyless_problem(self, method: str, host: str, origin: str) -> tuple[str, str] | None:
        # A request without Host (HTTP/1.0 tools) is no browser's: browsers always send it.
        if host and not self._own(host_name(host)):
            return "host_not_allowed", (
                f"Host {host!r} is not this server's name: without API keys only loopback and the names given "
                "with --host or --allowed-hosts are served (DNS rebinding protection)"
            )
        if method in _SAFE_METHODS or not origin:
            return None
        netloc = urlsplit(origin).netloc if origin != "null" else ""
        if (netloc and self._own(host_name(netloc))) or self._cors_allows(origin):
            return None
        return "origin_not_allowed", (
            f"Origin {origin!r} may not change anything on a server without API keys; "
            "list it with --cors-origins, or configure API keys"
        )

    def _cors_headers(self, origin: str) -> dict[str, str]:
        return {"Access-Control-Allow-Origin": "*" if "*" in self.cors else origin, "Vary": "Origin"}


def _preflight_headers(headers: dict[bytes, bytes]) -> dict[str, str]:
    requested = headers.get(b"access-control-request-headers", b"").decode("latin-1")
    return {
        "Access-Control-Allow-Methods": "GET, POST, PUT, PATCH, DELETE, OPTIONS",
        "Access-Control-Allow-Headers": requested or "Authorization, Content-Type, X-API-Key",
        "Access-Control-Max-Age": "600",
    }


def _empty(status: int, headers: dict[str, str]) -> Response:
    return Response(b"", status_code=status, headers=headers)
