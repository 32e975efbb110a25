"""The requests and results of the retrieval stage served on its own: vectors of inputs, documents scored.

An *input* (an embedding's, a query, a document) is one part or several embedded or judged together: a text
(``str``), an image (any :data:`~refsight.inputs.images.ImageSource`), or a stored reference
(:class:`~refsight.references.ReferenceSegment`); an embedding's may also hold token ids (``int``), read as their
text in the embedder's own vocabulary. Each request is checked once, when it is built (the typed
requests' rule, :mod:`refsight.requests`), and taken whole by :meth:`refsight.Engine.embed` and
:meth:`refsight.Engine.rerank`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import InvalidInputError
from ..inputs.text import check_text

__all__ = [
    "EmbedRequest", "EmbedResult", "RerankRequest", "RerankResult", "MAX_EMBED_INPUTS", "MAX_DOCUMENTS",
    "checked_inputs", "is_token_id",
]

#: Most inputs one embedding request may hold (OpenAI's bound on ``input``).
MAX_EMBED_INPUTS = 2048

#: Most documents one rerank may score (Cohere's bound).
MAX_DOCUMENTS = 1000

#: The ``reranker`` that scores by the model's P("yes") (any other names an embedder: the cosine).
VLM_RERANKER = "vlm"


@dataclass(frozen=True)
class EmbedRequest:
    """Unit vectors of inputs (see :meth:`refsight.Engine.embed`).

    ``embedder`` names the embedder (None: the engine's; ``vlm:MODEL`` with the engine's model: that model, already
    loaded); ``dimensions`` cuts each vector where the embedder keeps its meaning (renormalised); ``truncate`` cuts a
    text at the most tokens the embedder reads (else a longer one is refused); ``use_cache=False`` embeds every image
    afresh and keeps no vector.
    """

    inputs: Sequence[Any]
    embedder: str | None = None
    dimensions: int | None = None
    truncate: bool = False
    use_cache: bool = True
    namespace: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "inputs", checked_inputs(self.inputs, "inputs", MAX_EMBED_INPUTS, token_ids=True))
        dimensions = self.dimensions
        if dimensions is not None and (isinstance(dimensions, bool) or not isinstance(dimensions, int) or dimensions < 1):
            raise InvalidInputError("dimensions", f"must be a positive integer, not {dimensions!r}")


@dataclass(frozen=True)
class RerankRequest:
    """Documents scored against a query (see :meth:`refsight.Engine.rerank`), one score per document, in order.

    ``queries`` holds one query for every document, or one for each (vLLM's N:N ``/score``). ``reranker``:
    ``"vlm"``, the model's P("yes") over each pair (stored references from their cached packages), or an embedder's
    name (None: the engine's), the cosine of the two vectors. ``use_cache=False`` sends every image as pixels.
    """

    queries: Sequence[Any]
    documents: Sequence[Any]
    reranker: str | None = VLM_RERANKER
    use_cache: bool = True
    model: str | None = None
    namespace: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "documents", checked_inputs(self.documents, "documents", MAX_DOCUMENTS))
        object.__setattr__(self, "queries", checked_inputs(self.queries, "queries", MAX_DOCUMENTS))
        if len(self.queries) not in (1, len(self.documents)):
            raise InvalidInputError("queries", f"give one query, or one for each of the {len(self.documents)} "
                                    f"documents, not {len(self.queries)}")

    def pairs(self) -> list[tuple[tuple[Any, ...], tuple[Any, ...]]]:
        """(query, document) per document, in order."""
        queries = self.queries * len(self.documents) if len(self.queries) == 1 else self.queries
        return list(zip(queries, self.documents))


def checked_inputs(inputs: Any, name: str, most: int, *, token_ids: bool = False) -> tuple[tuple[Any, ...], ...]:
    """Inputs as tuples of parts: 1 to ``most`` of them, every text valid Unicode, token ids only where ``token_ids``
    allows them, each input holding an image, an id or some text; InvalidInputError naming ``name[i]`` otherwise."""
    if isinstance(inputs, (str, bytes)) or not isinstance(inputs, Sequence):
        raise InvalidInputError(name, "expected a list of inputs")
    if not 1 <= len(inputs) <= most:
        raise InvalidInputError(name, f"give 1 to {most} inputs, not {len(inputs)}")
    return tuple(_checked_input(item, f"{name}[{i}]", token_ids) for i, item in enumerate(inputs))


def _checked_input(item: Any, where: str, token_ids: bool) -> tuple[Any, ...]:
    """One input as a tuple of parts (a lone part is an input of one): valid texts, token ids where allowed, and
    something in it (an image, an id or some text)."""
    parts = tuple(item) if isinstance(item, (list, tuple)) else (item,)
    for part in parts:
        if isinstance(part, str):
            check_text(part, where)
        elif isinstance(part, (int, float)) and not (token_ids and is_token_id(part)):
            raise InvalidInputError(where, f"{part!r} is no {'token id' if token_ids else 'text or image'}")
    if not any(not isinstance(part, str) or part.strip() for part in parts):
        raise InvalidInputError(where, "is empty: give some text or an image")
    return parts


def is_token_id(part: Any) -> bool:
    """Whether an input's part is a token id (an integer; ``true`` is none)."""
    return isinstance(part, int) and not isinstance(part, bool)


@dataclass(frozen=True)
class EmbedResult:
    """One unit vector per input (``vectors``, float32 ``[n, dim]``), by ``embedder`` (its name; ``random_weights``:
    they carry no meaning); ``prompt_tokens`` the tokens the embedder read; per image part, in order, whether its
    vector came from the store (``images_cached``: no encoder ran for it)."""

    vectors: np.ndarray
    embedder: str
    random_weights: bool
    prompt_tokens: int
    images_cached: tuple[bool, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the vectors as lists of floats."""
        return {"embedder": self.embedder, "random_weights": self.random_weights, "prompt_tokens": self.prompt_tokens,
                "images_cached": list(self.images_cached), "vectors": self.vectors.tolist()}


@dataclass(frozen=True)
class RerankResult:
    """One score per document, in the documents' order (higher is more relevant), by ``reranker``
    (``vlm-yes-no``: P("yes"), in 0..1; ``embedding-cosine``: in -1..1) of ``model`` (the VLM or the embedder);
    ``random_weights``: the scores carry no meaning; ``prompt_tokens`` what the model read."""

    scores: tuple[float, ...]
    reranker: str
    model: str
    random_weights: bool
    prompt_tokens: int

    def ranked(self, top_n: int | None = None) -> list[tuple[int, float]]:
        """(index, score), best first (ties: the earlier document), at most ``top_n`` (None or 0: all)."""
        order = sorted(range(len(self.scores)), key=lambda i: (-self.scores[i], i))
        return [(i, self.scores[i]) for i in order[: top_n or None]]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {"scores": list(self.scores), "reranker": self.reranker, "model": self.model,
                "random_weights": self.random_weights, "prompt_tokens": self.prompt_tokens}
