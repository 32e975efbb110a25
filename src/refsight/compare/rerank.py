"""The rerank stage: score a recalled shortlist against the candidate and the rubric, keep the best.

A :class:`Reranker` turns ``(candidate, rubric, reference)`` into one relevance score per
reference; the engine keeps the ``top_k`` best for the judge. Two implementations:

- :class:`VlmReranker` (the default, Qwen3-VL-Reranker style): one forward pass per
  (reference package, candidate, rubric), score = P("yes") from the next-token logits,
  softmax over the yes/no pair, no decoding (:meth:`refsight.backends.base.Backend.score_yes_no`).
  References come from their cached packages (:class:`~refsight.cache.packages.PackageCache`),
  the candidate is encoded once, requests go in batches of the backend's ``batch_size``.
- :class:`EmbeddingReranker`: cosine between the query vector (candidate and/or rubric) and
  each reference's cached vector under an embedder, often a stronger one than recall's.
  It needs no VLM. A cross-encoder plugs in the same way: subclass :class:`Reranker`.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ..requests import GenerationRequest
from ..context import RequestContext
from ..errors import InvalidInputError
from ..inputs.images import ImageInput
from ..package import VisualPackage
from ..cache.packages import PackageCache
from ..embedders.base import Embedder
from ..judge.prompts import YES_NO_SYSTEM
from ..retrieval.query import query_vector
from ..store import Reference

__all__ = ["RERANK_INSTRUCTION", "EmbeddingReranker", "RerankQuery", "Reranker", "VlmReranker", "rerank_segments"]

#: What the VLM reranker is asked to decide (the "Instruct" of the Qwen3-VL-Reranker prompt).
RERANK_INSTRUCTION = "Does the reference image (the Document) meet the criteria for the candidate image (the Query)?"

@dataclass(frozen=True)
class RerankQuery:
    """What references are reranked against: the candidate image, the rubric's criteria, the recall text and mode."""

    image: ImageInput
    criteria: tuple[str, ...]
    text: str
    mode: str = "both"


class Reranker(abc.ABC):
    """Scores references for a query (higher is more relevant); ``scorings`` counts references scored."""

    #: short name, reported in results
    name: str = "reranker"

    def __init__(self) -> None:
        self.scorings = 0

    def score(self, query: RerankQuery, references: Sequence[Reference]) -> list[float]:
        """One score per reference, in order (counted in :attr:`scorings`)."""
        references = list(references)
        if not references:
            return []
        scores = self._score(query, references)
        if len(scores) != len(references):
            raise InvalidInputError(self.name, f"returned {len(scores)} scores for {len(references)} references")
        self.scorings += len(references)
        return [float(s) for s in scores]

    @abc.abstractmethod
    def _score(self, query: RerankQuery, references: list[Reference]) -> list[float]:
        """Score a non-empty list of references."""


def rerank_segments(reference: object, candidate: object, criteria: Sequence[str], instruction: str = RERANK_INSTRUCTION) -> list:
    """The yes/no prompt of one (reference, candidate, rubric): query (candidate + criteria), then document."""
    rubric = "\n".join(f"- {c}" for c in criteria)
    return [
        f"{YES_NO_SYSTEM}\n<Instruct>: {instruction}\n<Query>: the candidate image",
        candidate,
        f"Criteria:\n{rubric}\n<Document>: the reference image",
        reference,
        'Answer "yes" or "no".',
    ]


class VlmReranker(Reranker):
    """P("yes") of the context's backend per reference, from cached packages (``use_cache=False``: pixels).

    The candidate's package is looked up once (memory tier only, like the judge's); each
    reference's comes from the durable store, so no reference is re-encoded.
    """

    name = "vlm-yes-no"

    def __init__(self, context: RequestContext, packages: PackageCache, *, instruction: str = RERANK_INSTRUCTION) -> None:
        super().__init__()
        self.context = context
        self.packages = packages
        self.instruction = instruction

    def _score(self, query: RerankQuery, references: list[Reference]) -> list[float]:
        backend = self.context.backend()
        candidate = self.packages.served_candidate(self.context, query.image).item
        step = max(1, int(getattr(backend, "batch_size", 1) or 1))
        scores: list[float] = []
        for start in range(0, len(references), step):
            requests = [self.request(ref, candidate, query) for ref in references[start : start + step]]
            scores += backend.score_yes_no(requests)
        return scores

    def request(self, reference: Reference, candidate: object, query: RerankQuery) -> GenerationRequest:
        """The yes/no request of one reference against the candidate's image (a package or pixels)."""
        image = self.packages.served_reference(self.context, reference).item
        # The candidate comes first here, so the reference is named: a runtime that keeps images by a
        # durable id (vLLM's uuid) gives one to the reference and never to the candidate.
        keys = frozenset((image.key,)) if isinstance(image, VisualPackage) else None
        segments = rerank_segments(image, candidate, query.criteria, self.instruction)
        return GenerationRequest(segments=segments, max_new_tokens=1, reference_keys=keys)


class EmbeddingReranker(Reranker):
    """Cosine of the query vector and each reference's vector under ``embedder`` (no VLM).

    ``reference_vectors(references, embedder)`` gives unit vectors (the engine passes the
    store index's cached vectors, so each reference is embedded once per embedder, ever).
    """

    name = "embedding-cosine"

    def __init__(self, embedder: Embedder, reference_vectors: Callable[[Sequence[Reference], Embedder], np.ndarray]) -> None:
        super().__init__()
        self.embedder = embedder
        self._reference_vectors = reference_vectors

    def _score(self, query: RerankQuery, references: list[Reference]) -> list[float]:
        vector = query_vector(self.embedder, image=query.image, text=query.text, mode=query.mode)
        return (self._reference_vectors(references, self.embedder) @ vector).tolist()
