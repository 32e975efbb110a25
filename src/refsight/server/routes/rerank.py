"""Rerank in the shapes its clients read: Jina's and Cohere's ``/v1/rerank`` (``/rerank``, Cohere v2's ``/v2/rerank``,
llama-server's ``/reranking`` and ``/v1/reranking``, with llama-server's TEI form when the body has ``texts``) and
vLLM's ``/score`` (``/v1/score``).

A query or a document is text, an image or a stored reference, or several parts together (the forms of
:mod:`..intake.embed_inputs`: a string, vLLM's ``{"content": [parts]}``, Jina's ``{"text"}`` / ``{"image"}``; vLLM's
older ``"documents": {"content": [parts]}`` is one document per part). The scores are refsight's rerankers'
(:mod:`refsight.ranking.rerank`): ``model`` naming the served model, or none, or another name (as llama-server
ignores it; ``--strict-model-name``: a 404), is the served model's P("yes") over each pair, stored references from
their cached packages (a runtime that cannot score: a 400 naming ``model``); ``model`` naming the retrieval embedder
(``conse``) is the cosine of the two vectors. ``refsight.random_weights`` says when the scores carry no meaning.

Rerank: ``top_n`` (0 or none: every document), ``return_documents`` (default true: each result's ``document``, as
vLLM and Jina give it; Cohere's default is false), results best first with ``index`` and ``relevance_score``;
``usage`` counts what the model read. Score: ``text_1`` against ``text_2`` (or ``queries`` and ``documents`` /
``items``, ``data_1`` and ``data_2``), 1:1, 1:N or N:N, one ``score`` per pair in order.
"""

from __future__ import annotations

import time
import uuid as uuidlib
from typing import Any

from fastapi import APIRouter, Request
from pydantic import Field, StrictBool, StrictInt, StrictStr

from ...ranking import RerankRequest, RerankResult
from ..deps import ConfigDep, MediaUuidsDep, Namespace, PoolDep, ServiceDep
from ..edge.disconnect import run_watched
from ..edge.http_errors import ERROR_RESPONSES, ApiError
from ..intake.dialect_body import DialectBody
from ..intake.embed_inputs import check_input_chars, content_parts, per_item, read_input, resolved
from ..intake.messages import PartResolver
from .embeddings import ignored_fields, named_as

__all__ = ["RerankBody", "ScoreBody", "reranker_for", "router"]

router = APIRouter(tags=["retrieval"])
_ERRORS = {k: ERROR_RESPONSES[k] for k in (400, 404)}


class _ScoringBody(DialectBody):
    """The fields every scoring dialect shares (strict types), and the check of those that would change the answer."""

    model: StrictStr | None = None
    truncate_prompt_tokens: StrictInt | None = Field(None, description="-1 only: a reranker reads what its model reads")
    use_activation: StrictBool | None = Field(None, description="true only: the scores are probabilities or cosines")
    softmax: StrictBool | None = None
    activation: StrictBool | None = None
    priority: StrictInt | None = None
    mm_processor_kwargs: dict[str, Any] | None = None
    user: StrictStr | None = None
    request_id: StrictStr | None = None

    def refused(self) -> None:
        """400 naming a field whose value would change the answer and is not served."""
        served = {"truncate_prompt_tokens": (None, -1), "use_activation": (None, True), "softmax": (None, True),
                  "activation": (None, True), "priority": (None, 0), "mm_processor_kwargs": (None, {})}
        served.update(self.served_values())
        for name, values in served.items():
            if getattr(self, name) not in values:
                raise ApiError(400, "unsupported", f"{name}: {getattr(self, name)!r} is not served here (only "
                               f"{', '.join(repr(v) for v in values if v is not None)})", param=name)

    def served_values(self) -> dict[str, tuple[Any, ...]]:
        """The dialect's own fields and the values served."""
        return {}


