"""Request bodies: the JSON models (which also make the OpenAPI schema) and the multipart readers.

``POST /v1/references`` and ``POST /v1/compare`` take either JSON (images as base64
or ``data:`` URLs) or ``multipart/form-data`` (images as file parts); both are read
into the same pydantic model, so validation and its errors are the same either way. Every body's types are
strict (:class:`~.dialect_body.StrictBody`: ``"top_k": "5"`` or ``true`` is no integer); a multipart form's fields
are text, so there a number's text is read as the number.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from typing import Any, Literal

from fastapi import Request
from pydantic import BaseModel, Field, ValidationError

from ...retrieval.vectors import MAX_WHERE_KEYS
from ...inputs.jsonlimits import load_json
from ...inputs.text import check_text, check_texts
from ..edge.http_errors import ApiError
from ..edge.validation import validation_message
from .dialect_body import DialectBody, StrictBody

__all__ = [
    "AddReferenceBody",
    "CompareBody",
    "SearchBody",
    "StreamOptions",
    "body_schema",
    "decode_data_url",
    "decode_image_field",
    "read_body",
]

_DATA_URL = re.compile(r"data:(?P<mime>[\w.+-]+/[\w.+-]+)?(?P<params>(?:;[\w.+-]+=[^;,]*)*)(?P<b64>;base64)?,(?P<data>.*)", re.DOTALL)


class AddReferenceBody(StrictBody):
    """A reference to add: the image, an optional id (default: from the image hash) and metadata."""

    image: str = Field(description="the image as base64 or a data: URL (multipart: a file part)")
    id: str | None = Field(None, description="reference id: letters, digits and . _ - @ + =, at most 128")
    metadata: dict[str, Any] | None = Field(None, description="JSON object stored with the reference")


class CompareBody(StrictBody):
    """A comparison: a candidate image, a rubric, and the references (by id, or the top k recalled)."""

    candidate: str = Field(description="the candidate image as base64 or a data: URL (multipart: a file part)")
    criteria: str | list[Any] | dict[str, Any] = Field(
        description="the rubric: free text (one criterion a line), or JSON/YAML criteria"
    )
    ref_ids: list[str] = Field(default_factory=list, max_length=64, description="references to judge against")
    top_k: int | None = Field(None, ge=1, le=64, description="recall this many references first, then judge them")
    query: str | None = Field(None, max_length=2000, description="recall by this text instead of the rubric")
    recall: Literal["image", "text", "both"] | None = Field(
        None, description="recall query: candidate image, text (query, else the rubric) or both (default; text with query)"
    )
    rerank: int | None = Field(
        None, ge=1, le=1000, description="recall this many, rerank them, then judge the top_k best (needs top_k)"
    )
    recall_k: int | None = Field(
        None, ge=1, le=1000, description="recall this many (default: rerank, else top_k); the best rerank go on (needs top_k)"
    )
    reranker: Literal["vlm", "embedding"] = Field("vlm", description="vlm: P(yes) in one forward pass; embedding: cosine")
    use_cache: bool = Field(True, description="false re-encodes the references (same verdicts, slower)")
    prefix_states: bool = Field(
        True, description="false prefills the references' prompt prefix afresh instead of reusing its stored state",
    )
    force_vlm: bool = Field(False, description="send every criterion to the VLM, none to the attribute records")


class SearchBody(StrictBody):
    """A search: text or an image, how many results, and optional metadata filters."""

    text: str | None = Field(None, max_length=2000)
    image: str | None = Field(None, description="a query image as base64 or a data: URL")
    k: int = Field(10, ge=1, le=1000)
    where: dict[str, str | int | float | bool] | None = Field(
        None,
        description=f"metadata filters, KEY: VALUE (at most {MAX_WHERE_KEYS} keys)",
        json_schema_extra={"maxProperties": MAX_WHERE_KEYS},
    )


def decode_data_url(url: str, field: str) -> bytes:
    """The bytes of a ``data:[mime][;base64],...`` URL; 400 ``invalid_image`` naming ``field`` otherwise."""
    match = _DATA_URL.fullmatch(url)
    if not match or not match.group("b64"):
        raise ApiError(400, "invalid_image", f"{field}: expected a base64 data URL (data:image/png;base64,...)")
    return _b64(match.group("data"), field)


def decode_image_field(value: str, field: str) -> bytes:
    """Bytes from base64 text or a data URL."""
    if value.startswith("data:"):
        return decode_data_url(value, field)
    return _b64(value, field)


def _b64(text: str, field: str) -> bytes:
    try:
        data = base64.b64decode("".join(text.split()), validate=True)
    except (binascii.Error, ValueError):
        raise ApiError(400, "invalid_image", f"{field}: not valid base64") from None
    if not data:
        raise ApiError(400, "invalid_image", f"{field}: the image is empty (0 bytes)")
    return data


def _validation_error(exc: ValidationError) -> ApiError:
    return ApiError(422, "validation_error", validation_message(exc.errors()))


class _DuplicateKey(ValueError):
    pass


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    data: dict[str, Any] = {}
    for key, value in pairs:
        if key in data:
            raise _DuplicateKey(f"key {key!r} appears twice in one object")
        data[key] = value
    return data


_LIST_FIELDS = {"ref_ids"}
_JSON_FIELDS = {"metadata", "where"}


async def read_body(request: Request, model: type[BaseModel], *, files: set[str]) -> tuple[BaseModel, dict[str, bytes]]:
    """Read JSON or multipart into ``model``; file parts named in ``files`` come back as bytes.

    In multipart, a file field may also be sent as a plain text field holding base64.
    ``ref_ids`` may repeat or hold comma-separated ids; ``metadata`` is JSON text.
    """
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type == "application/json" or content_type.endswith("+json"):
        # Decoded to UTF-8 and checked by BodyLimitMiddleware, as every JSON body is (server/edge/json_content.py).
        raw = await request.body()
        try:
            # Duplicate keys would otherwise silently keep the last value.
            data = json.loads(raw, object_pairs_hook=_no_duplicate_keys)
        except _DuplicateKey as e:
            raise ApiError(400, "invalid_input", f"request body: {e}") from None
        except (ValueError, UnicodeDecodeError) as e:
            raise ApiError(400, "invalid_input", f"request body: not valid JSON ({e})") from None
        if not isinstance(data, dict):
            raise ApiError(422, "validation_error", "request body: expected a JSON object")
        try:
            return model.model_validate(data), {}
        except ValidationError as e:
            raise _validation_error(e) from None
    if content_type == "multipart/form-data":
        return await _read_multipart(request, model, files)
    raise ApiError(
        415, "unsupported_media_type",
        f"Content-Type {content_type or '(none)'!r}: send application/json or multipart/form-data",
    )


async def _read_multipart(request: Request, model: type[BaseModel], files: set[str]) -> tuple[BaseModel, dict[str, bytes]]:
    try:
        form = await request.form(max_files=8, max_fields=200, max_part_size=1 << 30)  # the body limit already bounds it
    except Exception as e:  # malformed multipart: the parser's message names the problem
        detail = getattr(e, "detail", None) or str(e) or "malformed multipart body"
        raise ApiError(400, "invalid_input", f"multipart body: {detail}") from None
    data: dict[str, Any] = {}
    blobs: dict[str, bytes] = {}
    try:
        for name in set(form.keys()):
            values = form.getlist(name)
            if len(values) > 1 and name not in _LIST_FIELDS:
                # Two image parts (or two ids): which one was meant is a guess, so refuse.
                raise ApiError(400, "invalid_input", f"{name}: given {len(values)} times; send it once")
            data[name] = await _form_value(name, values, files, blobs)
    finally:
        await form.close()
    data = {k: v for k, v in data.items() if v is not None}
    for name, value in data.items():  # (JSON bodies are checked by BodyLimitMiddleware, before any route)
        check_text(name, "multipart field name")
        check_texts(value, name)
    try:  # a form's fields are text: a number's text is the number there
        return model.model_validate(data, strict=False), blobs
    except ValidationError as e:
        raise _validation_error(e) from None


async def _form_value(name: str, values: list[Any], files: set[str], blobs: dict[str, bytes]) -> Any:
    """The value of the form field ``name`` (None: left out): a file part's bytes go to ``blobs`` (its value is
    ``"<file>"``), a list field's comma-separated items, a JSON field parsed, any other the text."""
    from starlette.datastructures import UploadFile

    if name in files:
        value = values[-1]
        if not isinstance(value, UploadFile):
            return value
        blobs[name] = await value.read()
        return "<file>"
    if name in _LIST_FIELDS:
        return _list_items(values)
    if any(isinstance(v, UploadFile) for v in values):
        raise ApiError(422, "validation_error", f"{name}: expected a text field, got a file")
    if name in _JSON_FIELDS:
        return load_json(values[-1], name) if values[-1].strip() else None
    return values[-1] if values[-1] != "" else None


