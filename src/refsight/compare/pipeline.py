"""The compare pipeline's stages, built once from the engine's parts (see :mod:`refsight.compare`).

:meth:`ComparePipeline.run` reads top to bottom: it decodes the (checked) request's candidate, then calls each stage
(:meth:`~ComparePipeline.recall`, :meth:`~ComparePipeline.prefilter`,
:meth:`~ComparePipeline.rerank`, :meth:`~ComparePipeline.judge`) under a timer named after it;
each stage is a small function of the request and what the stages before it found.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from ..context import RequestContext
from ..errors import InvalidInputError
from ..inputs.images import ImageInput, IntakeLimits, load_image
from ..judge import Judge
from ..inputs.rubric import Rubric
from ..judge.attribute_records import AttributeRecords
from ..judge.prefilter import Filtered, required_mismatches
from ..cache.packages import ModelImage, PackageCache, ServedImage
from ..cache.prefix_states import PrefixStateCache
from ..references import ReferenceBook
from ..requests import CompareRequest
from .rerank import EmbeddingReranker, Reranker, RerankQuery, VlmReranker
from ..results import CompareResult, SearchResult
from ..retrieval.query import query_vector, recall_text
from ..retrieval.store_index import StoreIndex
from ..store import Reference
from ..support.timing import StageTicker, StageTimer
from .rows import other_row, sort_results

__all__ = ["ComparePipeline"]


@dataclass(frozen=True)
class _Request:
    """One compare under way: the context, the checked request and the decoded candidate."""

    context: RequestContext
    options: CompareRequest
    image: ImageInput
    #: the text side of the recall query (the query, else the rubric)
    text: str

    @property
    def rubric(self) -> Rubric:
        """The parsed rubric."""
        return self.options.rubric

    @property
    def sources(self) -> tuple[str, ...]:
        """The attribute records used (none with ``force_vlm``)."""
        return self.options.sources

    @property
    def mode(self) -> str:
        """The recall query's mode."""
        return self.options.mode


@dataclass
class _Shortlist:
    """The references one compare looks at, and how far each got."""

    refs: list[Reference]
    recalled: list[dict[str, Any]] = field(default_factory=list)
    recall_scores: dict[str, float] = field(default_factory=dict)
    filtered: dict[str, Filtered] = field(default_factory=dict)
    rerank_scores: dict[str, float] = field(default_factory=dict)
    stage: dict[str, str] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=lambda: {"recalled": 0, "filtered": 0, "reranked": 0, "judged": 0})


