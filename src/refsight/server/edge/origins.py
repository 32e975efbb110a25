"""Who may reach the server from a browser: ``Host`` and ``Origin`` checks, and opt-in CORS.

A server without API keys listens on loopback, but a web page in the user's browser can
still reach it: by DNS rebinding (a hostile name that resolves to 127.0.0.1, so the
browser sends ``Host: attacker.example``) or by a cross-site "simple" request (a form
``POST`` needs no preflight). So, **without keys**:

- the ``Host`` header must name loopback (``localhost``, ``127.0.0.1``, ``[::1]``), the bound
  ``--host``, or a name of ``--allowed-hosts``; anything else is 403 ``host_not_allowed``;
- a state-changing request (not GET/HEAD/OPTIONS) whose ``Origin`` is neither such a name nor
  one of ``--cors-origins`` is 403 ``origin_not_allowed``.

Both headers are parsed by their grammar, not searched: an origin is ``http(s)://HOST[:PORT]``
and nothing else (RFC 6454), a ``Host`` is ``HOST[:PORT]``. Anything more (user info as in
``http://127.0.0.1:1@evil.example``, a path, a query, spaces) is not a name of this server.

With keys a browser page cannot present them by itself (no cookie is accepted without the
page's own login), so nothing changes for API clients.

**CORS** (``--cors-origins``, as llama-server's flag: a comma-separated list, ``*`` for any origin,
``localhost`` for every loopback origin): a listed origin gets ``Access-Control-Allow-Origin`` (its
own value, reflected) on every reply, and a preflight ``OPTIONS`` is answered 200 before the key
check, as llama-server answers it; an origin not listed gets no CORS header, so its page cannot read a
reply. The default depends on the keys. With API keys it is llama-server's own, ``*``: any origin is echoed
(llama-server answers it so, credentials allowed), since a page without a key reads nothing but refusals.
Without keys it is ``localhost``, llama-server's ``localhost`` mode: a page served from ``http(s)://localhost``,
``127.0.0.1`` or ``[::1]`` on any port may read replies (it could reach the server anyway); any other origin needs
listing (llama-server's ``*`` is not followed there: every web page could read a keyless server's replies).

A preflight is answered in llama-server's shape (``Access-Control-Allow-Credentials: true``, its methods ``GET, POST,
DELETE, OPTIONS``), but with the headers the page asked for, not llama-server's ``*``: no browser lets ``*`` cover
``Authorization``, so a page sending a key could not call. The CORS headers are written with llama-server's
capitals (``Access-Control-Allow-Origin``), not lower-cased as Starlette writes names: HTTP names are
case-insensitive, but clients that read them into a plain dict (llama.cpp's own tests) look for those spellings.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

from .http_errors import error_response
from .tenants import Tenants, is_loopback

__all__ = ["OriginGuardMiddleware", "LOCALHOST", "authority_host", "origin_host"]

#: Methods that change nothing: a foreign Origin may send them (the browser withholds the reply without CORS).
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_PREFLIGHT_HEADERS = (b"access-control-request-method", b"access-control-request-headers")
#: ``HOST[:PORT]``: a name or IPv4 address, or an IPv6 address in brackets; nothing else.
_AUTHORITY = r"(?:\[(?P<ipv6>[0-9A-Fa-f:.]+)\]|(?P<name>[A-Za-z0-9._-]+))(?::[0-9]{1,5})?"
_HOST = re.compile(_AUTHORITY)
_ORIGIN = re.compile(r"https?://" + _AUTHORITY)
#: The ``--cors-origins`` entry for every loopback origin (llama-server's special value).
LOCALHOST = "localhost"
#: The hosts llama-server's ``localhost`` mode reflects (``origin_is_localhost``), any scheme and port.
_LOCAL_ORIGIN_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})


def authority_host(value: str) -> str | None:
    """The host of a ``Host`` header (``HOST[:PORT]``), lower-case, without port or IPv6 brackets; None
    when ``value`` is not of that form (user info, a path, spaces ...)."""
    match = _HOST.fullmatch(value.strip())
    return (match.group("ipv6") or match.group("name")).lower() if match else None


def origin_host(origin: str) -> str | None:
    """The host of a serialized ``Origin`` (``http(s)://HOST[:PORT]``, RFC 6454), lower-case; None when
    ``origin`` is anything else (``null``, user info, a path, a query ...)."""
    match = _ORIGIN.fullmatch(origin)
    return (match.group("ipv6") or match.group("name")).lower() if match else None


class OriginGuardMiddleware:
    """ASGI middleware: the ``Host``/``Origin`` rules of a keyless server and opt-in CORS (see the module)."""

    def __init__(
        self, app: Any, tenants: Tenants, host: str, allowed_hosts: Iterable[str] = (),
        cors_origins: Iterable[str] | None = (),
    ) -> None:
        self.app = app
        self.tenants = tenants
        self.names = frozenset(authority_host(name) or name.strip().lower() for name in (host, *allowed_hosts))
        if cors_origins is None:  # the default: llama-server's where keys guard the server (see the module)
            cors_origins = ("*",) if tenants.enabled else (LOCALHOST,)
        self.cors = frozenset(origin.strip().rstrip("/").lower() for origin in cors_origins if origin.strip())

    def _own(self, name: str | None) -> bool:
        return name is not None and (name in self.names or is_loopback(name) or name.endswith(".localhost"))

    def _cors_allows(self, origin: str) -> bool:
        if "*" in self.cors or origin.rstrip("/").lower() in self.cors:
            return True
        # Parsed by the origin grammar: ``http://localhost.evil.com`` and ``http://x@localhost`` are not local.
        return LOCALHOST in self.cors and origin_host(origin) in _LOCAL_ORIGIN_HOSTS

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        origin = headers.get(b"origin", b"").decode("latin-1")
        problem = None if self.tenants.enabled else self._keyless_problem(
            scope["method"], headers.get(b"host", b"").decode("latin-1"), origin
        )
        if problem is not None:
            await error_response(403, *problem)(scope, receive, send)
            return
        allowed = bool(origin) and self._cors_allows(origin)
        if scope["method"] == "OPTIONS" and any(h in headers for h in _PREFLIGHT_HEADERS):
            # A preflight carries no credentials: answered before the key check, as llama-server does.
            extra = _preflight_headers(headers) if allowed else {}
            await _empty(200, {**self._cors_headers(origin), **extra} if allowed else {}, send)
            return
        await self.app(scope, receive, _with_headers(send, self._cors_headers(origin)) if allowed else send)

    def _keyless_problem(self, method: str, host: str, origin: str) -> tuple[str, str] | None:
        # A request without Host (HTTP/1.0 tools) is no browser's: browsers always send it.
        if host and not self._own(authority_host(host)):
            return "host_not_allowed", (
                f"Host {host!r} is not this server's name: without API keys only loopback and the names given "
                "with --host or --allowed-hosts are served (DNS rebinding protection)"
            )
        if method in _SAFE_METHODS or not origin:
            return None
        if self._own(origin_host(origin)) or self._cors_allows(origin):
            return None
        return "origin_not_allowed", (
            f"Origin {origin!r} may not change anything on a server without API keys; "
            "list it with --cors-origins, or configure API keys"
        )

    def _cors_headers(self, origin: str) -> dict[str, str]:
        # ``*`` echoes the origin, as llama-server does with credentials allowed (a literal ``*`` would refuse them)
        return {"Access-Control-Allow-Origin": origin, "Vary": "Origin"}


def _preflight_headers(headers: dict[bytes, bytes]) -> dict[str, str]:
    requested = headers.get(b"access-control-request-headers", b"").decode("latin-1")
    return {
        "Access-Control-Allow-Credentials": "true",
        "Access-Control-Allow-Methods": "GET, POST, DELETE, OPTIONS",
        "Access-Control-Allow-Headers": requested or "Authorization, Content-Type, X-API-Key",
        "Access-Control-Max-Age": "600",
    }


def _raw(headers: dict[str, str]) -> list[tuple[bytes, bytes]]:
    """``headers`` as ASGI's raw pairs, the names as written (llama-server's capitals: see the module)."""
    return [(name.encode("latin-1"), value.encode("latin-1")) for name, value in headers.items()]


async def _empty(status: int, headers: dict[str, str], send: Callable) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [*_raw(headers), (b"content-length", b"0")]})
    await send({"type": "http.response.body", "body": b""})


def _with_headers(send: Callable, headers: dict[str, str]) -> Callable:
    """``send`` with ``headers`` added to the response's start."""
    extra = _raw(headers)

    async def send_with_headers(message: dict) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []), *extra]}
        await send(message)

    return send_with_headers
