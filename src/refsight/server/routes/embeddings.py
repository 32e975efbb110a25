"""Embeddings in the shapes their clients read: ``POST /v1/embeddings`` (OpenAI's, vLLM's and llama-server's OpenAI
route) and llama-server's own ``/embeddings`` and ``/embedding``.

The inputs (:mod:`..intake.embed_inputs`): ``input`` (a string, a list of them, token ids, llama-server's and vLLM's
``{"content": [parts]}`` objects, llama-server's prompt objects with ``multimodal_data``), llama-server's ``content``
(the same forms, answered in llama-server's shape even on ``/v1/embeddings``, as llama-server does), or vLLM's chat
form, ``messages`` (one vector of every message's texts and images). Images are data URLs, stored references
(``refsight://ref/<id>``), this server's reference URLs or allowed remote URLs, resolved in the work pool.

**Which embedder answers** (:func:`embedder_for`): ``model`` naming the retrieval embedder (``--embedder``, ``conse``
by default) gets it; naming the served model (any of its names, or ``vlm:MODEL``) gets the served model's embedder
(the VLM2Vec / Qwen3-VL-Embedding recipe: last-token pooling, where its runtime gives hidden states; else a 400 naming
``model``); no ``model``, or another name (as llama-server ignores it; ``--strict-model-name``: a 404), gets the
default: the retrieval embedder, or the served model with llama-server's ``--pooling last``. The
reply's ``model`` says which answered, ``refsight.random_weights`` whether its vectors carry meaning.

The fields: ``encoding_format`` ``float`` or ``base64`` (little-endian float32, or ``endianness``), ``dimensions``
where the embedder keeps its meaning cut there (renormalised; else a 400 naming it), ``truncate_prompt_tokens: -1``
cuts a text at the most tokens the embedder reads (without it a longer text is a 400), ``usage`` the text tokens
read. A field that would change the answer and is not served (``embed_dtype`` other than float32,
``embd_normalize`` other than 2 ...) is a 400 naming it; a field that cannot change it is accepted, and one refsight
does not know is named in ``refsight.ignored``.
"""

from __future__ import annotations

import base64
import sys
import time
import uuid as uuidlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
from fastapi import APIRouter, Request
from pydantic import Field, StrictBool, StrictInt, StrictStr

from ... import InvalidInputError
from ...ranking import EmbedRequest, EmbedResult
from ..deps import ConfigDep, MediaUuidsDep, Namespace, PoolDep, ServiceDep
from ..edge.disconnect import run_watched
from ..edge.http_errors import ERROR_RESPONSES, ApiError
from ..intake.dialect_body import DialectBody, log_ignored
from ..intake.embed_inputs import check_input_chars, messages_input, per_item, read_inputs, resolved
from ..intake.messages import Message, PartResolver

__all__ = ["EmbeddingsBody", "embedder_for", "ignored_fields", "router", "served_embedder"]

router = APIRouter(tags=["retrieval"])
_ERRORS = {k: ERROR_RESPONSES[k] for k in (400, 404)}


