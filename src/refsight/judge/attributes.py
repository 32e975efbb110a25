"""The attribute sidecar: structured facts about each image, computed once and reused.

Two sources fill *attribute records*:

- :class:`VlmAttributeSource` asks the VLM, with constrained JSON, to fill the
  attributes of an :class:`AttributeSchema` (by default fur_length, ear_shape,
  color_pattern, facial_markings), once per reference package and schema.
- :class:`~refsight.models.imagenet_source.ImageNetAttributeSource` (model code, so it lives
  in :mod:`refsight.models`; re-exported here) runs the real EfficientNet-Lite0 ImageNet
  classifier: ``{"imagenet_top5": [{"label", "score"}, ...]}``. It needs pixels, not packages.

An :class:`AttributeStore` (SQLite under ``<store_root>/attributes/``) keeps records
keyed by (image sha256, source fingerprint, schema digest); ``get_or_compute`` is the
engine's one call. The VLM source's fingerprint holds the backend's encoder
fingerprint, so (image sha256, that fingerprint) names the same thing as the package key.

:func:`settle_criteria` answers the criteria the records can settle, conservatively
(see its docstring), marking them ``"source": "attributes"``; the rest go to the VLM.
"""

from __future__ import annotations

import hashlib
import json
import re
import sqlite3
import time
import weakref
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Mapping, Protocol, Sequence, Union

from ..backends.base import Backend
from ..errors import InvalidInputError
from ..images import ImageInput
from ..models.imagenet_source import IMAGENET_KEY, ImageNetAttributeSource
from ..package import VisualPackage, canonical_json
from ..store.sqlite import SqliteConnections
from .criteria import Criterion
from .prompts import build_attribute_request
from .verdict import CriterionVerdict, VerdictParseError, extract_json

__all__ = [
    "AttributeSpec",
    "AttributeSchema",
    "AttributeSource",
    "VlmAttributeSource",
    "ImageNetAttributeSource",
    "AttributeStore",
    "SettleThresholds",
    "settle_criteria",
    "merge_records",
    "subject_of",
    "ERROR_KEY",
    "IMAGENET_KEY",
    "UNKNOWN",
]

Visual = Union[VisualPackage, ImageInput]

#: The value a VLM gives when it cannot tell; never settles anything.
UNKNOWN = "unknown"
#: Key a source adds to a record it could not fill; such records are not stored.
ERROR_KEY = "error"

_NAME = re.compile(r"[a-z][a-z0-9_]{0,39}")


def _digest(value: Any) -> str:
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()


def subject_of(item: Visual) -> str:
    """What an attribute record is stored under: the image hash (and the isolation scope of a scoped package)."""
    if isinstance(item, VisualPackage):
        # A scoped (tenant-isolated) package's record is that tenant's alone.
        return item.image_sha256 if item.scope is None else f"{item.image_sha256}@{item.scope}"
    return item.sha256


# -- schema ---------------------------------------------------------------------------------


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
            if not isinstance(spec.name, str) or not _NAME.fullmatch(spec.name):
                raise InvalidInputError(spec.name, "an attribute name is 1-40 characters of a-z, 0-9 and _, starting with a letter")
            if spec.name in seen:
                raise InvalidInputError(spec.name, "duplicate attribute name")
            if spec.name in (IMAGENET_KEY, ERROR_KEY):
                raise InvalidInputError(spec.name, "this attribute name is reserved")
            seen.add(spec.name)
            if spec.values is not None:
                values = list(spec.values)
                if not values or any(not isinstance(v, str) or not v.strip() for v in values):
                    raise InvalidInputError(spec.name, "allowed values must be non-empty strings")
                if len(set(values)) != len(values) or UNKNOWN in values:
                    raise InvalidInputError(spec.name, f"allowed values must be unique and not {UNKNOWN!r}")
        if not 1 <= self.value_max_chars <= 200:
            raise InvalidInputError("value_max_chars", "must be between 1 and 200")

    @classmethod
    def default(cls) -> "AttributeSchema":
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
    def from_dict(cls, data: Mapping[str, Sequence[str] | None], *, value_max_chars: int = 40) -> "AttributeSchema":
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
        return _digest(self.to_dict())

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


