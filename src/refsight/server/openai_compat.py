"""``POST /v1/chat/completions`` in the shape the OpenAI Python SDK sends and parses.

Messages carry ``text`` and ``image_url`` parts. An image is either a base64
``data:`` URL, or a stored reference named without its bytes, in two spellings:
``{"type": "image_url", "image_url": {"url": "refsight://ref/<id>"}}`` or a
vLLM-style ``"uuid": "<id>"`` on the part (the uuid wins over any url beside it).
References resolve in the caller's namespace only, so another tenant's id is a 404
exactly like an absent one. Remote ``http(s)`` URLs are refused: the server makes
no outbound requests on a client's behalf.

Conversations: ``system``/``developer``, ``user`` and ``assistant`` messages, in any
number, with images in any user turn, are rendered in the model's own chat template.

``stream: true`` answers with server-sent ``chat.completion.chunk`` events as tokens are
generated (:mod:`.streaming`); a client that disconnects stops generation. Sampling:
``temperature`` (default 0: greedy, unlike OpenAI's 1, so answers are reproducible),
``top_p``, ``seed``, ``stop``, ``frequency_penalty``, ``presence_penalty`` where the
served backend honours them; any other field, or one the backend cannot honour, is a 400
naming it, never silently ignored. ``usage`` counts the real prompt (text and image
tokens), with ``prompt_tokens_details.cached_tokens`` = image tokens served from cached
packages.

``response_format`` ``json_schema`` (or ``json_object``) is passed to the engine's
constrained decoding. The answer is a standard ``chat.completion`` plus a
``refsight`` object (``random_weights``, ``references_cached``, ``timings_ms``); text
from a random-weight model is labelled there, since it carries no meaning. Errors use
OpenAI's error shape (:func:`refsight.server.errors.openai_error_body`).
"""

from __future__ import annotations

import threading
import time
import uuid as uuidlib
from typing import Any, AsyncIterator, Literal

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from .. import InvalidInputError, ReferenceSegment, Sampling
from .bodies import decode_data_url
from .deps import ConfigDep, PoolDep, ServiceDep, Tenant
from .errors import ERROR_RESPONSES, ApiError, from_refsight, openai_error_body
from .prompt_limit import check_prompt_chars, check_prompt_tokens, prompt_texts
from .streaming import SSE_DONE, EventStreamResponse, Finished, sse_event, stream_in_pool

__all__ = ["router", "ChatRequest", "messages_to_segments", "REF_URL_PREFIX", "IGNORED_FIELDS"]

#: URL scheme naming a stored reference instead of sending its bytes.
REF_URL_PREFIX = "refsight://ref/"
RANDOM_WEIGHTS_NOTICE = "random weights: this text is meaningless (timings and caching are real)"
#: Request fields accepted and deliberately without effect (an end-user label).
IGNORED_FIELDS = frozenset({"user"})
#: The chat role each OpenAI role is rendered as.
_ROLE = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}

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


class StreamOptions(BaseModel):
    """``stream_options``: ``include_usage`` adds a last chunk with the usage."""

    model_config = ConfigDict(extra="forbid")
    include_usage: bool | None = None


class ChatRequest(BaseModel):
    """The OpenAI chat request fields refsight honours; any other field is refused by name (400)."""

    model_config = ConfigDict(extra="allow")
    model: str
    messages: list[Message] = Field(min_length=1, max_length=256)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    seed: int | None = Field(None, ge=0, lt=2**63)
    stop: str | list[str] | None = None
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    n: int | None = Field(None, ge=1)
    logprobs: bool | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    response_format: ResponseFormat | None = None

    def sampling(self) -> Sampling:
        """The request's :class:`Sampling` (greedy unless it says otherwise)."""
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stop) > 4 or any(not s for s in stop):
            raise ApiError(400, "invalid_input", "stop: give at most 4 non-empty strings", param="stop")
        return Sampling(
            temperature=self.temperature or 0.0,
            top_p=1.0 if self.top_p is None else self.top_p,
            seed=self.seed,
            stop=tuple(stop),
            frequency_penalty=self.frequency_penalty or 0.0,
            presence_penalty=self.presence_penalty or 0.0,
        )