class RerankBody(_ScoringBody):
    """Jina's, Cohere's (v1 and v2), vLLM's and llama-server's rerank body."""

    query: Any = Field(None, description="text, {\"content\": [parts]}, {\"text\"} or {\"image\"}")
    documents: Any = Field(None, description="a list of documents (each as a query may be)")
    texts: list[StrictStr] | None = Field(None, description="TEI's (llama-server's) documents: answered in TEI's shape")
    top_n: StrictInt | None = Field(None, ge=0, description="the best n (0 or none: all)")
    return_documents: StrictBool | None = Field(None, description="each result's document (default true)")
    return_text: StrictBool | None = Field(None, description="TEI: each result's text")
    max_tokens_per_doc: StrictInt | None = None
    max_chunks_per_doc: StrictInt | None = None
    rank_fields: list[Any] | None = None
    raw_scores: StrictBool | None = None

    def served_values(self) -> dict[str, tuple[Any, ...]]:
        """Cohere's document cuts and fields, and TEI's raw scores, are not served."""
        return {"max_tokens_per_doc": (None,), "max_chunks_per_doc": (None,), "rank_fields": (None,),
                "raw_scores": (None, False)}


class ScoreBody(_ScoringBody):
    """vLLM's score body, in each of its spellings of the two sides."""

    text_1: Any = None
    text_2: Any = None
    queries: Any = None
    documents: Any = None
    items: Any = None
    data_1: Any = None
    data_2: Any = None

    def sides(self) -> tuple[tuple[str, Any], tuple[str, Any]]:
        """(name, value) of the query side and of the document side: one spelling, both given."""
        for first, second in (("text_1", "text_2"), ("queries", "documents"), ("queries", "items"),
                              ("data_1", "data_2")):
            if getattr(self, first) is not None and getattr(self, second) is not None:
                return (first, getattr(self, first)), (second, getattr(self, second))
        raise ApiError(400, "invalid_input", "text_1: give text_1 and text_2 (or queries and documents)", param="text_1")


def reranker_for(model: str | None, service: Any) -> tuple[str | None, str]:
    """(the library's ``reranker``: ``"vlm"`` or None for the retrieval embedder's cosine; the name replies show)."""
    if model is not None and model == service.embedder_name:
        return None, service.embedder_name
    known = model is None or model in service.model_names or model == "vlm:" + service.model
    if not known and service.config.strict_model_names:
        raise ApiError(404, "model_not_found", f"model {model!r} is not served here: rerank with the served model "
                       f"{service.served_model!r} or the embedder {service.embedder_name!r}", param="model")
    return "vlm", service.served_model


def _side(value: Any, field: str, marker: str) -> list[list[Any]]:
    """One side's inputs: a list of them, vLLM's ``{"content": [parts]}`` as one per part (documents), or one."""
    if isinstance(value, list):
        if not value:
            raise ApiError(400, "invalid_input", f"{field}: must be a non-empty array", param=field)
        return [read_input(item, f"{field}[{i}]", marker) for i, item in enumerate(value)]
    if field in ("documents", "items", "text_2", "data_2") and isinstance(value, dict) and set(value) == {"content"}:
        return [[part] for part in content_parts(value["content"], f"{field}.content")]
    if value is None:
        raise ApiError(400, "invalid_input", f"{field}: must be provided", param=field)
    return [read_input(value, field, marker)]


async def scored(
    request: Request, body: _ScoringBody, sides: tuple[tuple[str, Any], tuple[str, Any]], namespace: str,
    service: Any, pool: Any, config: Any, uuids: Any,
) -> tuple[RerankResult, list[list[Any]], str]:
    """The documents' scores (in the work pool: images decoded there), the documents as read, and the name of what
    scored them as replies show it."""
    body.refused()
    (query_field, query), (document_field, given) = sides
    marker = service.facts.media_marker
    queries, documents = _side(query, query_field, marker), _side(given, document_field, marker)
    check_input_chars(queries, config.max_prompt_tokens, query_field)
    check_input_chars(documents, config.max_prompt_tokens, document_field)
    reranker, shown = reranker_for(body.model, service)
    resolver = per_item(PartResolver.for_request(request, service, namespace, uuids, config), len(documents))

    def work(stop_event: Any = None) -> RerankResult:
        with named_as(queries=query_field, documents=document_field):
            asked = RerankRequest(resolved(queries, resolver), resolved(documents, resolver), reranker=reranker,
                                  namespace=namespace)
            return service.rerank(asked)

    return await run_watched(pool, request, work), documents, shown


