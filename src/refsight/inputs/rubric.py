"""Rubric → criteria: what "similar" means for one request, parsed and checked.

A rubric is written by a person, so it is accepted in the forms people write:

- **free text**: one criterion per line (``-``, ``*``, ``•``, ``1.``, ``1)`` bullets
  are stripped), or a single line separated by semicolons, or, when a single line has
  no semicolon, by commas. Lines of a multi-line rubric are never split on commas
  ("white paws, like socks" stays one criterion).
- **JSON**: text starting with ``[`` or ``{``: a list of strings or of
  ``{"text", "weight", "required"}`` objects, or ``{"criteria": [...]}``.
- **YAML**: text starting with ``---`` or ``criteria:``, or whose first item is a
  ``- text:`` mapping (plain ``- item`` lists read the same as free text anyway).
- **data**: the same structures already decoded (a list or a dict), or a :class:`Rubric`.

Every problem raises :class:`~refsight.errors.RubricError` naming the rubric or the
criterion and the reason: an empty rubric, a duplicate criterion (compared without
case and extra spaces), a weight that is not a positive finite number, a ``required``
that is not a boolean, an unknown key, too many criteria or characters, a criterion
that is too long, malformed JSON or YAML.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidInputError, RubricError
from .jsonlimits import MAX_NODES, check_json_depth, json_nodes, load_yaml
from .text import check_text
from ..package import canonical_json

__all__ = [
    "MAX_CRITERIA",
    "MAX_CRITERION_CHARS",
    "MAX_RUBRIC_CHARS",
    "Criterion",
    "Rubric",
    "parse_rubric",
]

#: Default limits. They bound the prompt and the constrained output, whose token
#: budget grows with every criterion (each is echoed back in the verdict JSON).
MAX_CRITERIA = 32
MAX_RUBRIC_CHARS = 8000
MAX_CRITERION_CHARS = 300

_BULLET = re.compile(r"^\s*(?:[-*•‣◦·]|\(?\d{1,3}[.)](?=\s)|\(?[a-zA-Z]\)(?=\s))\s*")
_SPACES = re.compile(r"\s+")
_YAML_START = re.compile(r"^(?:---|criteria\s*:|-\s+text\s*:)", re.IGNORECASE)
_KEYS = {"text", "weight", "required"}


@dataclass(frozen=True)
class Criterion:
    """One thing to judge: its text, its weight in the score, and whether a mismatch fails all."""

    text: str
    weight: float = 1.0
    required: bool = False

    def to_dict(self) -> dict[str, Any]:
        """``{"text", "weight", "required"}``."""
        return {"text": self.text, "weight": self.weight, "required": self.required}


@dataclass(frozen=True)
class Rubric:
    """An ordered, validated tuple of :class:`Criterion` (build it with :func:`parse_rubric`)."""

    criteria: tuple[Criterion, ...]

    def __iter__(self) -> Iterator[Criterion]:
        return iter(self.criteria)

    def __len__(self) -> int:
        return len(self.criteria)

    def __getitem__(self, index: int) -> Criterion:
        return self.criteria[index]

    @property
    def texts(self) -> list[str]:
        """The criterion texts, in order."""
        return [c.text for c in self.criteria]

    def to_dict(self) -> dict[str, Any]:
        """``{"criteria": [{"text", "weight", "required"}, ...]}``; parses back to an equal rubric."""
        return {"criteria": [c.to_dict() for c in self.criteria]}

    @property
    def digest(self) -> str:
        """sha256 hex of the canonical JSON of the criteria (order, weights and flags included)."""
        return hashlib.sha256(canonical_json(self.to_dict()).encode()).hexdigest()


def parse_rubric(
    source: str | Sequence[Any] | dict[str, Any] | Rubric,
    *,
    max_criteria: int = MAX_CRITERIA,
    max_chars: int = MAX_RUBRIC_CHARS,
    max_criterion_chars: int = MAX_CRITERION_CHARS,
) -> Rubric:
    """Parse free text, JSON, YAML or decoded data into a :class:`Rubric`, or raise RubricError.

    ``max_chars`` bounds the raw text and the sum of criterion texts; ``max_criteria``
    the number of criteria; ``max_criterion_chars`` each criterion's text.
    """
    if isinstance(source, Rubric):
        items: list[Any] = [c.to_dict() for c in source.criteria]
    elif isinstance(source, str):
        if len(source) > max_chars:
            raise RubricError("rubric", f"{len(source)} characters, over the {max_chars}-character limit")
        items = _items_from_text(check_text(source, "rubric"))
    elif isinstance(source, (list, tuple, dict)):
        items = _items_from_data(source)
    else:
        raise RubricError(repr(source)[:80], f"a rubric must be text, a list or a mapping, not {type(source).__name__}")

    criteria = _criteria(items, max_criteria, max_chars, max_criterion_chars)
    seen: dict[str, int] = {}
    for i, c in enumerate(criteria, start=1):
        key = c.text.casefold()
        if key in seen:
            raise RubricError(
                f"criterion {i} ({c.text!r})", f"duplicate of criterion {seen[key]} (case and spacing are ignored)"
            )
        seen[key] = i
    return Rubric(tuple(criteria))


def _criteria(items: list[Any], max_criteria: int, max_chars: int, max_criterion_chars: int) -> list[Criterion]:
    """The criteria of ``items``; the limits are checked as they are read, so a huge list costs no more than the limit."""
    criteria: list[Criterion] = []
    total = 0
    for i, item in enumerate(items, start=1):
        criterion = _criterion(i, item, max_criterion_chars)
        if criterion is None:
            continue
        criteria.append(criterion)
        total += len(criterion.text)
        if len(criteria) > max_criteria:
            raise RubricError("rubric", f"more than {max_criteria} criteria, over the limit of {max_criteria}")
        if total > max_chars:
            raise RubricError("rubric", f"criteria hold more than {max_chars} characters, over the {max_chars}-character limit")
    if not criteria:
        raise RubricError("rubric", "the rubric is empty: give at least one criterion")
    return criteria


def _items_from_text(text: str) -> list[Any]:
    stripped = text.strip()
    if not stripped:
        return []
    if stripped[0] in "[{":
        # Deep or huge JSON would cost more than its size justifies: refused before parsing
        # (an input-format problem like any over-deep JSON, so InvalidInputError, not RubricError).
        check_json_depth(stripped, "rubric")
        if json_nodes(stripped) > MAX_NODES:
            raise InvalidInputError("rubric", f"JSON holds more than {MAX_NODES} values (the limit is {MAX_NODES})")
        try:
            data = json.loads(stripped)
        except json.JSONDecodeError as e:
            raise RubricError("rubric", f"malformed JSON at line {e.lineno}, column {e.colno}: {e.msg}") from None
        return _items_from_data(data)
    if _YAML_START.match(stripped):
        # Anchors, aliases (the alias bomb), deep nesting and huge documents are refused while parsing.
        return _items_from_data(load_yaml(stripped, "rubric", malformed=RubricError))
    return _items_from_free_text(stripped)


def _items_from_free_text(text: str) -> list[str]:
    lines = [line for line in text.splitlines() if line.strip()]
    if len(lines) > 1:
        return [_BULLET.sub("", line, count=1) for line in lines]
    line = _BULLET.sub("", lines[0], count=1)
    separator = ";" if ";" in line else ","
    return line.split(separator)


def _items_from_data(data: Any) -> list[Any]:
    if isinstance(data, dict):
        unknown = set(data) - {"criteria"}
        if unknown:
            raise RubricError("rubric", f"unknown key(s) {sorted(map(str, unknown))}; expected only 'criteria'")
        if "criteria" not in data:
            raise RubricError("rubric", "a rubric mapping needs a 'criteria' list")
        data = data["criteria"]
    if data is None:
        return []
    if not isinstance(data, (list, tuple)):
        raise RubricError("rubric", f"criteria must be a list, not {type(data).__name__}")
    return list(data)


def _criterion(index: int, item: Any, max_chars: int) -> Criterion | None:
    where = f"criterion {index}"
    text, weight, required = _criterion_fields(where, item)
    text = _SPACES.sub(" ", check_text(text, where)).strip()
    if not any(ch.isalnum() for ch in text):
        if isinstance(item, dict):
            raise RubricError(where, "text is empty" if not text else f"text {text!r} has no letters or digits")
        return None  # a stray separator or blank bullet in free text, not a criterion
    where = f"criterion {index} ({text[:60]!r})"
    if len(text) > max_chars:
        raise RubricError(where, f"{len(text)} characters, over the {max_chars}-character limit per criterion")
    _check_weight(where, weight)
    if not isinstance(required, bool):
        raise RubricError(where, f"required must be true or false, not {required!r}")
    return Criterion(text=text, weight=float(weight), required=required)


def _criterion_fields(where: str, item: Any) -> tuple[str, Any, Any]:
    """(text, weight, required) of a criterion given as a string or a mapping; the text checked to be a string."""
    if isinstance(item, str):
        return item, 1.0, False
    if not isinstance(item, dict):
        raise RubricError(where, f"a criterion must be a string or a mapping, not {type(item).__name__}")
    unknown = set(item) - _KEYS
    if unknown:
        raise RubricError(where, f"unknown key(s) {sorted(map(str, unknown))}; allowed: text, weight, required")
    if "text" not in item:
        raise RubricError(where, "a criterion mapping needs a 'text'")
    if not isinstance(item["text"], str):
        raise RubricError(where, f"text must be a string, not {type(item['text']).__name__}")
    return item["text"], item.get("weight", 1.0), item.get("required", False)


def _check_weight(where: str, weight: Any) -> None:
    # bool is an int subclass: True must not pass as weight 1.
    if isinstance(weight, bool) or not isinstance(weight, (int, float)):
        raise RubricError(where, f"weight must be a positive number, not {weight!r}")
    if not math.isfinite(weight) or weight <= 0:
        raise RubricError(where, f"weight must be a positive finite number, not {weight!r}")
