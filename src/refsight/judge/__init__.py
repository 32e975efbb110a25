"""Criteria-driven judging: rubric → criteria → prompt (references first) → schema-valid verdicts.

- :mod:`.criteria` parses rubrics (free text, JSON, YAML) into :class:`Rubric`.
- :mod:`.prompts` lays out the request: references, candidate, criteria, instructions.
- :mod:`.verdict` holds the verdict JSON schema, validation and the score.
- :mod:`.attributes` is the attribute sidecar (VLM records, ImageNet labels, store, settling).
- :mod:`.judge` ties them together in :class:`Judge`.

Nothing here imports torch at import time; models load when first used.
"""

from .attributes import (
    AttributeSchema,
    AttributeSource,
    AttributeSpec,
    AttributeStore,
    ImageNetAttributeSource,
    SettleThresholds,
    VlmAttributeSource,
    merge_records,
    settle_criteria,
)
from .criteria import Criterion, Rubric, parse_rubric
from .judge import Judge, JudgeReference, ReferenceResult
from .prompts import build_judge_request, reference_prefix
from .verdict import (
    VERDICTS,
    CriterionVerdict,
    VerdictParseError,
    parse_verdicts,
    score_verdicts,
    token_budget,
    uncertain_verdicts,
    verdict_schema,
)

__all__ = [
    "AttributeSchema",
    "AttributeSource",
    "AttributeSpec",
    "AttributeStore",
    "ImageNetAttributeSource",
    "SettleThresholds",
    "VlmAttributeSource",
    "merge_records",
    "settle_criteria",
    "Criterion",
    "Rubric",
    "parse_rubric",
    "Judge",
    "JudgeReference",
    "ReferenceResult",
    "build_judge_request",
    "reference_prefix",
    "VERDICTS",
    "CriterionVerdict",
    "VerdictParseError",
    "parse_verdicts",
    "score_verdicts",
    "token_budget",
    "uncertain_verdicts",
    "verdict_schema",
]
