"""The attribute schema: which attributes a VLM fills per image, and the values each may take.

:class:`AttributeSchema` (by default fur_length, ear_shape, color_pattern, facial_markings)
gives the record's JSON schema for constrained decoding and a digest that names it in the
attribute store; :func:`load_attribute_schema` reads one from a mapping or a JSON/YAML file.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..errors import InvalidInputError
from ..inputs.jsonlimits import load_yaml
from ..embedders.imagenet_source import IMAGENET_KEY
from ..package import canonical_json
from ..inputs.text import check_texts

__all__ = ["ERROR_KEY", "UNKNOWN", "AttributeSpec", "AttributeSchema", "canonical_digest", "load_attribute_schema"]

#: The value a VLM gives when it cannot tell; never settles anything.
UNKNOWN = "unknown"
#: Key a source adds to a record it could not fill; such records are not stored.
ERROR_KEY = "error"
#: Largest attribute schema file read (a real one is a few hundred bytes).
MAX_SCHEMA_BYTES = 64 * 1024

_NAME = re.compile(r"[a-z][a-z0-9_]{0,39}")


def canonical_digest(value: Any) -> str:
    """sha256 hex of ``value``'s canonical JSON: how schemas and sources are named in the attribute store."""
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()


@dataclass(frozen=True)
class AttributeSpec:
    """One attribute: a snake_case name and, optionally, the values it may take."""

    name: str
    values: tuple[str, ...] | None = None

    @property
    def words(self) -> str:
        """The name as words (``fur_length`` → ``fur length``), for text matching."""
        return self.name.replace("_", " ")


@dataclass(frozen=True)
class AttributeSchema:
    """The attributes a VLM fills per image; ``digest`` names it in the store."""

    specs: tuple[AttributeSpec, ...]
    value_max_chars: int = 40

    def __post_init__(self) -> None:
        if not self.specs:
            raise InvalidInputError("attribute schema", "needs at least one attribute")
        seen = set()
        for spec in self.specs:
            _check_spec(spec, seen)
            seen.add(spec.name)
        if not 1 <= self.value_max_chars <= 200:
            raise InvalidInputError("value_max_chars", "must be between 1 and 200")

    @classmethod
    def default(cls) -> AttributeSchema:
        """fur_length, ear_shape, color_pattern (with allowed values) and free-text facial_markings."""
        return cls(
            (
                AttributeSpec("fur_length", ("hairless", "short", "medium", "long")),
                AttributeSpec("ear_shape", ("pointed", "rounded", "folded", "floppy")),
                AttributeSpec("color_pattern", ("solid", "tabby", "bicolor", "tricolor", "spotted", "colorpoint")),
                AttributeSpec("facial_markings"),
            )
        )

    @classmethod
    def from_dict(cls, data: Mapping[str, Sequence[str] | None], *, value_max_chars: int = 40) -> AttributeSchema:
        """Build from ``{name: [allowed values] or None}`` (order kept)."""
        return cls(
            tuple(AttributeSpec(n, None if v is None else tuple(v)) for n, v in data.items()),
            value_max_chars=value_max_chars,
        )

    def to_dict(self) -> dict[str, Any]:
        """``{"attributes": {name: values or None}, "value_max_chars": n}``."""
        return {
            "attributes": {s.name: None if s.values is None else list(s.values) for s in self.specs},
            "value_max_chars": self.value_max_chars,
        }

    @property
    def names(self) -> list[str]:
        """Attribute names, in order."""
        return [s.name for s in self.specs]

    @property
    def digest(self) -> str:
        """sha256 of the canonical schema."""
        return canonical_digest(self.to_dict())

    def json_schema(self) -> dict:
        """The record's JSON schema: enums (plus ``"unknown"``) or bounded plain strings."""
        props: dict[str, Any] = {}
        for s in self.specs:
            if s.values is not None:
                props[s.name] = {"type": "string", "enum": [*s.values, UNKNOWN]}
            else:
                props[s.name] = {"type": "string", "maxLength": self.value_max_chars}
        return {"type": "object", "properties": props, "required": self.names, "additionalProperties": False}

    def token_budget(self) -> int:
        """Upper bound on the tokens of a valid record, plus a stop token (one token per byte at worst)."""
        total = 2
        for s in self.specs:
            longest = max((len(json.dumps(v, ensure_ascii=False).encode()) for v in s.values), default=0) if s.values else 0
            longest = max(longest, len(json.dumps(UNKNOWN)), 2 + 4 * self.value_max_chars)
            total += len(json.dumps(s.name).encode()) + 4 + longest  # ": " and ", "
        return total + 1


def _check_spec(spec: AttributeSpec, seen: set[str]) -> None:
    if not isinstance(spec.name, str) or not _NAME.fullmatch(spec.name):
        raise InvalidInputError(spec.name, "an attribute name is 1-40 characters of a-z, 0-9 and _, starting with a letter")
    if spec.name in seen:
        raise InvalidInputError(spec.name, "duplicate attribute name")
    if spec.name in (IMAGENET_KEY, ERROR_KEY):
        raise InvalidInputError(spec.name, "this attribute name is reserved")
    if spec.values is not None:
        values = list(spec.values)
        if not values or any(not isinstance(v, str) or not v.strip() for v in values):
            raise InvalidInputError(spec.name, "allowed values must be non-empty strings")
        check_texts(values, spec.name)
        if len(set(values)) != len(values) or UNKNOWN in values:
            raise InvalidInputError(spec.name, f"allowed values must be unique and not {UNKNOWN!r}")


def load_attribute_schema(value: AttributeSchema | Mapping[str, Any] | str | Path | None) -> AttributeSchema | None:
    """An attribute schema from a schema, a mapping ``name → allowed values or None``, or a JSON/YAML file.

    A mapping may also be ``{"attributes": {...}, "value_max_chars": n}`` (what
    :meth:`AttributeSchema.to_dict` writes).
    """
    if value is None or isinstance(value, AttributeSchema):
        return value
    if isinstance(value, (str, Path)):
        value = _read_schema_file(Path(value))
    if not isinstance(value, Mapping) or not value:
        raise InvalidInputError("attribute schema", "expected a mapping of attribute name to allowed values (or null)")
    if isinstance(value.get("attributes"), Mapping):
        return AttributeSchema.from_dict(value["attributes"], value_max_chars=int(value.get("value_max_chars", 40)))
    for name, values in value.items():
        if values is not None and (isinstance(values, str) or not isinstance(values, (list, tuple))):
            raise InvalidInputError(str(name), "allowed values must be a list of strings or null")
    return AttributeSchema.from_dict(value)


def _read_schema_file(path: Path) -> Any:
    from ..inputs.reading import FileReadError, read_regular_file

    try:
        # A regular file only, never blocking (a FIFO) and never unbounded (/dev/zero).
        text = read_regular_file(path, MAX_SCHEMA_BYTES).decode("utf-8")
    except FileReadError as e:
        raise InvalidInputError(str(path), f"cannot read the attribute schema: {e.reason}") from None
    except UnicodeDecodeError:
        raise InvalidInputError(str(path), "the attribute schema is not UTF-8 text") from None
    return load_yaml(text, str(path))  # JSON is YAML too; anchors, aliases and deep nesting refused
