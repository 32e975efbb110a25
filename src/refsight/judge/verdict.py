"""Per-criterion verdicts: the JSON schema the model must fill, its validation, and the score.

The model answers ``{"criteria": [{"criterion", "verdict", "confidence", "evidence"}, ...]}``
with exactly the rubric's criteria, in order (fixed ``prefixItems`` whose ``criterion``
is a ``const``). Every string is bounded, and ``confidence`` is a number in [0, 1], so
the schema's output has a known maximum size (:func:`token_budget`): a constrained
generation of that many tokens always completes.

Constrained decoding writes bounded strings without escapes (see
:mod:`refsight.backends.hf.constrained`), so one character of ``evidence`` is one code
point of at most 4 UTF-8 bytes, which keeps the budget tight.

The score is computed here, never asked of the model (:func:`score_verdicts`).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any, Sequence

from ..errors import RefsightError
from ..results import FieldRecord
from ..inputs.rubric import Criterion

__all__ = [
    "VERDICTS",
    "CriterionVerdict",
    "VerdictParseError",
    "verdict_schema",
    "parse_verdicts",
    "uncertain_verdicts",
    "score_verdicts",
    "token_budget",
    "extract_json",
    "DEFAULT_EVIDENCE_CHARS",
]

VERDICTS = ("match", "mismatch", "uncertain")
#: Default bound on the model's evidence text per criterion.
DEFAULT_EVIDENCE_CHARS = 160
_CONFIDENCE_CHARS = 8  # "0.123456": the longest number xgrammar emits for a [0, 1] range


class VerdictParseError(RefsightError, ValueError):
    """A model's answer is not valid verdict JSON; ``text`` is the answer, ``reason`` says why."""

    def __init__(self, text: str, reason: str) -> None:
        self.text = text
        self.reason = reason
        super().__init__(f"invalid verdict JSON: {reason}")


@dataclass(frozen=True)
class CriterionVerdict(FieldRecord):
    """One criterion's answer; ``source`` is ``"vlm"`` or ``"attributes"``; ``to_dict()`` gives
    ``{"criterion", "verdict", "confidence", "evidence", "source"}``."""

    criterion: str
    verdict: str
    confidence: float
    evidence: str
    source: str = "vlm"


def verdict_schema(criteria: Sequence[Criterion], *, evidence_max_chars: int = DEFAULT_EVIDENCE_CHARS) -> dict:
    """The JSON schema (draft 2020-12) of the answer for exactly these criteria, in order."""
    if not criteria:
        raise ValueError("verdict_schema needs at least one criterion")
    if evidence_max_chars < 0:
        raise ValueError(f"evidence_max_chars must be >= 0, not {evidence_max_chars}")
    evidence = {"type": "string", "maxLength": evidence_max_chars}
    items = [
        {
            "type": "object",
            "properties": {
                "criterion": {"type": "string", "const": c.text},
                "verdict": {"type": "string", "enum": list(VERDICTS)},
                "confidence": {"type": "number", "minimum": 0, "maximum": 1},
                "evidence": evidence,
            },
            "required": ["criterion", "verdict", "confidence", "evidence"],
            "additionalProperties": False,
        }
        for c in criteria
    ]
    n = len(items)
    return {
        "type": "object",
        "properties": {
            "criteria": {"type": "array", "prefixItems": items, "items": False, "minItems": n, "maxItems": n}
        },
        "required": ["criteria"],
        "additionalProperties": False,
    }


def token_budget(criteria: Sequence[Criterion], *, evidence_max_chars: int = DEFAULT_EVIDENCE_CHARS) -> int:
    """An upper bound on the tokens of any schema-valid answer, plus the stop token.

    Counted in UTF-8 bytes of the longest constrained answer (xgrammar's ``", "`` and
    ``": "`` separators, no escapes in evidence, at most 4 bytes per character): a
    byte-level tokenizer never spends more than one token per byte. Sizing
    ``max_new_tokens`` to this makes truncation impossible.
    """
    worst_entry = {
        "criterion": "",
        "verdict": "uncertain",
        "confidence": 0.123456,
        "evidence": "",
    }
    skeleton = len(json.dumps(worst_entry).encode())  # ", " and ": " separators
    total = len(json.dumps({"criteria": []}).encode())
    for c in criteria:
        # Whichever way the grammar spells the const (raw UTF-8 or \\u escapes), take the longer.
        criterion_bytes = max(len(json.dumps(c.text, ensure_ascii=a).encode()) for a in (True, False)) - 2
        total += skeleton + criterion_bytes + 4 * evidence_max_chars + 2  # 2 = ", " between entries
    return total + 1