def messages_to_segments(messages: list[Message], decode) -> tuple[list[Any], list[tuple[str, int]]]:
    """Messages as engine segments (text, ReferenceSegment, or decoded images) and their turns.

    ``decode(data, label)`` turns image bytes into an image input (it applies the
    server's pixel limits). Returns the flat segments and ``(role, count)`` per message
    (``developer`` is rendered as ``system``), as :meth:`refsight.Engine.chat` takes them.
    """
    segments: list[Any] = []
    turns: list[tuple[str, int]] = []
    for i, message in enumerate(messages):
        before = len(segments)
        content = message.content
        if isinstance(content, str):
            segments.append(content)
        elif content is not None:
            for j, part in enumerate(content):
                where = f"messages[{i}].content[{j}]"
                if part.type == "text":
                    if part.text is None:
                        raise ApiError(400, "invalid_input", f"{where}.text: a text part needs text", param=f"{where}.text")
                    segments.append(part.text)
                    continue
                if message.role != "user":
                    raise ApiError(400, "unsupported", f"{where}: images are accepted in user messages only", param=where)
                segments.append(_image_segment(part, where, decode))
        turns.append((_ROLE[message.role], len(segments) - before))
    return segments, turns


def _image_segment(part: ContentPart, where: str, decode) -> Any:
    if part.uuid:
        return ReferenceSegment(part.uuid)
    url = part.image_url.url if part.image_url is not None else ""
    if url.startswith(REF_URL_PREFIX):
        ref_id = url[len(REF_URL_PREFIX):]
        if not ref_id:
            raise ApiError(400, "invalid_input", f"{where}.image_url.url: {REF_URL_PREFIX} needs a reference id", param=where)
        return ReferenceSegment(ref_id)
    if url.startswith("data:"):
        return decode(decode_data_url(url, f"{where}.image_url.url"), f"{where}.image_url")
    if url.startswith(("http://", "https://")):
        raise ApiError(
            400, "unsupported",
            f"{where}.image_url.url: remote URLs are not fetched; send a data: URL or {REF_URL_PREFIX}<id>", param=where,
        )
    raise ApiError(
        400, "invalid_input", f"{where}.image_url: give a data: URL, {REF_URL_PREFIX}<id>, or a uuid", param=where
    )


def _json_schema(fmt: ResponseFormat | None) -> dict[str, Any] | None:
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return {"type": "object"}
    if fmt.json_schema is None or fmt.json_schema.schema_ is None:
        raise ApiError(
            400, "invalid_input", "response_format.json_schema.schema: a json_schema format needs a schema",
            param="response_format",
        )
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
            param="response_format",
        ) from None


def _check_request(body: ChatRequest, service: Any, max_limit: int) -> tuple[int, Sampling]:
    """Refuse what cannot be honoured (400 naming the field); the token bound and the sampling."""
    unknown = sorted(set(body.model_extra or {}) - IGNORED_FIELDS)
    if unknown:
        raise ApiError(400, "unsupported", f"{unknown[0]}: this field is not supported by refsight", param=unknown[0])
    if body.model != service.model:
        raise ApiError(
            404, "model_not_found", f"model {body.model!r} is not served here; this server serves {service.model!r}",
            param="model",
        )
    if body.n not in (None, 1):
        raise ApiError(400, "unsupported", "n: only one choice (n=1) is supported", param="n")
    if body.logprobs:
        raise ApiError(400, "unsupported", "logprobs: log probabilities are not returned", param="logprobs")
    if body.stream_options is not None and not body.stream:
        raise ApiError(400, "invalid_input", "stream_options: only allowed with stream=true", param="stream_options")
    if body.max_tokens is not None and body.max_completion_tokens is not None and body.max_tokens != body.max_completion_tokens:
        raise ApiError(400, "invalid_input", "max_tokens: differs from max_completion_tokens; give one", param="max_tokens")
    max_new_tokens = body.max_completion_tokens or body.max_tokens or 128
    if max_new_tokens > max_limit:
        raise ApiError(
            400, "invalid_input", f"max_tokens: {max_new_tokens} is over the limit of {max_limit}",
            param="max_completion_tokens" if body.max_completion_tokens else "max_tokens",
        )
    try:
        sampling = body.sampling()
    except InvalidInputError as e:
        raise ApiError(400, "invalid_input", str(e), param=str(e.input)) from None
    backend = service.engine.backend()
    refused = [name for name in sampling.non_default() if name not in backend.sampling_fields]
    if refused:
        raise ApiError(
            400, "unsupported", f"{refused[0]}: the served backend ({service.model}) does not support it", param=refused[0]
        )
    return max_new_tokens, sampling


def _usage(result: dict[str, Any]) -> dict[str, Any]:
    completion = len(result["tokens"])
    return {
        "prompt_tokens": result["prompt_tokens"],
        "completion_tokens": completion,
        "total_tokens": result["prompt_tokens"] + completion,
        "prompt_tokens_details": {"cached_tokens": result["cached_tokens"]},
    }