def _document(given: Any) -> dict[str, Any]:
    """A result's ``document`` as vLLM, Jina and Cohere give it: ``{"text"}`` for a text, else its parts."""
    texts = [part for part in given if isinstance(part, str)]
    if len(texts) == len(given):
        return {"text": "".join(texts)}
    return {"multi_modal": [_part(part) for part in given]}


def _part(part: Any) -> dict[str, Any]:
    """One part of a document as sent: a text part, or an image's URL."""
    if isinstance(part, str):
        return {"type": "text", "text": part}
    url = part.part.image_url.url if hasattr(part, "part") else part.item
    return {"type": "image_url", "image_url": {"url": url}}


def _refsight(result: RerankResult, body: DialectBody) -> dict[str, Any]:
    return {"reranker": result.reranker, "model": result.model, "random_weights": result.random_weights,
            "ignored": ignored_fields(body)}


@router.post("/v1/rerank", responses=_ERRORS)
@router.post("/rerank", responses=_ERRORS, include_in_schema=False)
@router.post("/v2/rerank", responses=_ERRORS, include_in_schema=False)  # Cohere's v2 client
@router.post("/reranking", responses=_ERRORS, include_in_schema=False)  # llama-server's names
@router.post("/v1/reranking", responses=_ERRORS, include_in_schema=False)
async def rerank(
    request: Request, body: RerankBody, namespace: Namespace, service: ServiceDep, pool: PoolDep, config: ConfigDep,
    uuids: MediaUuidsDep,
) -> Any:
    """Documents ranked against the query, best first (Jina's, Cohere's, vLLM's shape; TEI's list with ``texts``)."""
    tei = body.texts is not None
    documents = ("texts", body.texts) if tei else ("documents", body.documents)
    result, given, shown = await scored(
        request, body, (("query", body.query), documents), namespace, service, pool, config, uuids)
    ranked = result.ranked(body.top_n)
    if tei:  # llama-server's TEI form: a bare list
        return [{"index": i, "score": score, **({"text": body.texts[i]} if body.return_text else {})}
                for i, score in ranked]
    results = [{"index": i, "relevance_score": score,
                **({"document": _document(given[i])} if body.return_documents is not False else {})}
               for i, score in ranked]
    usage = {"prompt_tokens": result.prompt_tokens, "total_tokens": result.prompt_tokens}
    return {"id": f"rerank-{uuidlib.uuid4().hex}", "object": "list", "model": shown, "usage": usage,
            "results": results, "refsight": _refsight(result, body)}


@router.post("/score", responses=_ERRORS)
@router.post("/v1/score", responses=_ERRORS, include_in_schema=False)
async def score(
    request: Request, body: ScoreBody, namespace: Namespace, service: ServiceDep, pool: PoolDep, config: ConfigDep,
    uuids: MediaUuidsDep,
) -> Any:
    """vLLM's score: one ``score`` per (text_1, text_2) pair, in order."""
    result, _, shown = await scored(request, body, body.sides(), namespace, service, pool, config, uuids)
    data = [{"index": i, "object": "score", "score": s} for i, s in enumerate(result.scores)]
    usage = {"prompt_tokens": result.prompt_tokens, "total_tokens": result.prompt_tokens, "completion_tokens": 0}
    return {"id": f"score-{uuidlib.uuid4().hex}", "object": "list", "created": int(time.time()), "model": shown,
            "data": data, "usage": usage, "refsight": _refsight(result, body)}
