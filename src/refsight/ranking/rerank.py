"""Documents scored against a query (:meth:`refsight.Engine.rerank`): the model's P("yes"), or an embedding cosine.

- ``reranker="vlm"``: the Qwen3-VL-Reranker recipe refsight's compare reranks with
  (:class:`~refsight.compare.rerank.VlmReranker`): per (query, document) one forward pass over
  ``<Instruct> <Query> ... <Document> ... Answer "yes" or "no".`` (:func:`refsight.judge.prompts.yes_no_segments`) and the softmax of the yes/no logits at the
  answer's position, no decoding. The whole request's images are resolved once, as a chat's are
  (:meth:`~refsight.references.ReferenceBook.resolve_segments`): a stored reference from its durable package (no
  encoder), an image sent inline through the package cache under the ``remember_images`` policy, so a query image
  repeated over 100 documents is encoded once. The pairs go to the backend in batches of its ``batch_size``.
- any other ``reranker`` names an embedder: the cosine of the query's and each document's unit vector
  (:mod:`.embeddings`: an image's vector from the durable vector cache), no VLM.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..backends.base import Backend
from ..context import RequestContext
from ..errors import InvalidInputError
from ..package import VisualPackage
from ..judge.prompts import yes_no_segments
from ..references import ReferenceBook, ReferenceSegment
from ..requests import GenerationRequest
from .embeddings import Embeddings, count_tokens
from .requests import VLM_RERANKER, RerankRequest, RerankResult

__all__ = ["Reranking", "can_score"]

def can_score(backend: Backend) -> bool:
    """Whether ``backend`` gives P("yes") (its runtime implements the scoring pass)."""
    return type(backend).score is not Backend.score or type(backend).score_yes_no is not Backend.score_yes_no


class Reranking:
    """Scores a request's documents over the engine's parts: the reference book (references, decoding, a prompt's
    images resolved to packages) and the embeddings (an embedder's vectors)."""

    def __init__(self, book: ReferenceBook, embeddings: Embeddings) -> None:
        self.book = book
        self.embeddings = embeddings

    def rerank(self, context: RequestContext, request: RerankRequest) -> RerankResult:
        """One score per document, in order (see the module docstring)."""
        if request.reranker == VLM_RERANKER:
            return self._yes_no(context, request)
        return self._cosine(context, request)

    def _cosine(self, context: RequestContext, request: RerankRequest) -> RerankResult:
        embedder = self.embeddings.embedder(context, request.reranker)
        queries, named = self.embeddings.taken_apart(context, request.queries, "queries", embedder)
        documents, named_too = self.embeddings.taken_apart(context, request.documents, "documents", embedder)
        named.update(named_too)
        # A reranker reads what its model reads: a long document is cut there, as a cross-encoder cuts it.
        tokens = sum(count_tokens(embedder, [item.text for item in items], True, name)
                     for items, name in ((queries, "queries"), (documents, "documents")))
        query_vectors, _ = self.embeddings.vectors(context, embedder, queries, named)
        document_vectors, _ = self.embeddings.vectors(context, embedder, documents, named)
        pick = (lambda i: query_vectors[0]) if len(queries) == 1 else (lambda i: query_vectors[i])
        scores = tuple(float(document_vectors[i] @ pick(i)) for i in range(len(documents)))
        return RerankResult(scores, "embedding-cosine", embedder.name, embedder.random_weights, tokens)

    def _yes_no(self, context: RequestContext, request: RerankRequest) -> RerankResult:
        backend = context.backend()
        if not can_score(backend):
            raise InvalidInputError("reranker", f"{backend.name} gives no yes/no score on its runtime; name an "
                                    "embedder instead (the cosine of the vectors)")
        prompts = [yes_no_segments(query, document) for query, document in request.pairs()]
        flat = [segment for prompt in prompts for segment in prompt]
        named = self.book.named_references(flat, namespace=context.namespace)
        decoded = self.book.decode_images(flat)
        # One resolution for the whole request: an image in every pair is one lookup (one sighting, one encode).
        resolved = self.book.resolve_segments(context, backend, decoded, named).segments
        requests, tokens = _pair_requests(backend, [len(prompt) for prompt in prompts], decoded, resolved)
        step = max(1, int(getattr(backend, "batch_size", 1) or 1))
        scores: list[float] = []
        for first in range(0, len(requests), step):
            scores += backend.score_yes_no(requests[first:first + step])
        return RerankResult(tuple(float(s) for s in scores), "vlm-yes-no", backend.name, backend.random_weights, tokens)


def _pair_requests(
    backend: Backend, lengths: list[int], given: list[Any], resolved: list[Any],
) -> tuple[list[GenerationRequest], int]:
    """One one-token request per pair (``lengths``: each pair's count of segments, ``given`` as the request gave
    them, ``resolved`` as the backend takes them), its stored references named (their packages are the reference
    keys), and the prompts' tokens together."""
    requests, start, tokens = [], 0, 0
    for length in lengths:
        segments = resolved[start:start + length]
        references = frozenset(
            s.key for s, was in zip(segments, given[start:start + length])
            if isinstance(was, ReferenceSegment) and isinstance(s, VisualPackage))
        requests.append(GenerationRequest(segments=segments, max_new_tokens=1, reference_keys=references or None))
        tokens += _prompt_tokens(backend, segments)
        start += length
    return requests, tokens


def _prompt_tokens(backend: Backend, segments: Sequence[Any]) -> int:
    """The tokens of one pair's prompt: its texts, and each image's where the runtime can tell before running."""
    texts = sum(backend.count_text_tokens(s) for s in segments if isinstance(s, str))
    return texts + sum(backend.image_token_count(s) or 0 for s in segments if not isinstance(s, str))