def extract_json(text: str) -> Any:
    """The first JSON object in ``text`` (tolerating prose or a ```json fence around it).

    Raises :class:`VerdictParseError` when there is none.
    """
    start = text.find("{")
    if start < 0:
        raise VerdictParseError(text, "no JSON object in the answer")
    decoder = json.JSONDecoder()
    try:
        value, _ = decoder.raw_decode(text, start)
    except json.JSONDecodeError as e:
        raise VerdictParseError(text, f"malformed JSON at character {e.pos}: {e.msg}") from None
    except RecursionError:
        raise VerdictParseError(text, "JSON nested too deeply") from None
    return value


def parse_verdicts(text: str, criteria: Sequence[Criterion], schema: dict | None = None) -> list[CriterionVerdict]:
    """Parse and validate a model's answer for ``criteria``; raises :class:`VerdictParseError`.

    ``schema`` defaults to :func:`verdict_schema` of the criteria (pass the one the
    generation used when its ``evidence_max_chars`` differs).
    """
    import jsonschema

    schema = schema if schema is not None else verdict_schema(criteria)
    data = extract_json(text)
    validator = jsonschema.Draft202012Validator(schema)
    error = jsonschema.exceptions.best_match(validator.iter_errors(data))
    if error is not None:
        path = "/".join(str(p) for p in error.absolute_path) or "(root)"
        raise VerdictParseError(text, f"schema violation at {path}: {_short(error.message)}")
    verdicts = []
    for c, entry in zip(criteria, data["criteria"]):
        confidence = float(entry["confidence"])
        if not math.isfinite(confidence):  # pragma: no cover - the schema already bounds it
            raise VerdictParseError(text, f"confidence of {c.text!r} is not finite")
        verdicts.append(
            CriterionVerdict(c.text, entry["verdict"], confidence, entry["evidence"], source="vlm")
        )
    return verdicts


def uncertain_verdicts(criteria: Sequence[Criterion], reason: str, *, max_chars: int = DEFAULT_EVIDENCE_CHARS) -> list[CriterionVerdict]:
    """Every criterion as ``"uncertain"`` with confidence 0 and ``reason`` as evidence (no invented verdicts)."""
    evidence = _short(reason, max_chars)
    return [CriterionVerdict(c.text, "uncertain", 0.0, evidence, source="vlm") for c in criteria]


def score_verdicts(criteria: Sequence[Criterion], verdicts: Sequence[CriterionVerdict]) -> float:
    """Weighted fraction of criteria judged ``"match"``, in [0, 1].

    ``"uncertain"`` counts as not matched: it stays in the denominator, so doubt never
    raises a score. A ``"mismatch"`` on a ``required`` criterion makes the score 0
    (an uncertain required criterion does not). Verdicts pair with criteria by text.
    """
    by_text = {v.criterion: v.verdict for v in verdicts}
    missing = [c.text for c in criteria if c.text not in by_text]
    if missing:
        raise ValueError(f"no verdict for criteria {missing}")
    if any(c.required and by_text[c.text] == "mismatch" for c in criteria):
        return 0.0
    total = sum(c.weight for c in criteria)
    matched = sum(c.weight for c in criteria if by_text[c.text] == "match")
    return round(matched / total, 6) if total > 0 else 0.0


_CONTROL = re.compile(r"[\x00-\x1f]+")


def _short(text: str, limit: int = 200) -> str:
    text = _CONTROL.sub(" ", text).replace('"', "'").replace("\\", "/")
    return text if len(text) <= limit else text[: max(0, limit - 3)] + "..."
