"""The FastAPI app: thin routes over :class:`~refsight.server.service.Service`.

Every route resolves the caller's namespace first
(:func:`~refsight.server.auth.require_tenant`), reads and checks its body on the event
loop (cheap), then runs the blocking work in the
:class:`~refsight.server.limits.WorkPool`; catalog reads and thumbnails use the shared
thread pool instead, so they never queue behind the model. Errors of any kind become
JSON bodies with a stable code (:mod:`refsight.server.errors`).
"""

from __future__ import annotations

import logging
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI, Query, Request
from fastapi.responses import JSONResponse, Response

from .. import __version__
from .. import validate_ref_id, validate_where
from .access_log import install as install_access_log_redaction
from .auth import REF_ID_PATH as _REF_ID
from .auth import require_operator, require_tenant
from .bodies import AddReferenceBody, CompareBody, SearchBody, body_schema, decode_image_field, read_body
from .config import ServerConfig
from .errors import ERROR_RESPONSES, ApiError, CatchAllMiddleware, OpenAIErrorShapeMiddleware, install_error_handlers
from .gate import AuthGateMiddleware
from .limits import BodyLimitMiddleware, WorkPool
from .metrics import CONTENT_TYPE_LATEST, Metrics
from .service import Service
from .tenants import Tenants

__all__ = ["create_app"]

log = logging.getLogger("refsight.server")


def create_app(config: ServerConfig | None = None) -> FastAPI:
    """Build the app for ``config``: opens the store and loads the model at startup.

    Raises :class:`refsight.InvalidInputError` at once for settings that cannot work,
    e.g. a non-loopback host without API keys.
    """
    config = config or ServerConfig()
    keys = config.resolved_keys()
    config.validate(keys)
    tenants = Tenants(keys)
    # Tenants are isolated (keys salted by namespace) unless the operator chose to share encodes.
    service = Service(config, share_packages=config.share_encodes or not tenants.enabled)
    pool = WorkPool(config.workers, config.queue)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        import anyio.to_thread

        await anyio.to_thread.run_sync(service.open)
        if tenants.enabled:
            log.info("refsight: %d API key(s), %d tenant namespace(s)", len(keys), len(tenants.namespaces))
        else:
            log.warning("refsight: no API keys configured: serving without authentication, on loopback only")
        try:
            yield
        finally:
            service.close()

    app = FastAPI(
        title="refsight",
        version=__version__,
        description="Compare new images against fixed references with a VLM, encoding each reference once.",
        lifespan=lifespan,
        responses={k: v for k, v in ERROR_RESPONSES.items() if k in (401, 413, 422, 429, 500, 503)},
    )
    app.state.config = config
    app.state.tenants = tenants
    app.state.service = service
    app.state.pool = pool
    metrics = Metrics(lambda: _cache_stats(service))
    app.state.metrics = metrics
    install_error_handlers(app)
    # Innermost first: crashes become JSON 500s that the timing middleware then counts.
    app.add_middleware(CatchAllMiddleware)
    app.middleware("http")(metrics.middleware())
    # A body over the limit (or JSON nested too deep) is refused before routing, parsing or timing.
    app.add_middleware(BodyLimitMiddleware, max_bytes=config.max_body_bytes)
    # Outermost: a request without a valid key is refused before its body is read at all.
    app.add_middleware(AuthGateMiddleware, tenants=tenants, routes=lambda: app.routes)
    # Around everything: errors on the OpenAI routes, whoever answers them, carry OpenAI's type/param.
    app.add_middleware(OpenAIErrorShapeMiddleware)
    install_access_log_redaction()

    _add_routes(app, service, pool, tenants, metrics)
    from .openai_compat import router as openai_router
    from .page import router as page_router

    app.include_router(openai_router)
    app.include_router(page_router)
    return app


def _cache_stats(service: Service) -> dict[str, Any]:
    return service.global_stats() if service.engine is not None else {}


