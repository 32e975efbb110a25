"""The judge: rubric → criteria → attribute settling → one VLM call per reference → scored verdicts.

For each reference, the criteria its attribute records can settle are answered from
them (``"source": "attributes"``); the rest are put to the VLM in one prompt
(references first, see :mod:`.prompts`). A backend that supports constrained decoding
gets the verdict schema and, with ``max_new_tokens`` at the schema's token budget,
always answers valid JSON. Any answer is parsed and validated all the same; an invalid
one is retried once (the retry prompt says what was wrong), after which its criteria
become ``"uncertain"`` with the reason as evidence. The score is refsight's, from the
verdicts and weights (:func:`.verdict.score_verdicts`).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from ..backends.base import Backend
from ..requests import GenerationRequest
from ..backends.prefix import PrefixCache
from ..errors import InvalidInputError, ModelLoadError
from ..inputs.images import ImageInput
from ..package import VisualPackage
from ..cache.packages import ModelImage
from .attribute_sources import AttributeSource, ImageNetAttributeSource, merge_records
from .batches import generate_texts
from ..inputs.rubric import Criterion, Rubric, parse_rubric
from .prompts import build_judge_request
from .settling import SettleThresholds, settle_criteria
from .verdict import DEFAULT_EVIDENCE_CHARS, CriterionVerdict, VerdictParseError, parse_verdicts, score_verdicts
from .verdict import token_budget, uncertain_verdicts, verdict_schema

__all__ = ["Judge", "ReferenceResult", "JudgeReference"]

#: ``(ref_id, package or image, attribute record or None)``
JudgeReference = tuple[str, ModelImage, "Mapping[str, Any] | None"]

#: Extra tokens for a free-form (unconstrained) answer: code fences, a short preamble.
_FREE_FORM_SLACK = 64


@dataclass
class ReferenceResult:
    """The verdicts on one reference, in rubric order, and the score refsight computed from them."""

    ref_id: str
    score: float
    criteria: list[CriterionVerdict]
    #: VLM requests sent for this reference (0 when attributes settled everything, 2 after a retry)
    vlm_requests: int = 0

    def to_dict(self) -> dict[str, Any]:
        """``{"ref_id", "score", "criteria": [{"criterion", "verdict", "confidence", "evidence", "source"}]}``."""
        return {"ref_id": self.ref_id, "score": self.score, "criteria": [v.to_dict() for v in self.criteria]}


@dataclass
class _Pending:
    index: int  # position in the references list
    visual: ModelImage
    criteria: list[Criterion]
    schema: dict  # validated against, and passed to the backend when it can constrain
    constrained: bool
    reason: str | None = None
    verdicts: list[CriterionVerdict] | None = field(default=None)


class Judge:
    """Judges a candidate against references under a rubric with one backend.

    ``attribute_sources`` fill missing attribute records (the engine normally passes
    stored ones); ``force_vlm`` sends every criterion to the VLM; ``max_new_tokens``
    caps generation (default: the schema's token budget, which never truncates);
    ``text_encoder`` matches criteria to attributes (default: all-MiniLM-L6-v2, loaded
    only when there are records to match). ``prefix_cache`` (a
    :class:`~refsight.backends.prefix.PrefixCache`) lets the backend reuse its state after the
    reference prefix across rubrics and candidates. ``vlm_calls`` counts generation requests sent.
    """

    def __init__(
        self,
        backend: Backend,
        *,
        attribute_sources: Sequence[AttributeSource] = (),
        force_vlm: bool = False,
        max_new_tokens: int | None = None,
        text_encoder: Any = None,
        evidence_max_chars: int = DEFAULT_EVIDENCE_CHARS,
        thresholds: SettleThresholds = SettleThresholds(),
        prefix_cache: PrefixCache | None = None,
    ) -> None:
        if max_new_tokens is not None and (not isinstance(max_new_tokens, int) or max_new_tokens < 1):
            raise InvalidInputError("max_new_tokens", f"must be a positive integer, not {max_new_tokens!r}")
        if not isinstance(evidence_max_chars, int) or not 1 <= evidence_max_chars <= 1000:
            raise InvalidInputError("evidence_max_chars", f"must be an integer in 1..1000, not {evidence_max_chars!r}")
        self.backend = backend
        self.attribute_sources = tuple(attribute_sources)
        self.force_vlm = force_vlm
        self.max_new_tokens = max_new_tokens
        self.evidence_max_chars = evidence_max_chars
        self.thresholds = thresholds
        self.prefix_cache = prefix_cache
        self._text_encoder = text_encoder
        self._encoder_failed = False
        #: generation requests sent (first tries and retries)
        self.vlm_calls = 0
        #: of which retries after an invalid answer
        self.vlm_retries = 0

    # -- attributes ------------------------------------------------------------------------------
    def attributes_for(self, items: Sequence[ModelImage]) -> list[dict[str, Any] | None]:
        """Records from this judge's sources (no store); ImageNet skips packages, which have no pixels."""
        merged: list[list[dict[str, Any]]] = [[] for _ in items]
        for source in self.attribute_sources:
            usable = [
                i for i, item in enumerate(items)
                if not (isinstance(source, ImageNetAttributeSource) and not isinstance(item, ImageInput))
            ]
            if not usable:
                continue
            for i, record in zip(usable, source.compute([items[i] for i in usable])):
                merged[i].append(record)
        return [merge_records(*records) if records else None for records in merged]

    def _encoder(self) -> Any:
        if self._text_encoder is None and not self._encoder_failed:
            try:
                from ..embedders import load_minilm

                self._text_encoder = load_minilm()
            except (ModelLoadError, ImportError) as e:
                # Without the text model nothing can be matched: every criterion goes to the VLM.
                self._encoder_failed = True
                warnings.warn(f"attribute settling disabled, text encoder unavailable: {e}", stacklevel=3)
        return self._text_encoder

    # -- judging ---------------------------------------------------------------------------------
    def judge(
        self,
        references: Sequence[JudgeReference | tuple[str, ModelImage]],
        candidate: ModelImage,
        rubric: Rubric | str | Sequence[Any] | Mapping[str, Any],
        candidate_attrs: Mapping[str, Any] | None = None,
    ) -> list[ReferenceResult]:
        """Verdicts per reference, in the order given; ``rubric`` may also be raw text or data."""
        rubric = rubric if isinstance(rubric, Rubric) else parse_rubric(rubric)
        refs = self._check_references(references)
        if not isinstance(candidate, (VisualPackage, ImageInput)):
            raise InvalidInputError("candidate", f"must be a VisualPackage or an ImageInput, not {type(candidate).__name__}")

        if self.attribute_sources and not self.force_vlm:
            candidate_attrs = self._fill_attributes(refs, candidate, candidate_attrs)
        settled = self._settle(rubric, refs, candidate_attrs)
        pending = self._pending(rubric, refs, settled)
        requests_per_ref = [0] * len(refs)
        self._run(pending, candidate, requests_per_ref)
        return _results(rubric, refs, settled, pending, requests_per_ref)

    def _pending(
        self, rubric: Rubric, refs: list[JudgeReference], settled: list[list[CriterionVerdict | None]]
    ) -> list[_Pending]:
        """One VLM request per reference with criteria the attribute records did not settle."""
        return [
            _Pending(
                index=i, visual=visual, criteria=todo, schema=verdict_schema(todo, evidence_max_chars=self.evidence_max_chars),
                constrained=self.backend.supports_constrained_decoding,
            )
            for i, ((_, visual, _), answers) in enumerate(zip(refs, settled))
            if (todo := [c for c, a in zip(rubric.criteria, answers) if a is None])
        ]

    def _fill_attributes(
        self, refs: list[JudgeReference], candidate: ModelImage, candidate_attrs: Mapping[str, Any] | None
    ) -> Mapping[str, Any] | None:
        """Compute the records the caller did not pass (``refs`` in place); the candidate's record."""
        missing = [i for i, (_, _, attrs) in enumerate(refs) if attrs is None]
        items = [refs[i][1] for i in missing] + ([candidate] if candidate_attrs is None else [])
        computed = self.attributes_for(items) if items else []
        for i, record in zip(missing, computed):
            refs[i] = (refs[i][0], refs[i][1], record)
        if candidate_attrs is None and computed:
            candidate_attrs = computed[-1]
        return candidate_attrs

    def _settle(
        self, rubric: Rubric, refs: list[JudgeReference], candidate_attrs: Mapping[str, Any] | None
    ) -> list[list[CriterionVerdict | None]]:
        """Per reference, each criterion's verdict from the attribute records, or None for the VLM."""
        can_settle = not self.force_vlm and candidate_attrs and any(attrs for _, _, attrs in refs)
        encoder = self._encoder() if can_settle else None
        if encoder is None:
            return [[None] * len(rubric) for _ in refs]
        return [
            settle_criteria(rubric.criteria, attrs, candidate_attrs, encoder, force_vlm=self.force_vlm, thresholds=self.thresholds)
            for _, _, attrs in refs
        ]

    def _check_references(self, references: Any) -> list[JudgeReference]:
        if isinstance(references, (str, bytes)) or not isinstance(references, Sequence) or not references:
            raise InvalidInputError("references", "give at least one (ref_id, package or image, attributes) tuple")
        seen: set[str] = set()
        return [_reference(n, entry, seen) for n, entry in enumerate(references)]

    def _request(self, p: _Pending, candidate: ModelImage) -> GenerationRequest:
        budget = token_budget(p.criteria, evidence_max_chars=self.evidence_max_chars)
        if not p.constrained:
            budget += _FREE_FORM_SLACK
        if self.max_new_tokens is not None:
            budget = min(budget, self.max_new_tokens)
        return build_judge_request(
            [p.visual],
            candidate,
            p.criteria,
            evidence_max_chars=self.evidence_max_chars,
            max_new_tokens=budget,
            json_schema=p.schema if p.constrained else None,
            retry_reason=p.reason,
            prefix_cache=self.prefix_cache,
        )

    def _run(self, pending: list[_Pending], candidate: ModelImage, requests_per_ref: list[int]) -> None:
        todo = pending
        for attempt in range(2):  # the first try, then one retry told what was wrong
            if not todo:
                return
            texts = self._generate([self._request(p, candidate) for p in todo])
            for p in todo:
                requests_per_ref[p.index] += 1
            if attempt:
                self.vlm_retries += len(todo)
            failed = []
            for p, text in zip(todo, texts):
                try:
                    p.verdicts = parse_verdicts(text, p.criteria, p.schema)
                except VerdictParseError as e:
                    p.reason = e.reason
                    failed.append(p)
            todo = failed
        for p in todo:
            # Never invent a verdict: after the retry, say we do not know, and why.
            p.verdicts = uncertain_verdicts(
                p.criteria, f"no valid answer after a retry: {p.reason}", max_chars=self.evidence_max_chars
            )

    def _generate(self, requests: list[GenerationRequest]) -> list[str]:
        self.vlm_calls += len(requests)
        return generate_texts(self.backend, requests)


def _reference(n: int, entry: Any, seen: set[str]) -> JudgeReference:
    """``references[n]`` checked: a (ref_id, package or image[, attributes]) tuple, its ref_id not in ``seen``
    (added to it)."""
    if not isinstance(entry, tuple) or len(entry) not in (2, 3):
        raise InvalidInputError(f"references[{n}]", "must be a (ref_id, package or image, attributes) tuple")
    ref_id, visual, attrs = (*entry, None) if len(entry) == 2 else entry
    if not isinstance(ref_id, str) or not ref_id:
        raise InvalidInputError(f"references[{n}]", f"ref_id must be a non-empty string, not {ref_id!r}")
    if ref_id in seen:
        raise InvalidInputError(ref_id, "reference given twice")
    seen.add(ref_id)
    if not isinstance(visual, (VisualPackage, ImageInput)):
        raise InvalidInputError(ref_id, f"must be a VisualPackage or an ImageInput, not {type(visual).__name__}")
    if attrs is not None and not isinstance(attrs, Mapping):
        raise InvalidInputError(ref_id, f"attributes must be a mapping or None, not {type(attrs).__name__}")
    return ref_id, visual, attrs


def _results(
    rubric: Rubric, refs: list[JudgeReference], settled: list[list[CriterionVerdict | None]], pending: list[_Pending],
    requests_per_ref: list[int],
) -> list[ReferenceResult]:
    """Per reference, the settled verdicts with the VLM's filled in, in the rubric's order, and the score."""
    results = []
    by_index = {p.index: p for p in pending}
    for i, ((ref_id, _, _), answers) in enumerate(zip(refs, settled)):
        vlm = iter(by_index[i].verdicts or []) if i in by_index else iter(())
        verdicts = [a if a is not None else next(vlm) for a in answers]
        results.append(ReferenceResult(ref_id, score_verdicts(rubric.criteria, verdicts), verdicts, requests_per_ref[i]))
    return results