@dataclass(frozen=True, eq=False)
class ComparePipeline:
    """Recall → prefilter → rerank → judge over the parts of one store (no engine in sight)."""

    packages: PackageCache
    book: ReferenceBook
    retrieval: StoreIndex
    attribute_records: AttributeRecords
    prefixes: PrefixStateCache
    limits: IntakeLimits
    #: Loads the text model that matches criteria to attribute records (the prefilter's; MiniLM).
    text_encoder: Callable[[], Any] = field(default=lambda: _minilm())
    #: Whether a run shows its stage and elapsed time on stderr (the engine's ``progress``).
    progress: Callable[[], bool] = field(default=lambda: False)

    def run(
        self, context: RequestContext, options: CompareRequest, on_stage: Callable[[str], None] | None = None,
    ) -> CompareResult:
        """Judge the candidate of ``options`` (checked when it was built; see :mod:`refsight.compare`);
        ``on_stage`` is told each stage's name as it starts (a server's progress endpoint)."""
        with StageTicker("compare", enabled=self.progress()) as ticker:
            def started(stage: str) -> None:
                ticker.stage(stage)
                if on_stage is not None:
                    on_stage(stage)

            return self._run(context, options, StageTimer(on_start=started))

    def _run(self, context: RequestContext, options: CompareRequest, timer: StageTimer) -> CompareResult:
        request = self._request(context, options)
        self._start(context, options, timer)
        found = None
        if options.top_k is not None:
            with timer("recall"):
                found = self.recall(request)
        shortlist = self._shortlist(request, found)
        candidate_record = None
        if request.sources and any(c.required for c in request.rubric.criteria):
            with timer("prefilter"):
                candidate_record = self.prefilter(request, shortlist)
        finalists = self._finalists(request, shortlist, timer)
        judged, vlm_calls = [], 0
        if finalists:
            judged, vlm_calls = self._judge_finalists(request, shortlist, finalists, candidate_record, timer)
        backend = context.backend()
        return CompareResult(
            candidate_sha256=request.image.sha256, model=backend.name,
            random_weights=bool(backend.random_weights), results=self._rows(shortlist, judged),
            timings_ms=timer.done(), recalled=shortlist.recalled, vlm_calls=vlm_calls, stages=shortlist.counts,
        )

    def _start(self, context: RequestContext, options: CompareRequest, timer: StageTimer) -> None:
        """The named references looked up, then the model loaded (its first load timed as start-up)."""
        for ref_id in options.ref_ids:  # a mistyped name fails in a catalog read, not after the model's load
            self.book.get(ref_id, namespace=context.namespace)
        if not options.ref_ids and not self.book.count(namespace=context.namespace):  # nothing to recall: say so now
            raise InvalidInputError("references", f"no reference to compare with: the store has no references "
                                    f"(namespace {context.namespace!r}); add some first (refsight add IMAGE..., "
                                    "refsight ingest DIR, POST /v1/references)")
        if not context.models.is_loaded(context.model):
            # The model's first load in this process (imports, weights: seconds) is start-up, not a
            # stage: booked to whichever stage first touched the backend, it read "candidate encode 4 s".
            with timer("startup"):
                context.backend()  # loads it

    def _finalists(self, request: _Request, shortlist: _Shortlist, timer: StageTimer) -> list[Reference]:
        """The references the judge sees: the survivors of the prefilter, reranked or cut to ``top_k``."""
        options = request.options
        survivors = [ref for ref in shortlist.refs if ref.ref_id not in shortlist.filtered]
        finalists = survivors[: options.top_k] if options.rerank is None and options.recall_k else survivors
        if options.rerank is not None and survivors:
            with timer("rerank"):
                finalists = self.rerank(request, shortlist, survivors[: options.rerank])  # the best by recall go on
        return finalists

    # -- the stages ------------------------------------------------------------------------
    def recall(self, request: _Request) -> SearchResult:
        """The ``recall_depth`` references nearest the query (within the given ids, when there are some)."""
        vector = query_vector(self.retrieval.embedder(), image=request.image, text=request.text, mode=request.mode)
        return self.retrieval.search(
            text=None, image=None, vector=vector, k=request.options.recall_depth, namespace=request.context.namespace,
            restrict_to=list(request.options.ref_ids) or None, scope=request.context.scope,
        )

    def prefilter(self, request: _Request, shortlist: _Shortlist) -> dict[str, Any] | None:
        """Drop the references whose stored records settle a required criterion as a mismatch; the
        candidate's record when it was needed (the judge reuses it)."""
        context, refs = request.context, shortlist.refs
        stored = self.attribute_records.stored([(ref.image_sha256, context.scope) for ref in refs], request.sources,
                                               context.backend())
        if not any(stored):
            return None
        candidate_record = self._candidate_record(request)
        verdicts = required_mismatches(request.rubric, stored, candidate_record, self.text_encoder())
        shortlist.filtered = {ref.ref_id: f for ref, f in zip(refs, verdicts) if f is not None}
        shortlist.counts["filtered"] = len(shortlist.filtered)
        return candidate_record

    def rerank(self, request: _Request, shortlist: _Shortlist, survivors: list[Reference]) -> list[Reference]:
        """Score ``survivors`` with the reranker; the ``top_k`` best, best first (ties keep recall order)."""
        query = RerankQuery(image=request.image, criteria=tuple(request.rubric.texts), text=request.text, mode=request.mode)
        scores = self._reranker(request).score(query, survivors)
        shortlist.rerank_scores = {ref.ref_id: round(s, 6) for ref, s in zip(survivors, scores)}
        shortlist.counts["reranked"] = len(survivors)
        shortlist.stage.update({ref.ref_id: "reranked" for ref in survivors})
        order = sorted(range(len(survivors)), key=lambda i: -scores[i])  # stable: recall order breaks ties
        return [survivors[i] for i in order[: request.options.top_k]]

    def judge(
        self, request: _Request, finalists: list[Reference], served: list[ServedImage], records: list[Any],
        candidate: ModelImage, candidate_record: dict[str, Any] | None,
    ) -> tuple[list[dict[str, Any]], int]:
        """Criterion-by-criterion verdicts on each finalist: its rows and the VLM requests sent."""
        options = request.options
        extra = {} if options.evidence_max_chars is None else {"evidence_max_chars": options.evidence_max_chars}
        judge = Judge(
            request.context.backend(), force_vlm=options.force_vlm, prefix_cache=self.prefixes.for_request(request.context),
            **extra,
        )
        results = judge.judge(
            [(ref.ref_id, s.item, record) for ref, s, record in zip(finalists, served, records)],
            candidate, request.rubric, candidate_attrs=candidate_record,
        )
        rows = [{**r.to_dict(), "reference_cached": s.cached, "stage": "judged"} for r, s in zip(results, served)]
        return rows, judge.vlm_calls

    # -- the steps between -----------------------------------------------------------------
    def _request(self, context: RequestContext, options: CompareRequest) -> _Request:
        candidate = options.candidate
        image = load_image(candidate, limits=self.limits)
        return _Request(
            context=context, options=options, image=image, text=recall_text(options.rubric.texts, options.query),
        )

    def _shortlist(self, request: _Request, found: SearchResult | None) -> _Shortlist:
        ref_ids = list(request.options.ref_ids) if found is None else found.ref_ids
        if not ref_ids:
            raise InvalidInputError("references", "no reference to compare with: recall found none")
        shortlist = _Shortlist(refs=[self.book.get(r, namespace=request.context.namespace) for r in ref_ids])
        shortlist.stage = {ref.ref_id: "recalled" for ref in shortlist.refs}
        if found is not None:
            shortlist.recalled = [hit.to_dict() for hit in found.hits]
            shortlist.recall_scores = {hit.ref_id: hit.score for hit in found.hits}
            shortlist.counts["recalled"] = len(shortlist.refs)
        return shortlist

    def _judge_finalists(
        self, request: _Request, shortlist: _Shortlist, finalists: list[Reference], candidate_record: dict[str, Any] | None,
        timer: StageTimer,
    ) -> tuple[list[dict[str, Any]], int]:
        context = request.context
        with timer("candidate_encode"):  # encoded once (memory only), shared by every reference's request
            candidate = self.packages.served_candidate(context, request.image).item
        with timer("reference_load"):
            served = [self.packages.served_reference(context, ref) for ref in finalists]
        records: list[Any] = [None] * len(finalists)
        if request.sources:
            with timer("attributes"):
                records, candidate_record = self.attribute_records.records(
                    [(ref.image_sha256, s.item, partial(self.book.image, ref)) for ref, s in zip(finalists, served)],
                    request.image, candidate, request.sources, context.backend(), context.scope,
                )
        with timer("judge"):
            rows, vlm_calls = self.judge(request, finalists, served, records, candidate, candidate_record)
        shortlist.counts["judged"] = len(finalists)
        return rows, vlm_calls

    def _rows(self, shortlist: _Shortlist, judged: list[dict[str, Any]]) -> list[dict[str, Any]]:
        rows = {row["ref_id"]: row for row in judged}
        for ref in shortlist.refs:
            if ref.ref_id not in rows:
                rows[ref.ref_id] = other_row(ref.ref_id, shortlist.stage[ref.ref_id], shortlist.filtered.get(ref.ref_id))
        for row in rows.values():
            row["recall_score"] = shortlist.recall_scores.get(row["ref_id"])
            row["rerank_score"] = shortlist.rerank_scores.get(row["ref_id"])
        return sort_results([rows[ref.ref_id] for ref in shortlist.refs])

    def _candidate_record(self, request: _Request) -> dict[str, Any]:
        """The candidate's attribute record for the prefilter (memory LRU; never stored)."""
        context = request.context
        item = self.packages.served_candidate(context, request.image).item if "vlm" in request.sources else request.image
        _, record = self.attribute_records.records([], request.image, item, request.sources, context.backend(),
                                                   context.scope)
        return record

    def _reranker(self, request: _Request) -> Reranker:
        reranker = request.options.reranker
        if not isinstance(reranker, str):  # the request let only a scorer through
            return reranker
        if reranker == "embedding":
            # The tenant's own cached vectors: timing never reveals another tenant's images.
            vectors = partial(self.retrieval.reference_vectors, scope=request.context.scope)
            return EmbeddingReranker(self.retrieval.embedder(), vectors)
        return VlmReranker(request.context, self.packages)


def _minilm() -> Any:
    from ..embedders import load_minilm

    return load_minilm()