# -- sources ----------------------------------------------------------------------------------


class AttributeSource(Protocol):
    """Something that fills attribute records for images or packages."""

    #: short name (``"vlm"``, ``"imagenet"``)
    name: str

    @property
    def fingerprint(self) -> str:
        """Digest of everything that changes the records (model, weights, settings)."""

    @property
    def schema_digest(self) -> str:
        """Digest of the record's shape."""

    def compute(self, items: Sequence[Visual]) -> list[dict[str, Any]]:
        """One record per item, same order; a record with ``"error"`` is not stored."""


class VlmAttributeSource:
    """The VLM fills an :class:`AttributeSchema` record per image (constrained JSON where supported).

    Invalid output is retried once; after that the record holds ``"unknown"`` for every
    attribute and an ``"error"`` (so it is not stored and nothing is invented).
    ``calls`` counts generation requests sent.
    """

    name = "vlm"

    def __init__(self, backend: Backend, schema: AttributeSchema | None = None) -> None:
        self.backend = backend
        self.schema = schema or AttributeSchema.default()
        self.calls = 0

    @property
    def fingerprint(self) -> str:
        """Backend name and its encoder fingerprint (model id and revision cover the weights)."""
        return _digest({"source": "vlm", "model": self.backend.name, "encoder": self.backend.fingerprint().to_dict()})

    @property
    def schema_digest(self) -> str:
        """The attribute schema's digest."""
        return self.schema.digest

    def _request(self, item: Visual, retry_reason: str | None = None):
        constrained = self.backend.supports_constrained_decoding
        return build_attribute_request(
            item,
            {s.name: s.values for s in self.schema.specs},
            value_max_chars=self.schema.value_max_chars,
            max_new_tokens=self.schema.token_budget() + (0 if constrained else 32),
            json_schema=self.schema.json_schema() if constrained else None,
            retry_reason=retry_reason,
        )

    def _generate(self, requests: list) -> list[str]:
        texts: list[str] = []
        step = max(1, int(getattr(self.backend, "batch_size", 1) or 1))
        for start in range(0, len(requests), step):
            chunk = requests[start : start + step]
            self.calls += len(chunk)
            texts += [g.text for g in self.backend.generate(chunk)]
        return texts

    def _parse(self, text: str) -> dict[str, Any]:
        import jsonschema

        data = extract_json(text)
        error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(self.schema.json_schema()).iter_errors(data))
        if error is not None:
            path = "/".join(str(p) for p in error.absolute_path) or "(root)"
            raise VerdictParseError(text, f"schema violation at {path}: {error.message[:120]}")
        return {name: data[name] for name in self.schema.names}

    def compute(self, items: Sequence[Visual]) -> list[dict[str, Any]]:
        """Ask the VLM once per item (plus one retry for invalid answers)."""
        records: list[dict[str, Any] | None] = [None] * len(items)
        reasons: dict[int, str] = {}
        pending = list(range(len(items)))
        for _attempt in range(2):  # the first try, then one retry told what was wrong
            texts = self._generate([self._request(items[i], reasons.get(i)) for i in pending])
            failed = []
            for i, text in zip(pending, texts):
                try:
                    records[i] = self._parse(text)
                except VerdictParseError as e:
                    reasons[i] = e.reason
                    failed.append(i)
            pending = failed
            if not pending:
                break
        for i in pending:
            records[i] = {**{n: UNKNOWN for n in self.schema.names}, ERROR_KEY: reasons[i]}
        return [r for r in records if r is not None]


def merge_records(*records: Mapping[str, Any] | None) -> dict[str, Any]:
    """One attribute dict from several sources' records (``None`` and errors skipped)."""
    merged: dict[str, Any] = {}
    for record in records:
        if record:
            merged.update({k: v for k, v in record.items() if k != ERROR_KEY})
    return merged


# -- store ----------------------------------------------------------------------------------------


