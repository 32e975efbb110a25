"""The service's own routes: ``/healthz`` (liveness), ``/metrics`` (Prometheus), ``/v1/stats`` (cache statistics)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends
from fastapi.responses import Response

from ... import __version__
from ..edge.auth import require_operator
from ..deps import MetricsDep, PoolDep, ServiceDep, Namespace, TenantsDep
from ..edge.metrics import CONTENT_TYPE_LATEST
from ..edge.sleep import needs_no_model

__all__ = ["router"]

router = APIRouter(tags=["service"])


@router.get("/healthz")
@needs_no_model
async def healthz(service: ServiceDep) -> dict[str, Any]:
    """Liveness: the model name and whether its weights are random. Needs no key."""
    return {"status": "ok", "model": service.model, "random_weights": service.random_weights, "version": __version__}


@router.get("/metrics", response_class=Response, dependencies=[Depends(require_operator)])
async def prometheus(metrics: MetricsDep) -> Response:
    """Prometheus text format: cache hits/misses/evictions/bytes/encode time saved, request latencies (and
    llama-server's ``Process-Start-Time-Unix`` header: when the server started)."""
    import anyio.to_thread

    body = await anyio.to_thread.run_sync(metrics.render)
    response = Response(body, media_type=CONTENT_TYPE_LATEST)
    # Spelled as llama-server spells it (Starlette would lower-case it): clients read it into a plain dict.
    response.raw_headers.append((b"Process-Start-Time-Unix", str(metrics.started).encode()))
    return response


@router.get("/v1/stats")
@needs_no_model
async def stats(namespace: Namespace, service: ServiceDep, pool: PoolDep, tenants: TenantsDep) -> dict[str, Any]:
    """Cache statistics; with tenants, only the caller's references and packages (counters are operator-level)."""
    return await pool.run_light(lambda: service.stats(namespace=namespace, tenants=tenants.enabled))
