"""The attribute prefilter: drop references that the attribute records settle as a *required* mismatch.

A required criterion that is a mismatch makes a reference's score 0 whatever else the VLM
says (:func:`~refsight.judge.verdict.score_verdicts`), so when the attribute records already
settle it there is no point in reranking or judging that reference. Only required criteria
are looked at, with the judge's own conservative :func:`~refsight.judge.settling.settle_criteria`;
the settled verdicts are returned so the result can say why a reference was dropped.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .settling import SettleThresholds, settle_criteria
from ..inputs.rubric import Rubric
from .verdict import CriterionVerdict

__all__ = ["Filtered", "required_mismatches"]


@dataclass(frozen=True)
class Filtered:
    """Why one reference was dropped: the required criteria settled as mismatches (their verdicts)."""

    verdicts: tuple[CriterionVerdict, ...]

    @property
    def criteria(self) -> list[str]:
        """The texts of the criteria that dropped the reference."""
        return [v.criterion for v in self.verdicts]


def required_mismatches(
    rubric: Rubric,
    reference_records: Sequence[Mapping[str, Any] | None],
    candidate_record: Mapping[str, Any] | None,
    text_encoder: Any,
    *,
    thresholds: SettleThresholds = SettleThresholds(),
) -> list[Filtered | None]:
    """Per reference: a :class:`Filtered` when a required criterion settles as a mismatch, else None."""
    required = [c for c in rubric.criteria if c.required]
    if not required or not candidate_record or text_encoder is None:
        return [None] * len(reference_records)
    out: list[Filtered | None] = []
    for record in reference_records:
        settled = settle_criteria(required, record, candidate_record, text_encoder, thresholds=thresholds)
        misses = tuple(v for v in settled if v is not None and v.verdict == "mismatch")
        out.append(Filtered(misses) if misses else None)
    return out
