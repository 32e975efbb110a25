"""``POST /v1/chat/completions`` in the shape the OpenAI Python SDK sends and parses.

Messages carry ``text`` and ``image_url`` parts. An image is either a base64
``data:`` URL, or a stored reference named without its bytes, in two spellings:
``{"type": "image_url", "image_url": {"url": "refsight://ref/<id>"}}`` or a
vLLM-style ``"uuid": "<id>"`` on the part (the uuid wins over any url beside it).
References resolve in the caller's namespace only, so another tenant's id is a 404
exactly like an absent one. Remote ``http(s)`` URLs are refused: the server makes
no outbound requests on a client's behalf.

``response_format`` ``json_schema`` (or ``json_object``) is passed to the engine's
constrained decoding. The answer is a standard ``chat.completion`` plus a
``refsight`` object (``random_weights``, ``references_cached``, ``timings_ms``); text
from a random-weight model is labelled there, since it carries no meaning.
"""

from __future__ import annotations

import time
import uuid as uuidlib
from typing import Any, Literal

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, Field

from .. import ReferenceSegment
from .auth import require_tenant
from .bodies import decode_data_url
from .errors import ERROR_RESPONSES, ApiError
from .prompt_limit import check_prompt_chars, check_prompt_tokens, prompt_texts

__all__ = ["router", "ChatRequest", "messages_to_segments", "REF_URL_PREFIX"]

#: URL scheme naming a stored reference instead of sending its bytes.
REF_URL_PREFIX = "refsight://ref/"
RANDOM_WEIGHTS_NOTICE = "random weights: this text is meaningless (timings and caching are real)"

router = APIRouter(tags=["openai"])


class ImageURL(BaseModel):
    """The ``image_url`` object of a part: a data URL or ``refsight://ref/<id>``."""

    model_config = ConfigDict(extra="allow")
    url: str = ""
    detail: str | None = None


class ContentPart(BaseModel):
    """One part of a message: text, or an image (``image_url`` and/or a reference ``uuid``)."""

    model_config = ConfigDict(extra="allow")
    type: Literal["text", "image_url"]
    text: str | None = None
    image_url: ImageURL | None = None
    uuid: str | None = Field(None, description="a stored reference id (vLLM-style media uuid)")


class Message(BaseModel):
    """A chat message."""

    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[ContentPart] | None = None