def _list_items(values: list[Any]) -> list[str]:
    """A list field's items: every text part's comma-separated values, blanks left out."""
    return [i.strip() for v in values if isinstance(v, str) for i in v.split(",") if i.strip()]


def body_schema(model: type[BaseModel], *, files: set[str], multipart: bool = True) -> dict[str, Any]:
    """``openapi_extra`` describing a body read by :func:`read_body` (JSON, and multipart if asked)."""
    schema = model.model_json_schema()
    content: dict[str, Any] = {"application/json": {"schema": schema}}
    if multipart:
        properties = {}
        for name, prop in schema.get("properties", {}).items():
            if name in files:
                properties[name] = {"type": "string", "format": "binary"}
            elif name in _LIST_FIELDS:
                properties[name] = {"type": "array", "items": {"type": "string"}}
            elif name in _JSON_FIELDS or "anyOf" in prop:
                properties[name] = {"type": "string"}
            else:
                properties[name] = {k: v for k, v in prop.items() if k in ("type", "description", "minimum", "maximum", "default")}
        content["multipart/form-data"] = {
            "schema": {"type": "object", "required": schema.get("required", []), "properties": properties}
        }
    return {"requestBody": {"required": True, "content": content}}


class StreamOptions(DialectBody):
    """``stream_options``: ``include_usage`` adds a last chunk with the usage."""

    include_usage: bool | None = None
