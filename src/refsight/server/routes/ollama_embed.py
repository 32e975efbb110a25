"""Ollama's embedding endpoints, ``POST /api/embed`` and the older ``/api/embeddings``, with images.

The vectors are :mod:`.embeddings`' (the same embedder gives the same vector on every route). ``model`` is
Ollama's: the served model by any of its names (``:latest`` or not) is embedded by the served model's embedder (the
VLM recipe, where its runtime gives hidden states), the retrieval embedder's name (``conse``) by that; any other
name is Ollama's 404. Ollama's own endpoints take text only; here ``images`` (base64, or a stored reference:
``refsight://ref/<id>``, as the chat's ``images``) adds inputs: ``/api/embed`` embeds each text, then each image;
``/api/embeddings`` embeds its ``prompt`` and its images together, as one input. ``truncate`` (default true, as
Ollama's) cuts a text at the most tokens the embedder reads; false refuses a longer one. ``dimensions`` as on
``/v1/embeddings``.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request
from pydantic import Field, StrictBool, StrictInt, StrictStr

from ...ranking import EmbedRequest, EmbedResult
from ..deps import ConfigDep, MediaUuidsDep, Namespace, PoolDep, ServiceDep
from ..edge.disconnect import run_watched
from ..edge.http_errors import ERROR_RESPONSES
from ..intake.dialect_body import DialectBody
from ..intake.embed_inputs import MediaItem, check_input_chars, per_item, resolved
from ..intake.messages import PartResolver
from .embeddings import ignored_fields, named_as, served_embedder
from .ollama_bodies import check_model

__all__ = ["router"]

router = APIRouter(tags=["ollama"])
_ERRORS = {k: ERROR_RESPONSES[k] for k in (400, 404)}


class _OllamaEmbedding(DialectBody):
    """What both of Ollama's embedding bodies carry (``options`` and ``keep_alive`` change no vector: accepted)."""

    model: StrictStr
    images: list[StrictStr] | None = Field(None, max_length=64, description="refsight's: images to embed")
    options: dict[str, Any] | None = None
    keep_alive: Any = None


class OllamaEmbedBody(_OllamaEmbedding):
    """``POST /api/embed``."""

    input: StrictStr | list[StrictStr] | None = None
    truncate: StrictBool | None = None
    dimensions: StrictInt | None = Field(None, ge=1)


class OllamaEmbeddingsBody(_OllamaEmbedding):
    """``POST /api/embeddings`` (Ollama's older endpoint: one ``prompt``, one ``embedding``)."""

    prompt: StrictStr | None = None


def ollama_embedder(model: str, service: Any) -> str | None:
    """The embedder ``model`` names for the engine (None: the retrieval embedder); Ollama's 404 for another name."""
    if model == service.embedder_name:
        return None
    check_model(model, service)
    return served_embedder(service)[0]


async def _embedded(
    request: Request, body: _OllamaEmbedding, inputs: list[list[Any]], options: dict[str, Any], namespace: str,
    service: Any, pool: Any, config: Any, uuids: Any,
) -> tuple[EmbedResult, int]:
    """The vectors of ``inputs`` (images resolved in the work pool) and the nanoseconds they took."""
    embedder = ollama_embedder(body.model, service)
    check_input_chars(inputs, config.max_prompt_tokens, "input")
    resolver = per_item(PartResolver.for_request(request, service, namespace, uuids, config), len(inputs))
    began = time.perf_counter_ns()

    def work(stop_event: Any = None) -> EmbedResult:
        with named_as(inputs="input"):
            return service.embed(EmbedRequest(resolved(inputs, resolver), embedder=embedder, namespace=namespace,
                                              **options))

    result = await run_watched(pool, request, work)
    return result, time.perf_counter_ns() - began


def _images(body: _OllamaEmbedding) -> list[MediaItem]:
    return [MediaItem(item, f"images[{j}]") for j, item in enumerate(body.images or [])]


@router.post("/api/embed", responses=_ERRORS)
async def embed(
    request: Request, body: OllamaEmbedBody, namespace: Namespace, service: ServiceDep, pool: PoolDep,
    config: ConfigDep, uuids: MediaUuidsDep,
) -> dict[str, Any]:
    """Ollama's ``/api/embed``: one unit vector per text of ``input``, then one per image of ``images``."""
    texts = [body.input] if isinstance(body.input, str) else list(body.input or [])
    inputs = [[text] for text in texts] + [[image] for image in _images(body)]
    if not inputs:  # Ollama's answer to nothing: no vectors (clients send it to load the model)
        ollama_embedder(body.model, service)
        return {"model": body.model, "embeddings": [], "total_duration": 0, "load_duration": 0, "prompt_eval_count": 0}
    options = {"truncate": body.truncate is not False, "dimensions": body.dimensions}
    result, took = await _embedded(request, body, inputs, options, namespace, service, pool, config, uuids)
    return {"model": body.model, "embeddings": result.vectors.tolist(), "total_duration": took, "load_duration": 0,
            "prompt_eval_count": result.prompt_tokens,
            "refsight": {"embedder": result.embedder, "random_weights": result.random_weights,
                         "images_cached": list(result.images_cached), "ignored": ignored_fields(body)}}


@router.post("/api/embeddings", responses=_ERRORS)
async def embeddings(
    request: Request, body: OllamaEmbeddingsBody, namespace: Namespace, service: ServiceDep, pool: PoolDep,
    config: ConfigDep, uuids: MediaUuidsDep,
) -> dict[str, Any]:
    """Ollama's older ``/api/embeddings``: one vector of ``prompt`` and ``images`` together."""
    parts = ([body.prompt] if body.prompt else []) + _images(body)
    if not parts:
        ollama_embedder(body.model, service)
        return {"embedding": []}
    result, _ = await _embedded(request, body, [parts], {"truncate": True}, namespace, service, pool, config, uuids)
    return {"embedding": result.vectors[0].tolist(),
            "refsight": {"embedder": result.embedder, "random_weights": result.random_weights,
                         "images_cached": list(result.images_cached), "ignored": ignored_fields(body)}}
