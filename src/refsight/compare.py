"""The compare pipeline: recall → attribute prefilter → rerank → judge, each stage timed and counted.

:func:`run_compare` is what :meth:`refsight.Engine.compare` runs. The stages:

1. **recall** (with ``top_k``): the store index returns ``recall_k or rerank or top_k`` references for the
   query vector built from the candidate image and/or the recall text
   (:mod:`refsight.retrieval.query`); without ``top_k`` the given ``ref_ids`` are the shortlist.
2. **prefilter**: references whose *stored* attribute records settle a required criterion as a
   mismatch are dropped (``stage: "filtered"``, ``filtered_by``) before any VLM work
   (:mod:`refsight.judge.prefilter`).
3. **rerank** (with ``rerank``): a :class:`~refsight.rerank.Reranker` scores the best ``rerank``
   survivors (by recall score) and the ``top_k`` best go on; the rest are reported with
   ``stage: "reranked"`` (and survivors beyond ``rerank``, or beyond ``top_k`` without a
   reranker, with ``stage: "recalled"``).
4. **judge**: criterion-by-criterion verdicts (:class:`~refsight.judge.Judge`) for the finalists.

Results are sorted: judged references by score (ties by rerank score, then recall score),
then reranked-only ones by rerank score, then filtered ones. ``stages`` counts the
references each stage took in; ``timings_ms`` times every stage.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from .context import RequestContext
from .errors import InvalidInputError
from .images import ImageSource, load_image
from .references import source_label
from .rerank import EmbeddingReranker, Reranker, RerankQuery, VlmReranker
from .results import CompareResult
from .retrieval.query import check_recall_mode, query_vector, recall_text
from .timing import StageTimer

if TYPE_CHECKING:  # pragma: no cover
    from .engine import Engine

__all__ = ["CompareOptions", "STAGES", "run_compare", "sort_results"]

#: The stage a result reached, furthest last (``filtered`` is reported, never silent).
STAGES = ("filtered", "recalled", "reranked", "judged")
_ORDER = {"judged": 0, "reranked": 1, "recalled": 2, "filtered": 3}


@dataclass(frozen=True)
class CompareOptions:
    """The knobs of one compare (see :meth:`refsight.Engine.compare`)."""

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

    def check(self) -> None:
        """Raise InvalidInputError for counts that cannot work together."""
        for name in ("top_k", "rerank", "recall_k"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1000):
                raise InvalidInputError(name, f"must be an integer in 1..1000, not {value!r}")
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


def run_compare(engine: Engine, context: RequestContext, candidate: ImageSource, options: CompareOptions) -> CompareResult:
    """Run the pipeline for one candidate (see the module docstring)."""
    from .judge import Judge, parse_rubric
    from .judge.prefilter import required_mismatches
    from .judge.attribute_records import check_sources

    rubric = parse_rubric(options.criteria)  # a bad rubric fails before any model work
    attributes = check_sources(options.attributes)
    options.check()
    mode = check_recall_mode(options.recall, query=options.query)
    backend, scope, namespace = context.backend, context.scope, context.namespace
    timer = StageTimer()
    image = load_image(candidate, limits=engine.limits, name=source_label(candidate))
    text = recall_text(rubric.texts, options.query)
    recall_scores: dict[str, float] = {}
    ref_ids = list(options.ref_ids)
    recalled: list[dict[str, Any]] = []
    if options.top_k is not None:
        with timer("recall"):
            vector = query_vector(engine.retrieval.embedder(), image=image, text=text, mode=mode)
            found = engine.retrieval.search(
                text=None, image=None, vector=vector, k=options.recall_k or options.rerank or options.top_k, namespace=namespace,
                restrict_to=ref_ids or None,
            )
        recalled, ref_ids = [hit.to_dict() for hit in found.hits], found.ref_ids
        recall_scores = {hit.ref_id: hit.score for hit in found.hits}
    if not ref_ids:
        raise InvalidInputError("references", "no reference to compare with: give reference ids, or recall them with top_k")
    refs = [engine.reference(r, namespace=namespace) for r in ref_ids]
    stage = {ref.ref_id: "recalled" for ref in refs}
    stages = {"recalled": len(refs) if options.top_k is not None else 0, "filtered": 0, "reranked": 0, "judged": 0}

    settle = bool(attributes) and not options.force_vlm
    records = engine.attribute_records if settle else None
    candidate_attrs = None
    filtered: dict[str, Any] = {}
    if records is not None and any(c.required for c in rubric.criteria):
        with timer("prefilter"):
            stored = records.stored([(ref.image_sha256, scope) for ref in refs], attributes, backend)
            if any(stored):
                candidate_attrs = _candidate_record(engine, records, context, image, attributes)
                verdicts = required_mismatches(rubric, stored, candidate_attrs, _text_encoder())
                filtered = {ref.ref_id: f for ref, f in zip(refs, verdicts) if f is not None}
        stages["filtered"] = len(filtered)
    survivors = [ref for ref in refs if ref.ref_id not in filtered]

    rerank_scores: dict[str, float] = {}
    finalists = survivors[: options.top_k] if options.rerank is None and options.recall_k else survivors
    if options.rerank is not None and survivors:
        survivors = survivors[: options.rerank]  # recall order: the best by recall score go on
        reranker = _reranker(engine, options, context)
        query = RerankQuery(image=image, criteria=tuple(rubric.texts), text=text, mode=mode)
        with timer("rerank"):
            scores = reranker.score(query, survivors)
        rerank_scores = {ref.ref_id: round(s, 6) for ref, s in zip(survivors, scores)}
        stages["reranked"] = len(survivors)
        order = sorted(range(len(survivors)), key=lambda i: -scores[i])  # stable: recall order breaks ties
        finalists = [survivors[i] for i in order[: options.top_k]]
        for ref in survivors:
            stage[ref.ref_id] = "reranked"

    judged: list[dict[str, Any]] = []
    vlm_calls = 0
    if finalists:
        with timer("candidate_encode"):  # encoded once (memory only), shared by every reference's request
            candidate_visual = engine.packages.model_image(context, image).item
        with timer("reference_load"):
            visuals = [engine.packages.model_image(context, ref) for ref in finalists]
        inputs = [v.item for v in visuals]
        ref_attrs: list[Any] = [None] * len(finalists)
        if records is not None:
            with timer("attributes"):
                ref_attrs, candidate_attrs = records.records(
                    [(ref.image_sha256, item, partial(engine.reference_image, ref)) for ref, item in zip(finalists, inputs)],
                    image, candidate_visual, attributes, backend,
                )
        extra = {} if options.evidence_max_chars is None else {"evidence_max_chars": options.evidence_max_chars}
        judge = Judge(backend, force_vlm=options.force_vlm, prefix_cache=engine.prefixes.for_request(context), **extra)
        with timer("judge"):
            results = judge.judge(
                [(ref.ref_id, item, attrs) for ref, item, attrs in zip(finalists, inputs, ref_attrs)],
                candidate_visual, rubric, candidate_attrs=candidate_attrs,
            )
        vlm_calls = judge.vlm_calls
        stages["judged"] = len(finalists)
        judged = [{**r.to_dict(), "reference_cached": v.cached, "stage": "judged"} for r, v in zip(results, visuals)]

    rows = {row["ref_id"]: row for row in judged}
    for ref in refs:
        if ref.ref_id in rows:
            continue
        if ref.ref_id in filtered:
            why = filtered[ref.ref_id]
            rows[ref.ref_id] = {
                "ref_id": ref.ref_id, "score": 0.0, "criteria": [v.to_dict() for v in why.verdicts],
                "stage": "filtered", "filtered_by": why.criteria,
            }
        else:
            rows[ref.ref_id] = {"ref_id": ref.ref_id, "score": None, "criteria": [], "stage": stage[ref.ref_id]}
    for row in rows.values():
        row["recall_score"] = recall_scores.get(row["ref_id"])
        row["rerank_score"] = rerank_scores.get(row["ref_id"])
    return CompareResult(
        candidate_sha256=image.sha256,
        model=backend.name,
        random_weights=bool(backend.random_weights),
        results=sort_results([rows[ref.ref_id] for ref in refs]),
        timings_ms=timer.done(),
        recalled=recalled,
        vlm_calls=vlm_calls,
        stages=stages,
    )


def sort_results(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Judged by score (ties: rerank score, then recall score), then reranked-only, recalled-only, filtered."""

    def key(row: dict[str, Any]) -> tuple:
        def neg(name: str) -> float:
            value = row.get(name)
            return -value if value is not None else float("inf")

        return (_ORDER[row["stage"]], neg("score"), neg("rerank_score"), neg("recall_score"))

    return sorted(rows, key=key)  # stable: equal keys keep the shortlist's order


def _candidate_record(engine, records, context, image, attributes) -> dict[str, Any]:
    """The candidate's attribute record for the prefilter (memory LRU; never stored)."""
    visual = engine.packages.model_image(context, image).item if "vlm" in attributes else image
    _, record = records.records([], image, visual, attributes, context.backend)
    return record


def _text_encoder() -> Any:
    from .models import load_minilm

    return load_minilm()


def _reranker(engine: Engine, options: CompareOptions, context: RequestContext) -> Reranker:
    if isinstance(options.reranker, Reranker):
        return options.reranker
    if options.reranker == "embedding":
        return EmbeddingReranker(engine.retrieval.embedder(), engine.retrieval.reference_vectors)
    return VlmReranker(context, engine.packages)
