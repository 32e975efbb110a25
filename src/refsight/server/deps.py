"""What a route is handed: the service, the work pool, the metrics, the server settings and the caller's namespace.

:func:`refsight.server.create_app` builds these once and keeps them on ``app.state``;
routes never close over them, they declare them as parameters (``service: ServiceDep``),
so every router (:mod:`.routes`, :mod:`.openai_compat`) is a plain module-level
``APIRouter`` that any app can include. :data:`Tenant` is the caller's namespace,
resolved by :func:`~refsight.server.auth.require_tenant` (its presence is also what makes
:class:`~refsight.server.gate.AuthGateMiddleware` demand a key before the body is read).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from .auth import require_tenant
from .config import ServerConfig
from .limits import WorkPool
from .media_uuids import MediaUuids
from .metrics import Metrics
from .service import Service
from .tenants import Tenants

__all__ = ["ServiceDep", "PoolDep", "MetricsDep", "ConfigDep", "TenantsDep", "MediaUuidsDep", "Tenant"]


def _service(request: Request) -> Service:
    return request.app.state.service


def _pool(request: Request) -> WorkPool:
    return request.app.state.pool


def _metrics(request: Request) -> Metrics:
    return request.app.state.metrics


def _config(request: Request) -> ServerConfig:
    return request.app.state.config


def _tenants(request: Request) -> Tenants:
    return request.app.state.tenants


def _media_uuids(request: Request) -> MediaUuids:
    return request.app.state.media_uuids


#: The one :class:`~refsight.server.service.Service` (engine) of the app.
ServiceDep = Annotated[Service, Depends(_service)]
#: The bounded :class:`~refsight.server.limits.WorkPool` model work runs in.
PoolDep = Annotated[WorkPool, Depends(_pool)]
#: The app's Prometheus :class:`~refsight.server.metrics.Metrics`.
MetricsDep = Annotated[Metrics, Depends(_metrics)]
#: The :class:`~refsight.server.config.ServerConfig` the app was built with.
ConfigDep = Annotated[ServerConfig, Depends(_config)]
#: The API keys → namespaces of the app.
TenantsDep = Annotated[Tenants, Depends(_tenants)]
#: The images clients sent under vLLM ``uuid`` s, per tenant (:mod:`~refsight.server.media_uuids`).
MediaUuidsDep = Annotated[MediaUuids, Depends(_media_uuids)]
#: The caller's namespace (401 without a valid key when keys are configured).
Tenant = Annotated[str, Depends(require_tenant)]
