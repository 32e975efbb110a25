"""The judging routes: ``/v1/compare`` (a candidate against references, criterion by criterion) and ``/v1/search``."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from ...retrieval.vectors import validate_where
from ...requests import CompareRequest, SearchRequest
from ..intake.bodies import CompareBody, SearchBody, body_schema, decode_image_field, read_body
from ..edge.disconnect import run_watched, stop_between_steps
from ..deps import MetricsDep, PoolDep, ProgressDep, ServiceDep, Namespace
from ..edge.http_errors import ERROR_RESPONSES, ApiError, fields_named, inputs_as_fields
from ..replies.progress import PROGRESS_HEADER, check_token

__all__ = ["router"]

router = APIRouter()


@router.post(
    "/v1/compare", tags=["judge"], responses={k: ERROR_RESPONSES[k] for k in (400, 404)},
    openapi_extra=body_schema(CompareBody, files={"candidate"}),
)
async def compare(
    request: Request, namespace: Namespace, service: ServiceDep, pool: PoolDep, metrics: MetricsDep, progress: ProgressDep,
) -> dict[str, Any]:
    """Judge a candidate against references criterion by criterion; the JSON of ``refsight compare --json``.

    With an ``X-Refsight-Progress: TOKEN`` header, ``GET /v1/compare/progress/TOKEN`` says the stage it is in.
    """
    token = request.headers.get(PROGRESS_HEADER)
    if token is not None:
        check_token(token, "X-Refsight-Progress")
    body, blobs = await read_body(request, CompareBody, files={"candidate"})
    data = blobs.get("candidate") or decode_image_field(body.candidate, "candidate")

    def work(stop_event=None) -> dict[str, Any]:
        candidate = service.decode(data, "candidate")
        with inputs_as_fields(rubric="criteria"), progress.tracking(namespace, token) as on_stage:
            # The body becomes ONE CompareRequest, checked there (the rules between fields are the
            # library's: 400 naming the field).
            compare = CompareRequest(
                candidate, criteria=body.criteria, ref_ids=tuple(body.ref_ids), top_k=body.top_k, query=body.query,
                use_cache=body.use_cache, prefix_states=body.prefix_states, force_vlm=body.force_vlm, recall=body.recall,
                rerank=body.rerank, recall_k=body.recall_k, reranker=body.reranker, namespace=namespace,
            )
            # Between stages a departed client's compare stops (its worker is free for the next one).
            return service.compare(compare, on_stage=stop_between_steps(stop_event, on_stage))

    result = await run_watched(pool, request, work)
    metrics.stages(result.get("stages", {}), result.get("timings_ms", {}))
    return result


@router.get("/v1/compare/progress/{token}", tags=["judge"], responses={k: ERROR_RESPONSES[k] for k in (400, 404)})
async def compare_progress(token: str, namespace: Namespace, progress: ProgressDep) -> dict[str, Any]:
    """The stage of the caller's running compare sent with ``X-Refsight-Progress: TOKEN`` (404 when none runs)."""
    found = progress.get(namespace, check_token(token))
    if found is None:
        raise ApiError(404, "not_found", "no compare runs under this progress token (it ended, or never started)")
    return found


@router.post("/v1/search", tags=["retrieval"], responses={400: ERROR_RESPONSES[400]})
async def search(body: SearchBody, namespace: Namespace, service: ServiceDep, pool: PoolDep) -> dict[str, Any]:
    """Recall references by text or by image; the JSON of ``refsight search --json``."""
    # "exactly one of text or image" and "the text is not empty" are the library's rules (400 naming the field).
    validate_where(body.where)  # at most MAX_WHERE_KEYS keys: 400 here, before any model work
    data = decode_image_field(body.image, "image") if body.image is not None else None

    def work() -> dict[str, Any]:
        image = service.decode(data, "image") if data is not None else None
        with fields_named(text=body.text):
            return service.search(SearchRequest(text=body.text, image=image, k=body.k, where=body.where, namespace=namespace))

    return await pool.run(work)