class EmbeddingsBody(DialectBody):
    """An embedding request of any of the dialects (strict types: ``"3"`` is no number, ``1`` no string)."""

    model: StrictStr | None = Field(None, description="the embedder, or the served model (see the route's rule)")
    input: Any = Field(None, description="a string, a list, token ids, content objects, prompt objects")
    content: Any = Field(None, description="llama-server's spelling of input (answered in llama-server's shape)")
    messages: list[Message] | None = Field(None, min_length=1, max_length=256, description="vLLM's chat form")
    encoding_format: StrictStr | None = Field(None, description="float (default) or base64")
    dimensions: StrictInt | None = Field(None, ge=1, description="cut each vector here, where the embedder allows it")
    truncate_prompt_tokens: StrictInt | None = Field(None, description="-1: cut a text at the embedder's most tokens")
    embd_normalize: StrictInt | None = Field(None, description="llama-server's; 2 (Euclidean) only")
    add_special_tokens: StrictBool | None = None
    normalize: StrictBool | None = None
    use_activation: StrictBool | None = None
    embed_dtype: StrictStr | None = Field(None, description="float32 only")
    endianness: StrictStr | None = Field(None, description="native, little or big (base64's bytes)")
    priority: StrictInt | None = None
    mm_processor_kwargs: dict[str, Any] | None = None
    user: StrictStr | None = None
    request_id: StrictStr | None = None
    cache_salt: StrictStr | None = None

    def refused(self) -> None:
        """400 naming a field whose value would change the answer and is not served."""
        served = {"encoding_format": (None, "float", "base64"), "embd_normalize": (None, 2),
                  "truncate_prompt_tokens": (None, -1), "add_special_tokens": (None, True), "normalize": (None, True),
                  "use_activation": (None, True), "embed_dtype": (None, "float32"), "priority": (None, 0),
                  "endianness": (None, "native", "little", "big")}
        for name, values in served.items():
            if getattr(self, name) not in values:
                shown = ", ".join(repr(v) for v in values if v is not None)
                raise ApiError(400, "unsupported", f"{name}: {getattr(self, name)!r} is not served here ({shown})",
                               param=name)
        if self.mm_processor_kwargs:
            raise ApiError(400, "unsupported", "mm_processor_kwargs: the embedder's preprocessing is fixed (its "
                           "fingerprint)", param="mm_processor_kwargs")


def ignored_fields(body: DialectBody) -> list[str]:
    """The fields of ``body`` refsight does not use (:meth:`~..intake.dialect_body.DialectBody.ignored_fields`:
    unknown ones, vLLM's chat-template fields among them, since refsight's embedders read no chat template), logged
    once: accepted, as they change nothing here, and named in the reply."""
    return log_ignored("an embedding, rerank or score request", body.ignored_fields())


def served_embedder(service: Any) -> tuple[str, str]:
    """The served model's embedder: (its name for the engine, ``vlm:MODEL``; the name replies show)."""
    return "vlm:" + service.model, service.served_model


def embedder_for(model: str | None, service: Any, *, strict: bool | None = None) -> tuple[str | None, str]:
    """(the embedder's name for the engine, None for the retrieval embedder; the name replies show) that ``model``
    asks for (the module docstring's rule); ``strict`` (default: ``--strict-model-name``) makes an unknown name a 404."""
    config = service.config
    if model is not None and model == service.embedder_name:
        return None, service.embedder_name
    if model is not None and (model in service.model_names or model == "vlm:" + service.model):
        return served_embedder(service)
    if model is not None and (config.strict_model_names if strict is None else strict):
        raise ApiError(404, "model_not_found", f"model {model!r} is not served here: embeddings come from "
                       f"{service.embedder_name!r} or the served model {service.served_model!r}", param="model")
    if config.pooling == "last":
        return served_embedder(service)
    return None, service.embedder_name


@contextmanager
def named_as(**fields: str) -> Iterator[None]:
    """Library errors named by the request's own fields: ``inputs[i]`` as ``fields["inputs"] + [i]`` (and so for each
    key), ``embedder`` and ``reranker`` as ``model``."""
    fields = {"embedder": "model", "reranker": "model", **fields}
    try:
        yield
    except InvalidInputError as e:
        name = e.input if isinstance(e.input, str) else ""
        head, bracket, rest = name.partition("[")
        if head in fields:
            raise type(e)(fields[head] + bracket + rest, e.reason) from None
        raise


def _inputs_of(body: EmbeddingsBody, marker: str) -> tuple[str, list[list[Any]]]:
    """The body's field of inputs and the inputs read from it: exactly one of input, content, messages."""
    given = [name for name in ("input", "content", "messages") if getattr(body, name) is not None]
    if len(given) != 1:
        raise ApiError(400, "invalid_input", f"{', '.join(given) or 'input'}: give exactly one of input, content and "
                       "messages", param=given[0] if given else "input")
    (field,) = given
    if field == "messages":
        return field, [messages_input(body.messages)]
    return field, read_inputs(getattr(body, field), field, marker)


