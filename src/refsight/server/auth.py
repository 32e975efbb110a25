"""Who is calling: FastAPI dependencies that turn the presented API key into a namespace.

Keys arrive as ``Authorization: Bearer KEY`` (what the OpenAI SDK sends) or
``X-API-Key: KEY``. A missing or wrong key is a 401 that never echoes the key.
"""

from __future__ import annotations

from fastapi import Depends, Path, Request
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer

from .errors import ApiError
from .tenants import OPERATOR, Tenants

__all__ = ["require_tenant", "require_operator", "REF_ID_PATH"]

_bearer = HTTPBearer(auto_error=False, description="API key as a bearer token (what the OpenAI SDK sends)")
_api_key = APIKeyHeader(name="X-API-Key", auto_error=False, description="API key (alternative to Authorization)")

#: The ``{ref_id}`` path parameter (the store validates the characters).
REF_ID_PATH = Path(description="reference id", max_length=256)


def _unauthorized(message: str) -> ApiError:
    return ApiError(401, "unauthorized", message, headers={"WWW-Authenticate": "Bearer"})


def _presented(bearer: HTTPAuthorizationCredentials | None, api_key: str | None) -> str | None:
    if bearer is not None and bearer.credentials:
        return bearer.credentials
    return api_key or None


async def require_tenant(
    request: Request,
    bearer: HTTPAuthorizationCredentials | None = Depends(_bearer),
    api_key: str | None = Depends(_api_key),
) -> str:
    """The caller's namespace; 401 for a missing or wrong key (the key itself is never echoed)."""
    tenants: Tenants = request.app.state.tenants
    presented = _presented(bearer, api_key)
    namespace = tenants.resolve(presented)
    if namespace is None:
        raise _unauthorized("missing API key" if not presented else "invalid API key")
    if namespace == OPERATOR:
        raise ApiError(403, "forbidden", "an operator key may read /metrics only")
    return namespace


async def require_operator(
    request: Request,
    bearer: HTTPAuthorizationCredentials | None = Depends(_bearer),
    api_key: str | None = Depends(_api_key),
) -> None:
    """Guard of ``/metrics``: open without tenants; with tenants only an operator key (its counters span tenants)."""
    tenants: Tenants = request.app.state.tenants
    if not tenants.enabled:
        return
    presented = _presented(bearer, api_key)
    namespace = tenants.resolve(presented)
    if namespace is None:
        raise _unauthorized("missing API key" if not presented else "invalid API key")
    if namespace != OPERATOR:
        raise ApiError(403, "forbidden", f"/metrics needs an operator key (KEY={OPERATOR} in the keys file)")
