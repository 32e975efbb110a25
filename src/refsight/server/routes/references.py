"""The reference routes: add (JSON or multipart), list, get, thumbnail, image, delete; and the remembered images
(images sent inline and kept: list, forget) — all in the caller's namespace."""

from __future__ import annotations

from functools import partial
from typing import Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, Response

from ...inputs.ref_ids import validate_ref_id
from ...requests import AddRequest
from ..edge.auth import REF_ID_PATH as _REF_ID
from ..intake.bodies import AddReferenceBody, body_schema, decode_image_field, read_body
from ..deps import PoolDep, ServiceDep, Namespace
from ..edge.sleep import needs_no_model
from ..edge.http_errors import ERROR_RESPONSES
from ..edge.responses import TextSafeJSONResponse

__all__ = ["router"]

router = APIRouter(tags=["references"])
_ERRORS = {k: ERROR_RESPONSES[k] for k in (400, 404)}


@router.post(
    "/v1/references", status_code=201, responses={400: ERROR_RESPONSES[400]},
    openapi_extra=body_schema(AddReferenceBody, files={"image"}),
)
async def add_reference(request: Request, namespace: Namespace, service: ServiceDep, pool: PoolDep) -> JSONResponse:
    """Add a reference image (JSON with base64, or multipart); the same fields as ``refsight add --json``."""
    body, blobs = await read_body(request, AddReferenceBody, files={"image"})
    if body.id is not None:
        validate_ref_id(body.id)  # the same 400 invalid_reference_id as a bad id in a URL
    data = blobs.get("image") or decode_image_field(body.image, "image")

    def work() -> dict[str, Any]:
        image = service.decode(data, "image")
        # The body becomes ONE AddRequest; the attribute records computed at add are the server's policy.
        return service.add(AddRequest(
            image, ref_id=body.id, metadata=body.metadata, namespace=namespace,
            attributes=service.config.ingest_attributes,
        ))

    return TextSafeJSONResponse(await pool.run(work), status_code=201)


@router.get("/v1/references")
async def list_references(namespace: Namespace, service: ServiceDep, pool: PoolDep) -> dict[str, Any]:
    """The caller's references with metadata and cache state (``cached``: a package for the served model exists)."""
    return {"references": await pool.run_light(partial(service.references, namespace=namespace))}


@router.get("/v1/references/{ref_id}", responses=_ERRORS)
async def get_reference(namespace: Namespace, service: ServiceDep, pool: PoolDep, ref_id: str = _REF_ID) -> dict[str, Any]:
    """One reference (404 ``reference_not_found`` when the caller has none by that id)."""
    return await pool.run_light(partial(service.reference, ref_id, namespace=namespace))


@router.get(
    "/v1/references/{ref_id}/thumbnail", response_class=Response,
    responses={200: {"content": {"image/jpeg": {}}}, **_ERRORS},
)
@needs_no_model
async def thumbnail(
    namespace: Namespace, service: ServiceDep, pool: PoolDep, ref_id: str = _REF_ID,
    size: int = Query(256, ge=16, le=1024),
) -> Response:
    """A JPEG thumbnail of the reference image (longest side ``size``)."""
    data = await pool.run_light(partial(service.thumbnail, ref_id, size, namespace=namespace))
    # Vary: the same URL is another tenant's image under another key (the page's cookie included).
    return Response(data, media_type="image/jpeg", headers={
        "Cache-Control": "private, max-age=60", "Vary": "Authorization, X-API-Key, Cookie"})


@router.get(
    "/v1/references/{ref_id}/image", response_class=Response,
    responses={200: {"content": {"image/png": {}, "image/jpeg": {}}}, **_ERRORS},
)
@needs_no_model
async def reference_image(namespace: Namespace, service: ServiceDep, pool: PoolDep, ref_id: str = _REF_ID) -> Response:
    """The reference image as it was added. Its URL is also how a chat part names the reference
    (for clients that accept only http URLs, as ``refsight://ref/<id>`` does for the others)."""
    data, media_type = await pool.run_light(partial(service.reference_image, ref_id, namespace=namespace))
    return Response(data, media_type=media_type, headers={"Cache-Control": "private, max-age=60"})


@router.delete("/v1/references/{ref_id}", responses=_ERRORS)
async def delete_reference(namespace: Namespace, service: ServiceDep, pool: PoolDep, ref_id: str = _REF_ID) -> dict[str, Any]:
    """Remove a reference; packages still used by other references stay."""
    return await pool.run_light(partial(service.remove, ref_id, namespace=namespace))


@router.get("/v1/remembered")
async def list_remembered(namespace: Namespace, service: ServiceDep, pool: PoolDep) -> dict[str, Any]:
    """The caller's remembered images: images it sent inline that the store keeps (``--remember-images``), each
    ``{namespace, package_key, bytes, model_id, remembered_at, last_used}``, most recently used first."""
    return {"remembered": await pool.run_light(partial(service.remembered, namespace=namespace))}


@router.delete("/v1/remembered")
async def forget_remembered(namespace: Namespace, service: ServiceDep, pool: PoolDep) -> dict[str, Any]:
    """Forget the caller's remembered images: their packages go unless a reference or another tenant holds them."""
    return await pool.run_light(partial(service.forget_remembered, namespace=namespace))
