"""The knobs of one compare, and the rules between them (checked here, in the library, once)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidInputError
from ..rerank import Reranker
from ..retrieval.query import check_query_text

__all__ = ["CompareOptions"]

#: Most references one compare may recall, rerank or judge.
MAX_SHORTLIST = 1000


@dataclass(frozen=True)
class CompareOptions:
    """What one compare asks for (see :meth:`refsight.Engine.compare`); the model and the cache
    switches travel in the request context, not here."""

    criteria: Any
    ref_ids: Sequence[str] = ()
    top_k: int | None = None
    query: str | None = None
    recall: str | None = None
    rerank: int | None = None
    #: references recalled (default: ``rerank``, else ``top_k``); with more than ``rerank``, the best
    #: ``rerank`` by recall score (after the prefilter) are reranked, the rest reported as ``recalled``
    recall_k: int | None = None
    reranker: str | Reranker = "vlm"
    force_vlm: bool = False
    attributes: Sequence[str] = ("imagenet",)
    evidence_max_chars: int | None = None

    @property
    def recall_depth(self) -> int | None:
        """How many references recall returns (None: no recall, the given ids are the shortlist)."""
        return None if self.top_k is None else self.recall_k or self.rerank or self.top_k

    def check(self) -> None:
        """Raise InvalidInputError for counts that cannot work together, or an empty ``query``: every
        cross-field rule of a compare, in this one place (front ends map the error, they keep no copy)."""
        if self.query is not None:
            check_query_text(self.query, "query")  # the rule search's text follows too
            if self.top_k is None:  # query only steers recall: without top_k it would be silently ignored
                raise InvalidInputError("query", "recalls references by text, so it needs top_k")
        for name in ("top_k", "rerank", "recall_k"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_SHORTLIST):
                raise InvalidInputError(name, f"must be an integer in 1..{MAX_SHORTLIST}, not {value!r}")
        if self.rerank is not None:
            if self.top_k is None:
                raise InvalidInputError("rerank", "reranks a recalled shortlist: give top_k (the references to judge) too")
            if self.rerank < self.top_k:
                raise InvalidInputError("rerank", f"recalls {self.rerank} to rerank, fewer than top_k={self.top_k} to judge")
        if self.recall_k is not None:
            if self.top_k is None:
                raise InvalidInputError("recall_k", "is the depth of recall: give top_k too")
            if self.recall_k < (self.rerank or self.top_k):
                raise InvalidInputError("recall_k", f"recalls {self.recall_k}, fewer than the {self.rerank or self.top_k} that go on")
        if not isinstance(self.reranker, Reranker) and self.reranker not in ("vlm", "embedding"):
            raise InvalidInputError("reranker", f"use 'vlm', 'embedding' or a Reranker, not {self.reranker!r}")
