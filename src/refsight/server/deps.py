"""What a route is handed: the service, the work pool, the metrics, the server settings and the caller's namespace.

:func:`refsight.server.create_app` builds these once and keeps them on ``app.state``;
routes never close over them, they declare them as parameters (``service: ServiceDep``),
so every router (:mod:`.routes`) is a plain module-level
``APIRouter`` that any app can include. :data:`Namespace` is the caller's namespace,
resolved by :func:`~refsight.server.edge.auth.require_tenant` (its presence is also what makes
:class:`~refsight.server.edge.gate.AuthGateMiddleware` demand a key before the body is read).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import Depends, Request

from .edge.auth import require_tenant
from .config import ServerConfig
from .edge.limits import WorkPool
from .intake.media_uuids import MediaUuids
from .edge.metrics import Metrics
from .replies.progress import CompareProgress
from .service import Service
from .edge.tenants import Tenants

__all__ = ["ServiceDep", "PoolDep", "MetricsDep", "ConfigDep", "TenantsDep", "MediaUuidsDep", "ProgressDep", "Namespace"]


def _app_state(name: str) -> Callable[[Request], Any]:
    """The dependency that hands a route ``app.state.<name>`` (what :func:`create_app` built once)."""

    # async: FastAPI runs a plain ``def`` dependency in its thread pool, a thread hop (and a wait
    # for the GIL) per dependency per request, for one attribute read.
    async def from_state(request: Request) -> Any:
        return getattr(request.app.state, name)

    from_state.__name__ = f"app_state_{name}"  # one name per dependency in the OpenAPI schema and tracebacks
    from_state.app_state = name  # what edge/sleep.py reads: a route that takes the service may need the model
    return from_state


#: The one :class:`~refsight.server.service.Service` (engine) of the app.
ServiceDep = Annotated[Service, Depends(_app_state("service"))]
#: The bounded :class:`~refsight.server.edge.limits.WorkPool` model work runs in.
PoolDep = Annotated[WorkPool, Depends(_app_state("pool"))]
#: The app's Prometheus :class:`~refsight.server.edge.metrics.Metrics`.
MetricsDep = Annotated[Metrics, Depends(_app_state("metrics"))]
#: The :class:`~refsight.server.config.ServerConfig` the app was built with.
ConfigDep = Annotated[ServerConfig, Depends(_app_state("config"))]
#: The API keys → namespaces of the app.
TenantsDep = Annotated[Tenants, Depends(_app_state("tenants"))]
#: The images clients sent under vLLM ``uuid`` s, per tenant (:mod:`~refsight.server.intake.media_uuids`).
MediaUuidsDep = Annotated[MediaUuids, Depends(_app_state("media_uuids"))]
#: The stage of each running compare that asked for progress (:mod:`~refsight.server.replies.progress`).
ProgressDep = Annotated[CompareProgress, Depends(_app_state("progress"))]
#: The caller's namespace (401 without a valid key when keys are configured).
Namespace = Annotated[str, Depends(require_tenant)]