class AttributeStore:
    """Attribute records in SQLite at ``<root>/attributes/attributes.sqlite``.

    Keyed by (image sha256, source fingerprint, schema digest). Records are deterministic
    for a key, so concurrent writers may race harmlessly: the first insert wins.
    ``hits``/``misses`` count lookups in this process.
    """

    def __init__(self, root: str | Path) -> None:
        self.path = Path(root) / "attributes" / "attributes.sqlite"
        self._sqlite = SqliteConnections(
            self.path, schema=_create_table, open_error="cannot open the attribute store at {path}: {exc}"
        )
        self.hits = 0
        self.misses = 0

    def get(self, subject: str, source_fingerprint: str, schema_digest: str) -> dict[str, Any] | None:
        """The stored record, or None."""
        row = self._sqlite.connection().execute(
            "SELECT record FROM attributes WHERE subject=? AND source=? AND schema=?",
            (subject, source_fingerprint, schema_digest),
        ).fetchone()
        return None if row is None else json.loads(row[0])

    def put(self, subject: str, source_fingerprint: str, schema_digest: str, record: Mapping[str, Any]) -> None:
        """Store a record (a no-op when one is already stored under the key)."""
        self._sqlite.connection().execute(
            "INSERT OR IGNORE INTO attributes VALUES (?, ?, ?, ?, ?)",
            (subject, source_fingerprint, schema_digest, canonical_json(dict(record)), time.time()),
        )

    def get_or_compute(self, source: AttributeSource, items: Sequence[Visual]) -> list[dict[str, Any]]:
        """Each item's record from ``source``: stored ones are read, the rest computed in one batch and stored."""
        fp, schema = source.fingerprint, source.schema_digest
        records: list[dict[str, Any] | None] = [self.get(subject_of(item), fp, schema) for item in items]
        missing = [i for i, r in enumerate(records) if r is None]
        self.hits += len(items) - len(missing)
        self.misses += len(missing)
        if missing:
            computed = source.compute([items[i] for i in missing])
            for i, record in zip(missing, computed):
                records[i] = record
                if ERROR_KEY not in record:  # a failed record would hide a later success
                    self.put(subject_of(items[i]), fp, schema, record)
        return [r for r in records if r is not None]

    def close(self) -> None:
        """Close the database. Idempotent."""
        self._sqlite.close()


def _create_table(conn: sqlite3.Connection) -> None:
    conn.execute(
        "CREATE TABLE IF NOT EXISTS attributes (subject TEXT NOT NULL, source TEXT NOT NULL,"
        " schema TEXT NOT NULL, record TEXT NOT NULL, created_at REAL NOT NULL,"
        " PRIMARY KEY (subject, source, schema))"
    )


# -- settling criteria ---------------------------------------------------------------------------


@dataclass(frozen=True)
class SettleThresholds:
    """When the sidecars may answer a criterion (MiniLM cosine similarities and probabilities).

    Measured with all-MiniLM-L6-v2: "is a cat" ~ "cat" 0.81, "a cat" 0.91, "is a dog" ~ "dog"
    0.75, while "same breed of cat" 0.64, "a cat with orange fur" 0.59, "is a feline" 0.55
    and "is a dog" ~ "tiger cat" 0.39 stay below. "has pointed ears" ~ "ear shape" 0.64,
    "same color pattern" ~ "color pattern" 0.89, "has a striped coat" 0.40.
    """

    #: a criterion is an ImageNet category claim only if it is this close to a label or group
    category_claim: float = 0.70
    #: a label counts as evidence for the claim at this similarity
    label_evidence: float = 0.50
    #: probability mass of evidence labels needed on a side to call it present
    present_mass: float = 0.50
    #: at most this mass of evidence labels on a side to call it absent ...
    absent_mass: float = 0.05
    #: ... and only if that side's top-k hold at least this mass (a confident classification)
    absent_coverage: float = 0.80
    #: a criterion is about an attribute at this similarity to its name
    attribute: float = 0.60