def _add_routes(app: FastAPI, service: Service, pool: WorkPool, tenants: Tenants, metrics: Metrics) -> None:
    refs_errors = {k: ERROR_RESPONSES[k] for k in (400, 404)}

    @app.get("/healthz", tags=["service"])
    async def healthz() -> dict[str, Any]:
        """Liveness: the model name and whether its weights are random. Needs no key."""
        return {"status": "ok", "model": service.model, "random_weights": service.random_weights, "version": __version__}

    @app.get("/metrics", tags=["service"], response_class=Response)
    async def prometheus(_: None = Depends(require_operator)) -> Response:
        """Prometheus text format: cache hits/misses/evictions/bytes/encode time saved, request latencies."""
        import anyio.to_thread

        body = await anyio.to_thread.run_sync(metrics.render)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    @app.post(
        "/v1/references", tags=["references"], status_code=201, responses={400: ERROR_RESPONSES[400]},
        openapi_extra=body_schema(AddReferenceBody, files={"image"}),
    )
    async def add_reference(request: Request, namespace: str = Depends(require_tenant)) -> JSONResponse:
        """Add a reference image (JSON with base64, or multipart); the same fields as ``refsight add --json``."""
        body, blobs = await read_body(request, AddReferenceBody, files={"image"})
        if body.id is not None:
            validate_ref_id(body.id)  # the same 400 invalid_reference_id as a bad id in a URL
        data = blobs.get("image") or decode_image_field(body.image, "image")

        def work() -> dict[str, Any]:
            image = service.decode(data, "image")
            return service.add(namespace, image, body.id, body.metadata or {})

        return JSONResponse(await pool.run(work), status_code=201)

    @app.get("/v1/references", tags=["references"])
    async def list_references(namespace: str = Depends(require_tenant)) -> dict[str, Any]:
        """The caller's references with metadata and cache state (``cached``: a package for the served model exists)."""
        return {"references": await pool.run_light(service.references, namespace)}

    @app.get("/v1/references/{ref_id}", tags=["references"], responses=refs_errors)
    async def get_reference(ref_id: str = _REF_ID, namespace: str = Depends(require_tenant)) -> dict[str, Any]:
        """One reference (404 ``reference_not_found`` when the caller has none by that id)."""
        return await pool.run_light(service.reference, namespace, ref_id)

    @app.get(
        "/v1/references/{ref_id}/thumbnail", tags=["references"], response_class=Response,
        responses={200: {"content": {"image/jpeg": {}}}, **refs_errors},
    )
    async def thumbnail(
        ref_id: str = _REF_ID, size: int = Query(256, ge=16, le=1024), namespace: str = Depends(require_tenant)
    ) -> Response:
        """A JPEG thumbnail of the reference image (longest side ``size``)."""
        data = await pool.run_light(service.thumbnail, namespace, ref_id, size)
        return Response(data, media_type="image/jpeg", headers={"Cache-Control": "private, max-age=60"})

    @app.delete("/v1/references/{ref_id}", tags=["references"], responses=refs_errors)
    async def delete_reference(ref_id: str = _REF_ID, namespace: str = Depends(require_tenant)) -> dict[str, Any]:
        """Remove a reference; packages still used by other references stay."""
        return await pool.run_light(service.remove, namespace, ref_id)

    @app.post(
        "/v1/compare", tags=["judge"], responses=refs_errors,
        openapi_extra=body_schema(CompareBody, files={"candidate"}),
    )
    async def compare(request: Request, namespace: str = Depends(require_tenant)) -> dict[str, Any]:
        """Judge a candidate against references criterion by criterion; the JSON of ``refsight compare --json``."""
        body, blobs = await read_body(request, CompareBody, files={"candidate"})
        if not body.ref_ids and body.top_k is None:
            raise ApiError(400, "invalid_input", "ref_ids/top_k: name references with ref_ids, or recall them with top_k")
        if body.rerank is not None and body.top_k is None:
            raise ApiError(400, "invalid_input", "rerank: recalls N and judges the top_k best; give top_k too")
        if body.query is not None and body.top_k is None:
            # query only steers recall; without top_k it would be silently ignored.
            raise ApiError(400, "invalid_input", "query: recalls references by text, so it needs top_k")
        for ref_id in body.ref_ids:
            validate_ref_id(ref_id)
        data = blobs.get("candidate") or decode_image_field(body.candidate, "candidate")

        def work() -> dict[str, Any]:
            candidate = service.decode(data, "candidate")
            return service.compare(
                namespace, candidate, criteria=body.criteria, ref_ids=tuple(body.ref_ids), top_k=body.top_k,
                query=body.query, use_cache=body.use_cache, use_kv_cache=body.use_kv_cache, force_vlm=body.force_vlm,
                recall=body.recall, rerank=body.rerank, reranker=body.reranker,
            )

        result = await pool.run(work)
        metrics.stages(result.get("stages", {}), result.get("timings_ms", {}))
        return result

    @app.post("/v1/search", tags=["retrieval"], responses={400: ERROR_RESPONSES[400]})
    async def search(body: SearchBody, namespace: str = Depends(require_tenant)) -> dict[str, Any]:
        """Recall references by text or by image; the JSON of ``refsight search --json``."""
        if (body.text is None) == (body.image is None):
            raise ApiError(400, "invalid_input", "text/image: give exactly one of text or image")
        if body.text is not None and not body.text.strip():
            raise ApiError(400, "invalid_input", "text: the query text is empty")
        validate_where(body.where)  # at most MAX_WHERE_KEYS keys: 400 here, before any model work
        data = decode_image_field(body.image, "image") if body.image is not None else None

        def work() -> dict[str, Any]:
            image = service.decode(data, "image") if data is not None else None
            return service.search(namespace, text=body.text, image=image, k=body.k, where=body.where)

        return await pool.run(work)

    @app.get("/v1/stats", tags=["service"])
    async def stats(namespace: str = Depends(require_tenant)) -> dict[str, Any]:
        """Cache statistics; with tenants, only the caller's references and packages (counters are operator-level)."""
        return await pool.run_light(lambda: service.stats(namespace, tenants=tenants.enabled))