async def embedded(
    request: Request, body: EmbeddingsBody, namespace: str, service: Any, pool: Any, config: Any, uuids: Any,
) -> tuple[EmbedResult, str]:
    """The body's vectors (in the work pool: images decoded there, never on the event loop), and the name of the
    embedder that answered as replies show it."""
    body.refused()
    field, inputs = _inputs_of(body, service.facts.media_marker)
    check_input_chars(inputs, config.max_prompt_tokens, field)
    embedder, shown = embedder_for(body.model, service)
    resolver = per_item(PartResolver.for_request(request, service, namespace, uuids, config), len(inputs))

    def work(stop_event: Any = None) -> EmbedResult:
        with named_as(inputs=field):
            return service.embed(EmbedRequest(
                resolved(inputs, resolver), embedder=embedder, dimensions=body.dimensions,
                truncate=body.truncate_prompt_tokens == -1, namespace=namespace))

    return await run_watched(pool, request, work), shown


def encoded(vector: np.ndarray, encoding: str | None, endianness: str | None = None) -> list[float] | str:
    """A vector as a reply carries it: floats, or base64 of its float32 bytes (little-endian unless ``endianness``)."""
    if encoding != "base64":
        return vector.tolist()
    order = {"big": ">", "little": "<"}.get(endianness or "", "<" if sys.byteorder == "little" else ">")
    return base64.b64encode(np.asarray(vector, dtype=f"{order}f4").tobytes()).decode("ascii")


def refsight_part(result: EmbedResult, ignored: list[str]) -> dict[str, Any]:
    """The reply's ``refsight`` object: whose vectors, whether they carry meaning, which images came from the store."""
    return {"embedder": result.embedder, "random_weights": result.random_weights,
            "images_cached": list(result.images_cached), "ignored": ignored}


def openai_reply(result: EmbedResult, body: EmbeddingsBody, shown: str) -> dict[str, Any]:
    """OpenAI's (and vLLM's) embedding list; base64 items carry llama-server's ``encoding_format`` too."""
    data = []
    for i, vector in enumerate(result.vectors):
        item = {"object": "embedding", "index": i, "embedding": encoded(vector, body.encoding_format, body.endianness)}
        data.append({**item, "encoding_format": "base64"} if body.encoding_format == "base64" else item)
    usage = {"prompt_tokens": result.prompt_tokens, "total_tokens": result.prompt_tokens}
    return {"id": f"embd-{uuidlib.uuid4().hex}", "object": "list", "created": int(time.time()), "model": shown,
            "data": data, "usage": usage, "refsight": refsight_part(result, ignored_fields(body))}


def llama_reply(result: EmbedResult, body: EmbeddingsBody) -> list[dict[str, Any]]:
    """llama-server's own shape: per input its ``index`` and ``embedding``, a list of its pooled vector (llama-server
    lists one vector per token there without pooling, which refsight does not serve)."""
    extra = refsight_part(result, ignored_fields(body))
    return [{"index": i, "embedding": [vector.tolist()], "refsight": extra} for i, vector in enumerate(result.vectors)]


@router.post("/v1/embeddings", responses=_ERRORS)
async def openai_embeddings(
    request: Request, body: EmbeddingsBody, namespace: Namespace, service: ServiceDep, pool: PoolDep, config: ConfigDep,
    uuids: MediaUuidsDep,
) -> Any:
    """OpenAI's embeddings (``input``, or vLLM's ``messages``); llama-server's ``content`` gets llama-server's shape."""
    result, shown = await embedded(request, body, namespace, service, pool, config, uuids)
    return llama_reply(result, body) if body.content is not None else openai_reply(result, body, shown)


@router.post("/embeddings", responses=_ERRORS)
@router.post("/embedding", responses=_ERRORS, include_in_schema=False)  # llama-server's older name
async def llama_embeddings(
    request: Request, body: EmbeddingsBody, namespace: Namespace, service: ServiceDep, pool: PoolDep, config: ConfigDep,
    uuids: MediaUuidsDep,
) -> Any:
    """llama-server's embeddings: ``content`` (or ``input``), one ``{"index", "embedding": [vector]}`` per input."""
    result, _ = await embedded(request, body, namespace, service, pool, config, uuids)
    return llama_reply(result, body)