_NEGATION = re.compile(r"\b(not|no|never|without|neither|nor|none|lacks?|isn't|aren't|doesn't|don't|non)\b|n't\b", re.I)

# ImageNet-1k class groups (index ranges of the standard order) so that "tabby" also reads as "cat".
_GROUPS = ((151, 268, "dog"), (281, 285, "cat"), (286, 293, "big cat"))
_label_groups: dict[str, str] | None = None


def _label_group(label: str) -> str | None:
    global _label_groups
    if _label_groups is None:
        text = resources.files("refsight.models").joinpath("imagenet_labels.txt").read_text("utf-8")
        labels = [line.strip() for line in text.splitlines() if line.strip()]
        _label_groups = {labels[i]: name for lo, hi, name in _GROUPS for i in range(lo, hi + 1) if i < len(labels)}
    return _label_groups.get(label)


_embedding_cache: "weakref.WeakKeyDictionary[Any, dict[str, Any]]" = weakref.WeakKeyDictionary()


def _embed(encoder: Any, texts: Sequence[str]) -> dict[str, Any]:
    """Embeddings by text, cached per encoder (label and attribute phrases recur every request)."""
    try:
        cache = _embedding_cache.setdefault(encoder, {})
    except TypeError:  # an encoder that cannot be weakly referenced: no cache
        cache = {}
    todo = [t for t in dict.fromkeys(texts) if t not in cache]
    if todo:
        vectors = encoder.encode(todo)
        for t, v in zip(todo, vectors):
            cache[t] = v
        if len(cache) > 20_000:  # bound the memory of a long-lived process
            for key in list(cache)[: len(cache) // 2]:
                del cache[key]
            cache.update({t: v for t, v in zip(todo, vectors)})
    return {t: cache[t] for t in texts}


def _cos(a: Any, b: Any) -> float:
    return float((a * b).sum())


def settle_criteria(
    criteria: Sequence[Criterion],
    ref_attrs: Mapping[str, Any] | None,
    cand_attrs: Mapping[str, Any] | None,
    text_encoder: Any,
    *,
    force_vlm: bool = False,
    thresholds: SettleThresholds = SettleThresholds(),
) -> list[CriterionVerdict | None]:
    """Answer from the attribute records what they can settle; ``None`` leaves a criterion to the VLM.

    Conservative by design; a criterion is settled only when:

    - it has no negation ("not", "without", "n't", ...), and
    - **ImageNet** (``imagenet_top5`` on both sides): it is a category claim (cosine to
      some top label or its group — dog, cat, big cat — ≥ ``category_claim``); labels
      within ``label_evidence`` of it are evidence. Both sides with evidence mass ≥
      ``present_mass`` → ``match``; one side present and the other confidently absent
      (evidence ≤ ``absent_mass`` while its top-k hold ≥ ``absent_coverage``) →
      ``mismatch``. Confidence is the weaker side's mass.
    - **VLM attributes** (string values on both sides): exactly one attribute name is within
      ``attribute`` of it. If the criterion names one of the attribute's allowed values
      ("short fur"), both sides having it → ``match``, the reference having it and the
      candidate another known value → ``mismatch``; otherwise ("same fur length") equal
      known values → ``match``, different ones → ``mismatch``. ``"unknown"`` never
      settles. Confidence is the criterion-to-attribute similarity (VLM attribute values
      carry no score of their own).

    ``force_vlm`` (or a missing record or encoder) leaves everything to the VLM.
    """
    if force_vlm or not ref_attrs or not cand_attrs or text_encoder is None or not criteria:
        return [None] * len(criteria)
    results: list[CriterionVerdict | None] = []
    candidates = [c for c in criteria if not _NEGATION.search(c.text)]
    if not candidates:
        return [None] * len(criteria)
    ref_top = _top(ref_attrs)
    cand_top = _top(cand_attrs)
    attr_names = sorted(
        k for k in ref_attrs
        if k in cand_attrs and k not in (IMAGENET_KEY, ERROR_KEY)
        and isinstance(ref_attrs[k], str) and isinstance(cand_attrs[k], str)
    )
    phrases: list[str] = [c.text for c in candidates]
    label_phrases: dict[str, list[str]] = {}
    for label, _ in ref_top + cand_top:
        group = _label_group(label)
        label_phrases[label] = [label] + ([group] if group else [])
        phrases += label_phrases[label]
    phrases += [n.replace("_", " ") for n in attr_names]
    vectors = _embed(text_encoder, phrases)

    for c in criteria:
        if c not in candidates:
            results.append(None)
            continue
        v = vectors[c.text]
        verdict = None
        if ref_top and cand_top:
            verdict = _settle_imagenet(c, v, ref_top, cand_top, label_phrases, vectors, thresholds)
        if verdict is None and attr_names:
            verdict = _settle_attribute(c, v, attr_names, ref_attrs, cand_attrs, vectors, thresholds)
        results.append(verdict)
    return results


def _top(attrs: Mapping[str, Any]) -> list[tuple[str, float]]:
    top = attrs.get(IMAGENET_KEY)
    if not isinstance(top, list):
        return []
    return [(str(e["label"]), float(e["score"])) for e in top if isinstance(e, Mapping) and "label" in e and "score" in e]


def _settle_imagenet(c, v, ref_top, cand_top, label_phrases, vectors, t: SettleThresholds) -> CriterionVerdict | None:
    sim = {label: max(_cos(v, vectors[p]) for p in ps) for label, ps in label_phrases.items()}
    if max(sim.values(), default=0.0) < t.category_claim:
        return None

    def mass(top):
        return sum(score for label, score in top if sim[label] >= t.label_evidence)

    def coverage(top):
        return sum(score for _, score in top)

    ref_mass, cand_mass = mass(ref_top), mass(cand_top)
    verdict, confidence = None, 0.0
    if ref_mass >= t.present_mass and cand_mass >= t.present_mass:
        verdict, confidence = "match", min(ref_mass, cand_mass)
    elif ref_mass >= t.present_mass and cand_mass <= t.absent_mass and coverage(cand_top) >= t.absent_coverage:
        verdict, confidence = "mismatch", min(ref_mass, coverage(cand_top))
    elif cand_mass >= t.present_mass and ref_mass <= t.absent_mass and coverage(ref_top) >= t.absent_coverage:
        verdict, confidence = "mismatch", min(cand_mass, coverage(ref_top))
    if verdict is None:
        return None

    def show(top):
        return ", ".join(f"{label} {score:.2f}" for label, score in top[:3])

    evidence = f"ImageNet top labels: reference {show(ref_top)}; candidate {show(cand_top)}"
    return CriterionVerdict(c.text, verdict, round(confidence, 4), evidence[:160], source="attributes")


def _settle_attribute(c, v, names, ref_attrs, cand_attrs, vectors, t: SettleThresholds) -> CriterionVerdict | None:
    sims = {n: _cos(v, vectors[n.replace("_", " ")]) for n in names}
    close = [n for n, s in sims.items() if s >= t.attribute]
    if len(close) != 1:  # none, or a compound criterion touching several attributes
        return None
    name = close[0]
    ref_value, cand_value = ref_attrs[name].strip().lower(), cand_attrs[name].strip().lower()
    if UNKNOWN in (ref_value, cand_value) or not ref_value or not cand_value:
        return None
    words = set(re.findall(r"[a-z0-9]+", c.text.lower()))
    named = [value for value in {ref_value, cand_value} if set(value.split()) <= words]
    if len(named) > 1:
        return None
    if named:
        wanted = named[0]
        if ref_value == wanted and cand_value == wanted:
            verdict = "match"
        elif ref_value == wanted:
            verdict = "mismatch"
        else:  # the reference lacks the named value: the criterion's sense is unclear
            return None
    else:
        verdict = "match" if ref_value == cand_value else "mismatch"
    evidence = f"{name}: reference {ref_value!r}, candidate {cand_value!r}"
    return CriterionVerdict(c.text, verdict, round(sims[name], 4), evidence[:160], source="attributes")