class JSONSchemaFormat(BaseModel):
    """The ``json_schema`` member of ``response_format``."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)
    name: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    """``{"type": "text" | "json_object" | "json_schema", "json_schema": {...}}``."""

    model_config = ConfigDict(extra="allow")
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaFormat | None = None


class ChatRequest(BaseModel):
    """The subset of the OpenAI chat request refsight honours; other fields are accepted and ignored."""

    model_config = ConfigDict(extra="allow")
    model: str
    messages: list[Message] = Field(min_length=1, max_length=256)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float | None = None
    n: int | None = None
    stream: bool | None = None
    response_format: ResponseFormat | None = None


def messages_to_segments(messages: list[Message], decode) -> list[Any]:
    """Flatten messages into engine segments: text, ReferenceSegment, or decoded images.

    ``decode(data, label)`` turns image bytes into an image input (it applies the
    server's pixel limits). A single user message is passed as is; with several
    messages each is introduced by its role so the turns stay apart.
    """
    segments: list[Any] = []
    labelled = len(messages) > 1 or messages[0].role != "user"
    for i, message in enumerate(messages):
        if labelled:
            segments.append(f"{message.role}:")
        content = message.content
        if content is None:
            continue
        if isinstance(content, str):
            segments.append(content)
            continue
        for j, part in enumerate(content):
            where = f"messages[{i}].content[{j}]"
            if part.type == "text":
                if part.text is None:
                    raise ApiError(400, "invalid_input", f"{where}.text: a text part needs text")
                segments.append(part.text)
                continue
            segments.append(_image_segment(part, where, decode))
    return segments


def _image_segment(part: ContentPart, where: str, decode) -> Any:
    if part.uuid:
        return ReferenceSegment(part.uuid)
    url = part.image_url.url if part.image_url is not None else ""
    if url.startswith(REF_URL_PREFIX):
        ref_id = url[len(REF_URL_PREFIX):]
        if not ref_id:
            raise ApiError(400, "invalid_input", f"{where}.image_url.url: {REF_URL_PREFIX} needs a reference id")
        return ReferenceSegment(ref_id)
    if url.startswith("data:"):
        return decode(decode_data_url(url, f"{where}.image_url.url"), f"{where}.image_url")
    if url.startswith(("http://", "https://")):
        raise ApiError(
            400, "unsupported",
            f"{where}.image_url.url: remote URLs are not fetched; send a data: URL or {REF_URL_PREFIX}<id>",
        )
    raise ApiError(400, "invalid_input", f"{where}.image_url: give a data: URL, {REF_URL_PREFIX}<id>, or a uuid")


def _json_schema(fmt: ResponseFormat | None) -> dict[str, Any] | None:
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return {"type": "object"}
    if fmt.json_schema is None or fmt.json_schema.schema_ is None:
        raise ApiError(400, "invalid_input", "response_format.json_schema.schema: a json_schema format needs a schema")
    schema = fmt.json_schema.schema_
    _check_schema(schema)
    return schema


def _check_schema(schema: dict[str, Any]) -> None:
    """400 naming the problem when ``schema`` is not a valid JSON Schema (checked against its meta-schema)."""
    from jsonschema import SchemaError
    from jsonschema.validators import validator_for

    try:
        validator_for(schema).check_schema(schema)
    except SchemaError as e:
        where = "/".join(str(p) for p in e.absolute_path) or "(root)"
        raise ApiError(
            400, "invalid_input",
            f"response_format.json_schema.schema: not a valid JSON Schema at {where}: {e.message[:300]}",
        ) from None


@router.post("/v1/chat/completions", responses={k: ERROR_RESPONSES[k] for k in (400, 404)})
async def chat_completions(body: ChatRequest, request: Request, namespace: str = Depends(require_tenant)) -> dict[str, Any]:
    """OpenAI-compatible chat with images; reference packages come from the store, never re-encoded."""
    service = request.app.state.service
    config = request.app.state.config
    if body.model != service.model:
        raise ApiError(404, "model_not_found", f"model {body.model!r} is not served here; this server serves {service.model!r}")
    if body.stream:
        raise ApiError(400, "unsupported", "stream: streaming is not supported; send stream=false")
    if body.n not in (None, 1):
        raise ApiError(400, "unsupported", "n: only one choice (n=1) is supported")
    max_new_tokens = body.max_completion_tokens or body.max_tokens or 128
    if max_new_tokens > config.max_new_tokens:
        raise ApiError(400, "invalid_input", f"max_tokens: {max_new_tokens} is over the limit of {config.max_new_tokens}")
    json_schema = _json_schema(body.response_format)
    # Before any model work: a character bound on the event loop, then the tokenizer's
    # count in the shared thread pool (never in a model worker).
    texts = prompt_texts(body.messages)
    check_prompt_chars(texts, config.max_prompt_tokens)
    backend = service.engine.backend()
    await request.app.state.pool.run_light(check_prompt_tokens, texts, config.max_prompt_tokens, backend.count_text_tokens)

    def work() -> dict[str, Any]:
        segments = messages_to_segments(body.messages, service.decode)
        return service.chat(namespace, segments, max_new_tokens=max_new_tokens, json_schema=json_schema)

    result = await request.app.state.pool.run(work)
    completion = len(result["tokens"])
    extra = {
        "random_weights": result["random_weights"],
        "references_cached": result["references_cached"],
        "timings_ms": result["timings_ms"],
    }
    if result["random_weights"]:
        extra["notice"] = RANDOM_WEIGHTS_NOTICE
    return {
        "id": f"chatcmpl-{uuidlib.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": result["model"],
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": result["text"]},
                "finish_reason": "length" if completion >= max_new_tokens else "stop",
                "logprobs": None,
            }
        ],
        # refsight does not count prompt tokens (image tokens depend on the backend's template).
        "usage": {"prompt_tokens": 0, "completion_tokens": completion, "total_tokens": completion},
        "refsight": extra,
    }


@router.get("/v1/models")
async def list_models(request: Request, namespace: str = Depends(require_tenant)) -> dict[str, Any]:
    """The served model, in the OpenAI ``/v1/models`` shape."""
    service = request.app.state.service
    return {
        "object": "list",
        "data": [{"id": service.model, "object": "model", "created": 0, "owned_by": "refsight",
                  "random_weights": service.random_weights}],
    }