def _extra(result: dict[str, Any]) -> dict[str, Any]:
    extra = {
        "random_weights": result["random_weights"],
        "references_cached": result["references_cached"],
        "timings_ms": result["timings_ms"],
    }
    if result["random_weights"]:
        extra["notice"] = RANDOM_WEIGHTS_NOTICE
    return extra


@router.post("/v1/chat/completions", responses={k: ERROR_RESPONSES[k] for k in (400, 404)})
async def chat_completions(
    body: ChatRequest, namespace: Tenant, service: ServiceDep, pool: PoolDep, config: ConfigDep
) -> Any:
    """OpenAI-compatible chat with images; reference packages come from the store, never re-encoded.

    With ``stream: true`` the answer is ``text/event-stream`` of ``chat.completion.chunk``
    events, ``data: [DONE]`` last.
    """
    max_new_tokens, sampling = _check_request(body, service, config.max_new_tokens)
    json_schema = _json_schema(body.response_format)
    # Before any model work: a character bound on the event loop, then the tokenizer's
    # count in the shared thread pool (never in a model worker).
    texts = prompt_texts(body.messages)
    check_prompt_chars(texts, config.max_prompt_tokens)
    backend = service.engine.backend()
    await pool.run_light(check_prompt_tokens, texts, config.max_prompt_tokens, backend.count_text_tokens)
    completion_id = f"chatcmpl-{uuidlib.uuid4().hex}"
    created = int(time.time())

    def work(on_text=None, stop_event=None) -> dict[str, Any]:
        segments, turns = messages_to_segments(body.messages, service.decode)
        return service.chat(
            segments, namespace=namespace, turns=turns, max_new_tokens=max_new_tokens, json_schema=json_schema,
            sampling=sampling, on_text=on_text, stop_event=stop_event,
        )

    if body.stream:
        stop = threading.Event()
        source = stream_in_pool(pool, lambda on_text: work(on_text, stop))
        # The first event is awaited here, before any byte is sent: an error up to the first
        # token (a missing reference, a full pool, a bad image) is a plain HTTP error.
        try:
            first = await source.__anext__()
        except BaseException:
            stop.set()
            raise
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        events = _chunks(first, source, completion_id, created, service.model, include_usage)
        return EventStreamResponse(events, stop)

    result = await pool.run(work)
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": created,
        "model": result["model"],
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": result["text"]},
                "finish_reason": result["finish_reason"],
                "logprobs": None,
            }
        ],
        "usage": _usage(result),
        "refsight": _extra(result),
    }


async def _chunks(
    first: Any, source: AsyncIterator[Any], completion_id: str, created: int, model: str, include_usage: bool
) -> AsyncIterator[bytes]:
    """The SSE events of one streamed answer, in the order the OpenAI SDK expects."""

    def chunk(delta: dict[str, Any], finish_reason: str | None = None, **more: Any) -> bytes:
        data = {
            "id": completion_id, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
            **more,
        }
        if include_usage:
            data.setdefault("usage", None)  # OpenAI: null on every chunk but the last
        return sse_event(data)

    yield chunk({"role": "assistant", "content": ""})
    item = first
    try:
        while not isinstance(item, Finished):
            yield chunk({"content": item})
            item = await source.__anext__()
    except ApiError as e:
        yield sse_event(openai_error_body(e.status, e.code, e.message, e.param))
        return
    except Exception as e:  # noqa: BLE001 -- after the headers an error can only be an event
        from .. import RefsightError

        api = from_refsight(e) if isinstance(e, RefsightError) else ApiError(500, "internal_error", "internal server error")
        yield sse_event(openai_error_body(api.status, api.code, api.message))
        return
    result = item.result
    finish = result["finish_reason"] if result["finish_reason"] in ("stop", "length") else "stop"
    yield chunk({}, finish, refsight=_extra(result))
    if include_usage:
        yield sse_event({
            "id": completion_id, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": [], "usage": _usage(result),
        })
    yield SSE_DONE


@router.get("/v1/models")
async def list_models(namespace: Tenant, service: ServiceDep) -> dict[str, Any]:
    """The served model, in the OpenAI ``/v1/models`` shape."""
    return {
        "object": "list",
        "data": [{"id": service.model, "object": "model", "created": 0, "owned_by": "refsight",
                  "random_weights": service.random_weights}],
    }
