"""The FastAPI app: the parts built once, the middlewares, and the routers (thin routes over
:class:`~refsight.server.service.Service`).

The parts live on ``app.state`` and reach the routes as declared dependencies
(:mod:`refsight.server.deps`); the routes are module-level routers (:mod:`.routes`,
:mod:`.routes.page`). Every route resolves the caller's namespace first
(:func:`~refsight.server.edge.auth.require_tenant`), reads and checks its body on the event
loop (cheap), then runs the blocking work in the
:class:`~refsight.server.edge.limits.WorkPool`; catalog reads and thumbnails use the shared
thread pool instead, so they never queue behind the model. Errors of any kind become
JSON bodies with a stable code (:mod:`refsight.server.edge.http_errors`).
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI

from .. import __version__
from .edge.access_log import install as install_access_log_redaction
from .config import ServerConfig
from .edge.error_shapes import ErrorShapeMiddleware
from .edge.http_errors import ERROR_RESPONSES, CatchAllMiddleware, install_error_handlers
from .edge.gate import AuthGateMiddleware
from .edge.limits import BodyLimitMiddleware, WorkPool
from .intake.media_uuids import MediaUuids
from .replies.progress import CompareProgress
from .edge.methods import HeadAsGetMiddleware
from .edge.json_content import JSON_ROUTES, JsonContentMiddleware
from .edge.origins import OriginGuardMiddleware
from .edge.single_headers import SingleHeadersMiddleware
from .edge.llama_metrics import LlamaCollector
from .edge.metrics import Metrics, TimingMiddleware
from .edge.responses import TextSafeJSONResponse
from .routes.page import router as page_router
from .routes import ROUTERS
from .routes.vertex import vertex_routes
from .service import Service
from .edge.sleep import SleepMiddleware, SleepWatch
from .edge.tenants import Tenants, unserved_references_warning

__all__ = ["create_app"]

log = logging.getLogger("refsight.server")


def _announce_tenants(service: Service, tenants: Tenants, keys: int) -> None:
    """The start-up log lines about tenants: how many, or that there is no authentication, and any
    references no key can reach."""
    if not tenants.enabled:
        log.warning("refsight: no API keys configured: serving without authentication, on loopback only")
        return
    log.info("refsight: %d API key(s), %d tenant namespace(s)", keys, len(tenants.namespaces))
    unserved = unserved_references_warning(service, tenants)
    if unserved:
        log.warning(unserved)


def create_app(config: ServerConfig | None = None) -> FastAPI:
    """Build the app for ``config``: opens the store and loads the model at startup.

    Raises :class:`refsight.InvalidInputError` at once for settings that cannot work,
    e.g. a non-loopback host without API keys.
    """
    config = config or ServerConfig()
    keys = config.resolved_keys()
    config.validate(keys)
    tenants = Tenants(keys)
    # Tenants are isolated (keys salted by namespace) unless the operator chose to share packages.
    service = Service(config, share_packages=config.share_packages or not tenants.enabled, tenants=tenants.namespaces)
    pool = WorkPool(config.workers, config.queue)
    # --sleep-idle-seconds: the model unloads when idle and loads again at the next request (server/edge/sleep.py).
    sleep_watch = SleepWatch(service, pool, config.sleep_idle_seconds) if config.sleep_idle_seconds else None

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        import anyio.to_thread

        await anyio.to_thread.run_sync(service.open)
        await anyio.to_thread.run_sync(lambda: _announce_tenants(service, tenants, len(keys)))
        watcher = asyncio.create_task(sleep_watch.run()) if sleep_watch is not None else None
        try:
            yield
        finally:
            if watcher is not None:
                watcher.cancel()
            service.close()

    app = FastAPI(
        title="refsight",
        version=__version__,
        description="Compare new images against fixed references with a VLM, encoding each reference once.",
        lifespan=lifespan,
        default_response_class=TextSafeJSONResponse,
        responses={k: v for k, v in ERROR_RESPONSES.items() if k in (401, 413, 422, 429, 500, 503)},
    )
    app.state.config = config
    app.state.tenants = tenants
    app.state.service = service
    app.state.pool = pool
    app.state.media_uuids = MediaUuids(config.media_uuid_bytes, config.media_uuid_entries)
    app.state.progress = CompareProgress()
    metrics = Metrics(lambda: _cache_stats(service))
    metrics.registry.register(LlamaCollector(service.generations, pool))  # llama-server's llamacpp:* beside
    app.state.metrics = metrics
    install_error_handlers(app)
    _add_middlewares(app, config, tenants, metrics, sleep_watch)
    install_access_log_redaction()

    # --no-webui (llama-server's flag): the API only, no page at /.
    for router in (*ROUTERS, *((page_router,) if config.webui else ())):
        app.include_router(router)
    if config.vertex_predict_route:  # Vertex AI's protocol: its instances dispatched to the routes above
        vertex_routes(app, config.vertex_predict_route, config.vertex_health_route, config.workers)
    return app


def _add_middlewares(
    app: FastAPI, config: ServerConfig, tenants: Tenants, metrics: Metrics, sleep_watch: SleepWatch | None
) -> None:
    """The middleware stack, innermost first (each added one wraps those before it)."""
    # Innermost: a request that got past every check below, to a route that may need the model, wakes a sleeping
    # model (a failed load is a JSON 500).
    if sleep_watch is not None:
        app.add_middleware(SleepMiddleware, watch=sleep_watch, routes=lambda: app.routes)
    # Crashes become JSON 500s that the timing middleware then counts.
    app.add_middleware(CatchAllMiddleware)
    app.add_middleware(TimingMiddleware, metrics=metrics)
    # A body over the limit is refused, and a JSON body decoded and checked once (server/edge/json_content.py),
    # before routing, parsing or timing; a path no route serves is answered without reading the body.
    app.add_middleware(BodyLimitMiddleware, max_bytes=config.max_body_bytes, routes=lambda: app.routes)
    # Outermost: a request without a valid key is refused before its body is read at all.
    app.add_middleware(AuthGateMiddleware, tenants=tenants, routes=lambda: app.routes)
    # Outside the key check: a keyless server refuses foreign Host/Origin; CORS preflights are answered here.
    app.add_middleware(
        OriginGuardMiddleware, tenants=tenants, host=config.host, allowed_hosts=config.allowed_hosts,
        cors_origins=config.cors_origins,
    )
    # Around everything: errors on the OpenAI and Ollama routes, whoever answers them, take that dialect's shape.
    app.add_middleware(ErrorShapeMiddleware)
    # HEAD is GET without a body, for every middleware and route alike.
    app.add_middleware(HeadAsGetMiddleware)
    # llama-server's and Ollama's routes read JSON whatever the Content-Type says; so do these, and Vertex AI's
    # predict route (so its body is checked at the edge as every JSON body is).
    predict = {config.vertex_predict_route} if config.vertex_predict_route else set()
    app.add_middleware(JsonContentMiddleware, routes=JSON_ROUTES | predict)
    # Outermost: the headers every middleware above decides by (Host, Origin, the body's type and framing), each
    # given once, so no two of them can read different copies.
    app.add_middleware(SingleHeadersMiddleware)


def _cache_stats(service: Service) -> dict[str, Any]:
    return service.global_stats() if service.is_ready else {}
