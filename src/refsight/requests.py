"""The typed requests of refsight's public API: each built once by a front door, checked once, taken whole.

A front door (the Python keywords, the CLI's arguments, an HTTP body) builds ONE request
value; its ``__post_init__`` checks every rule of that request in one place (vLLM's
``SamplingParams._verify_args`` style) and raises :class:`~refsight.errors.InvalidInputError`
naming the field and the reason; the engine takes the value whole and never checks it again.

- :class:`CompareRequest`: one compare (the candidate, the rubric, recall / rerank / judge
  knobs, the cache switches, the model and the namespace);
- :class:`~refsight.backends.sampling.Sampling`: how tokens are picked, with the one merge of a
  request's fields over the served model's defaults (:meth:`Sampling.merged`) and the one rule of
  what a backend honours (:meth:`Sampling.unsupported`). It is defined beside the backends, which
  read it, and re-exported here with its declared ranges (``SAMPLING_RANGES``, for a schema).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .backends.sampling import RANGES as SAMPLING_RANGES
from .backends.sampling import Sampling
from .deprecation import renamed
from .errors import InvalidInputError
from .images import ImageSource
from .judge.attribute_records import check_sources
from .judge.criteria import Rubric, parse_rubric
from .rerank import Reranker
from .retrieval.query import check_query_text, check_recall_mode
from .store.base import validate_ref_id

__all__ = ["CompareRequest", "Sampling", "SAMPLING_RANGES", "MAX_SHORTLIST"]

#: Most references one compare may recall, rerank or judge.
MAX_SHORTLIST = 1000


@dataclass(frozen=True)
class CompareRequest:
    """One compare (see :meth:`refsight.Engine.compare`), checked once when it is built.

    ``criteria`` is the rubric (text, JSON, YAML or data; parsed here into :attr:`rubric`);
    ``ref_ids`` the references, or the ``top_k`` recalled (within ``ref_ids`` when both are
    given) by ``recall`` (``"image"``, ``"text"``, ``"both"``; resolved into :attr:`mode`) with
    the ``query`` text; ``rerank``, ``recall_k`` and ``reranker`` the shortlist's depth and
    scorer; ``attributes`` the attribute records used (none with ``force_vlm``);
    ``evidence_max_chars`` bounds each evidence string. ``use_cache`` / ``prefix_states``,
    ``model`` and ``namespace`` become the request context at the engine's front door.
    """

    candidate: ImageSource
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
    use_cache: bool = True
    prefix_states: bool = True
    model: str | None = None
    namespace: str | None = None
    #: the parsed ``criteria``
    rubric: Rubric = field(init=False, repr=False, compare=False)
    #: the attribute records used (none with ``force_vlm``)
    sources: tuple[str, ...] = field(init=False, repr=False, compare=False)
    #: the recall query's mode (``recall``, else ``text`` with a query, else ``both``)
    mode: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # The order errors are found in: the reference ids, the rubric, the sources, the counts, the recall mode.
        self._set("ref_ids", tuple(self.ref_ids))
        for ref_id in self.ref_ids:
            validate_ref_id(ref_id)
        self._set("rubric", parse_rubric(self.criteria))  # a bad rubric fails before any model work
        sources = check_sources(self.attributes)
        self._set("attributes", sources)
        self._set("sources", () if self.force_vlm else sources)
        self._check_counts()
        self._set("mode", check_recall_mode(self.recall, query=self.query))

    @classmethod
    def of(cls, request: CompareRequest | ImageSource, options: Mapping[str, Any]) -> CompareRequest:
        """``request`` itself, or the request of a candidate and keywords (the keyword form of the Python API;
        ``use_kv_cache``: the deprecated name of ``prefix_states``)."""
        if isinstance(request, CompareRequest):
            if options:
                raise InvalidInputError(", ".join(sorted(options)), "give a CompareRequest or keywords, not both")
            return request
        options = dict(options)
        if "use_kv_cache" in options:
            options["prefix_states"] = renamed(
                "use_kv_cache", options.pop("use_kv_cache"), "prefix_states", options.get("prefix_states", True),
                where="Engine.compare", default=True,
            )
        return cls(request, **options)

    @property
    def recall_depth(self) -> int | None:
        """How many references recall returns (None: no recall, the given ids are the shortlist)."""
        return None if self.top_k is None else self.recall_k or self.rerank or self.top_k

    def _set(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)

    def _check_counts(self) -> None:
        """The counts that cannot work together, and an empty ``query``: every cross-field rule of a compare."""
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
