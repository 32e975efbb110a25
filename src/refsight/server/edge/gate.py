"""Authentication before the body is read: unauthenticated uploads cost the server nothing.

:class:`BodyLimitMiddleware` buffers a body (up to the limit) before routing, so
without this gate 24 unauthenticated 32 MiB uploads would each be held in memory
just to be answered 401. :class:`AuthGateMiddleware` sits outside it and applies
the same rules as the route dependencies (:func:`refsight.server.edge.auth.authenticate`)
to the headers alone: a request that would be refused is refused before one byte
of its body is read.

Which rules apply is read from the routes themselves: a route whose dependencies
include :func:`~refsight.server.edge.auth.require_tenant` needs a tenant key, one with
:func:`~refsight.server.edge.auth.require_operator` an operator key, and any other route
(``/healthz``, the page, the OpenAPI schema) is public. A path no route serves needs
a key too when keys are configured, so a new route is never open by accident and an
unknown path cannot be used to make the server buffer a body.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from starlette.routing import Match

from .auth import authenticate, credential_headers, require_operator, require_tenant
from .http_errors import ApiError, error_response
from .tenants import Tenants

__all__ = ["AuthGateMiddleware", "dependency_calls", "flat_routes", "route_guard"]

TENANT, OPERATOR, PUBLIC = "tenant", "operator", "public"


def flat_routes(routes: Iterable[Any]) -> Iterator[tuple[Any, Any]]:
    """``(matcher, route)`` for every route, routers included with ``include_router`` expanded.

    Recent FastAPI keeps an included router as one lazy entry of ``app.routes`` whose
    ``effective_route_contexts()`` yields the real routes (each able to ``matches`` a
    scope, with the original route and its dependencies behind it); older versions copy
    the routes themselves into ``app.routes``. Both shapes come out the same here.
    """
    for route in routes:
        expand = getattr(route, "effective_route_contexts", None)
        if callable(expand):
            for context in expand():
                yield context, getattr(context, "original_route", context)
        else:
            yield route, route


def dependency_calls(route: Any) -> Iterator[Any]:
    """The calls of ``route``'s dependency tree, the route's own first, then what each dependency depends on."""
    stack = [getattr(route, "dependant", None)]
    while stack:
        dependant = stack.pop()
        if dependant is not None:
            yield dependant.call
            stack.extend(dependant.dependencies)


def route_guard(route: Any) -> str:
    """``"tenant"``, ``"operator"`` or ``"public"``: what a key must be to call ``route``."""
    for call in dependency_calls(route):
        if call is require_tenant:
            return TENANT
        if call is require_operator:
            return OPERATOR
    return PUBLIC


class AuthGateMiddleware:
    """ASGI middleware: 401/403 from the headers alone, before anything reads the body."""

    def __init__(self, app: Any, tenants: Tenants, routes: Callable[[], Iterable[Any]]) -> None:
        self.app = app
        self.tenants = tenants
        self._routes_of = routes
        self._guards: list[tuple[Any, str]] | None = None

    def _guard(self, scope: dict) -> str:
        if self._guards is None:  # routes are all added by the first request
            self._guards = [(matcher, route_guard(route)) for matcher, route in flat_routes(self._routes_of())]
        partial = None
        for route, guard in self._guards:
            match, _ = route.matches(scope)
            if match is Match.FULL:
                return guard
            if match is Match.PARTIAL and partial is None:
                partial = guard  # right path, wrong method: that route's rules still apply
        return partial or TENANT

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not self.tenants.enabled:
            await self.app(scope, receive, send)
            return
        guard = self._guard(scope)
        if guard != PUBLIC:
            try:
                pairs = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"]]
                headers = credential_headers(pairs, scope["method"], scope["path"])
                authenticate(headers, self.tenants, operator=guard == OPERATOR)
            except ApiError as refused:
                # The body is never read: the server discards whatever the client still sends.
                response = error_response(refused.status, refused.code, refused.message, refused.headers)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
