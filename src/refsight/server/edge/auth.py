"""Who is calling: the presented API key turned into a namespace, with one set of rules.

Keys arrive as ``Authorization: Bearer KEY`` (what the OpenAI SDK sends) or
``X-API-Key: KEY``. A missing or wrong key is a 401 that never echoes the key, and
so are ambiguous credentials: another ``Authorization`` scheme (``Basic``...), or a
bearer token and an ``X-API-Key`` that differ. :func:`authenticate` holds these
rules; the FastAPI dependencies (:func:`require_tenant`, :func:`require_operator`)
and :class:`~refsight.server.edge.gate.AuthGateMiddleware` (which refuses before the body
is read) both call it.
"""

from __future__ import annotations

import hmac
import re
from collections.abc import Mapping
from urllib.parse import unquote

from fastapi import Depends, Path, Request
from fastapi.security import APIKeyHeader, HTTPBearer

from .http_errors import ApiError
from .tenants import OPERATOR, Tenants

__all__ = ["REF_ID_PATH", "authenticate", "credential_headers", "presented_key", "require_operator", "require_tenant"]

# Declared for the OpenAPI schema (the security schemes the docs show); the headers are
# read by presented_key(), which applies the stricter rules.
_bearer = HTTPBearer(auto_error=False, description="API key as a bearer token (what the OpenAI SDK sends)")
_api_key = APIKeyHeader(name="X-API-Key", auto_error=False, description="API key (alternative to Authorization)")

#: The ``{ref_id}`` path parameter (validated as a reference id by the library: 400
#: ``invalid_reference_id`` for any bad id, the same code as an id in a body).
REF_ID_PATH = Path(description="reference id")


def _unauthorized(message: str) -> ApiError:
    return ApiError(401, "unauthorized", message, headers={"WWW-Authenticate": "Bearer"})


def presented_key(headers: Mapping[str, str]) -> str | None:
    """The API key in ``headers`` (lower-case names), or None; 401 for ambiguous credentials.

    Refused: an ``Authorization`` header that is not ``Bearer KEY`` (e.g. ``Basic``),
    and a bearer token and ``X-API-Key`` that carry different keys.
    """
    authorization = (headers.get("authorization") or "").strip()
    api_key = (headers.get("x-api-key") or "").strip() or None
    bearer = None
    if authorization:
        scheme, _, credentials = authorization.partition(" ")
        if scheme.lower() != "bearer":
            raise _unauthorized(
                f"Authorization: the {scheme[:20]!r} scheme is not accepted; send Authorization: Bearer KEY or X-API-Key: KEY"
            )
        bearer = credentials.strip() or None
        if bearer is None:
            raise _unauthorized("Authorization: Bearer needs a key after it")
    if bearer is not None and api_key is not None and not hmac.compare_digest(bearer.encode(), api_key.encode()):
        raise _unauthorized("Authorization and X-API-Key carry different keys; send one key")
    return bearer or api_key


def authenticate(headers: Mapping[str, str], tenants: Tenants, *, operator: bool = False) -> str | None:
    """The caller's namespace under the tenant rules, or under ``/metrics``'s rules with ``operator``.

    Without configured keys every caller is the default tenant and credentials are not
    looked at (returns the default namespace, or None for the operator route). Raises
    401 for missing, wrong or ambiguous credentials and 403 for a key of the wrong kind.
    """
    if not tenants.enabled:
        return None if operator else tenants.default_namespace
    presented = presented_key(headers)
    namespace = tenants.resolve(presented)
    if namespace is None:
        raise _unauthorized("missing API key" if not presented else "invalid API key")
    if operator and namespace != OPERATOR:
        raise ApiError(403, "forbidden", f"/metrics needs an operator key (KEY={OPERATOR} in the keys file)")
    if not operator and namespace == OPERATOR:
        raise ApiError(403, "forbidden", "an operator key may read /metrics only")
    return namespace


#: The cookie the page sets so that its thumbnails are plain ``<img>`` elements on a keyed server.
IMAGE_COOKIE = "refsight_key"
#: The only requests the cookie authenticates: reading one reference's thumbnail or image.
_IMAGE_PATH = re.compile(r"/v1/references/[^/]+/(thumbnail|image)")


def credential_headers(pairs: list[tuple[str, str]], method: str = "", path: str = "") -> dict[str, str]:
    """The ``authorization`` and ``x-api-key`` headers among ``(name, value)`` pairs; 401 when one repeats.

    A GET (or HEAD) of a reference's thumbnail or image with neither header may carry the key in the
    :data:`IMAGE_COOKIE` cookie instead (an ``<img>`` cannot send a header). Only there: a cookie
    never authenticates a write or a listing, and the page sets it ``SameSite=Strict``, so another
    site's page cannot make the browser send it.
    """
    found: dict[str, str] = {}
    cookies: list[str] = []
    for name, value in pairs:
        name = name.lower()
        if name in ("authorization", "x-api-key"):
            if name in found:
                raise _unauthorized(f"{name}: the header is given more than once; send it once")
            found[name] = value
        elif name == "cookie":
            cookies.append(value)
    if not found and method in ("GET", "HEAD") and _IMAGE_PATH.fullmatch(path):
        key = _cookie_key(cookies)
        if key:
            found["x-api-key"] = key
    return found


def _cookie_key(cookie_headers: list[str]) -> str | None:
    for header in cookie_headers:
        for part in header.split(";"):
            name, _, value = part.strip().partition("=")
            if name == IMAGE_COOKIE:
                return unquote(value.strip()) or None
    return None


def _headers(request: Request) -> dict[str, str]:
    return credential_headers(request.headers.items(), request.method, request.url.path)


async def require_tenant(
    request: Request,
    _b: object = Depends(_bearer),
    _k: object = Depends(_api_key),
) -> str:
    """The caller's namespace; 401 for a missing, wrong or ambiguous key (the key itself is never echoed)."""
    namespace = authenticate(_headers(request), request.app.state.tenants)
    assert namespace is not None
    return namespace


async def require_operator(
    request: Request,
    _b: object = Depends(_bearer),
    _k: object = Depends(_api_key),
) -> None:
    """Guard of ``/metrics``: open without tenants; with tenants only an operator key (its counters span tenants)."""
    authenticate(_headers(request), request.app.state.tenants, operator=True)
