"""Criteria-driven judging: rubric → criteria → prompt (references first) → schema-valid verdicts.

- :mod:`refsight.inputs.rubric` (on the ground floor, beside the requests) parses rubrics (free text, JSON, YAML) into
  :class:`~refsight.inputs.rubric.Rubric`.
- :mod:`.prompts` lays out the request: references, candidate, criteria, instructions.
- :mod:`.verdict` holds the verdict JSON schema, validation and the score.
- attribute records, structured facts about each image: :mod:`.attribute_schema` (what a VLM
  fills), :mod:`.attribute_sources` (the VLM and ImageNet sources), :mod:`.attribute_store`
  (SQLite), :mod:`.attribute_records` (what the pipelines hold), :mod:`.settling` (criteria the
  records answer) and :mod:`.prefilter` (required mismatches dropped before any VLM work).
- :mod:`.judge` ties them together in :class:`Judge`.

Nothing here imports torch at import time; models load when first used.
"""

from .attribute_records import AttributeRecords
from .attribute_schema import AttributeSchema, AttributeSpec, load_attribute_schema
from .attribute_sources import AttributeSource, ImageNetAttributeSource, VlmAttributeSource, merge_records
from .attribute_store import AttributeStore
from .judge import Judge, JudgeReference, ReferenceResult
from .prompts import build_judge_request, reference_prefix
from .settling import SettleThresholds, settle_criteria
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
    "AttributeRecords",
    "AttributeSchema",
    "AttributeSource",
    "AttributeSpec",
    "AttributeStore",
    "load_attribute_schema",
    "ImageNetAttributeSource",
    "SettleThresholds",
    "VlmAttributeSource",
    "merge_records",
    "settle_criteria",
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
