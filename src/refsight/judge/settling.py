"""Settling criteria from attribute records: what the records answer, conservatively, without the VLM.

:func:`settle_criteria` answers the criteria the records can settle (see its docstring),
marking them ``"source": "attributes"``; the rest go to the VLM. The judge and the
prefilter (:mod:`refsight.judge.prefilter`) both settle through it.
"""

from __future__ import annotations

import re
import weakref
from dataclasses import dataclass
from importlib import resources
from typing import Any, Mapping, Sequence

from ..embedders.imagenet_source import IMAGENET_KEY
from .attribute_schema import ERROR_KEY, UNKNOWN
from ..inputs.rubric import Criterion
from .verdict import CriterionVerdict

__all__ = ["SettleThresholds", "settle_criteria"]


@dataclass(frozen=True)
class SettleThresholds:
    """When the attribute records may answer a criterion (MiniLM cosine similarities and probabilities).

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
        text = resources.files("refsight.embedders").joinpath("imagenet_labels.txt").read_text("utf-8")
        labels = [line.strip() for line in text.splitlines() if line.strip()]
        _label_groups = {labels[i]: name for lo, hi, name in _GROUPS for i in range(lo, hi + 1) if i < len(labels)}
    return _label_groups.get(label)


_embedding_cache: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()


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
    settleable = [c for c in criteria if not _NEGATION.search(c.text)]
    if not settleable:
        return [None] * len(criteria)
    evidence = _Evidence.of(settleable, ref_attrs, cand_attrs, text_encoder)
    return [evidence.settle(c, thresholds) if c in settleable else None for c in criteria]


@dataclass(frozen=True)
class _Evidence:
    """Both sides' records and the text vectors of everything a criterion is matched against."""

    ref_attrs: Mapping[str, Any]
    cand_attrs: Mapping[str, Any]
    ref_top: list[tuple[str, float]]
    cand_top: list[tuple[str, float]]
    #: attributes both sides hold as strings (the VLM record's), sorted
    attr_names: list[str]
    #: ImageNet label → the phrases it stands for (the label, and its group: dog, cat, big cat)
    label_phrases: dict[str, list[str]]
    vectors: dict[str, Any]

    @classmethod
    def of(cls, criteria: Sequence[Criterion], ref_attrs: Mapping[str, Any], cand_attrs: Mapping[str, Any],
           encoder: Any) -> _Evidence:
        """Embed, in one batch, the criteria, the top labels (and groups) and the shared attribute names."""
        ref_top, cand_top = _top(ref_attrs), _top(cand_attrs)
        attr_names = sorted(
            k for k in ref_attrs
            if k in cand_attrs and k not in (IMAGENET_KEY, ERROR_KEY)
            and isinstance(ref_attrs[k], str) and isinstance(cand_attrs[k], str)
        )
        label_phrases: dict[str, list[str]] = {}
        for label, _ in ref_top + cand_top:
            group = _label_group(label)
            label_phrases[label] = [label] + ([group] if group else [])
        phrases = [c.text for c in criteria] + [p for ps in label_phrases.values() for p in ps]
        phrases += [n.replace("_", " ") for n in attr_names]
        return cls(ref_attrs, cand_attrs, ref_top, cand_top, attr_names, label_phrases, _embed(encoder, phrases))

    def settle(self, criterion: Criterion, t: SettleThresholds) -> CriterionVerdict | None:
        """ImageNet first (category claims), then the VLM attributes; None when neither settles it."""
        verdict = None
        if self.ref_top and self.cand_top:
            verdict = self._imagenet(criterion, t)
        if verdict is None and self.attr_names:
            verdict = self._attribute(criterion, t)
        return verdict

    def _imagenet(self, c: Criterion, t: SettleThresholds) -> CriterionVerdict | None:
        v = self.vectors[c.text]
        sim = {label: max(_cos(v, self.vectors[p]) for p in ps) for label, ps in self.label_phrases.items()}
        if max(sim.values(), default=0.0) < t.category_claim:
            return None

        def mass(top: list[tuple[str, float]]) -> float:
            return sum(score for label, score in top if sim[label] >= t.label_evidence)

        settled = _present_or_absent(mass(self.ref_top), mass(self.cand_top), self.ref_top, self.cand_top, t)
        if settled is None:
            return None
        verdict, confidence = settled
        evidence = f"ImageNet top labels: reference {_show(self.ref_top)}; candidate {_show(self.cand_top)}"
        return CriterionVerdict(c.text, verdict, round(confidence, 4), evidence[:160], source="attributes")

    def _attribute(self, c: Criterion, t: SettleThresholds) -> CriterionVerdict | None:
        v = self.vectors[c.text]
        sims = {n: _cos(v, self.vectors[n.replace("_", " ")]) for n in self.attr_names}
        close = [n for n, s in sims.items() if s >= t.attribute]
        if len(close) != 1:  # none, or a compound criterion touching several attributes
            return None
        name = close[0]
        ref_value, cand_value = self.ref_attrs[name].strip().lower(), self.cand_attrs[name].strip().lower()
        if UNKNOWN in (ref_value, cand_value) or not ref_value or not cand_value:
            return None
        verdict = _compare_values(c.text, ref_value, cand_value)
        if verdict is None:
            return None
        evidence = f"{name}: reference {ref_value!r}, candidate {cand_value!r}"
        return CriterionVerdict(c.text, verdict, round(sims[name], 4), evidence[:160], source="attributes")


def _top(attrs: Mapping[str, Any]) -> list[tuple[str, float]]:
    top = attrs.get(IMAGENET_KEY)
    if not isinstance(top, list):
        return []
    return [(str(e["label"]), float(e["score"])) for e in top if isinstance(e, Mapping) and "label" in e and "score" in e]


def _show(top: list[tuple[str, float]]) -> str:
    return ", ".join(f"{label} {score:.2f}" for label, score in top[:3])


def _present_or_absent(
    ref_mass: float, cand_mass: float, ref_top: list[tuple[str, float]], cand_top: list[tuple[str, float]],
    t: SettleThresholds,
) -> tuple[str, float] | None:
    """``(verdict, confidence)`` from the evidence mass on each side, or None when it is not clear-cut."""

    def coverage(top: list[tuple[str, float]]) -> float:
        return sum(score for _, score in top)

    if ref_mass >= t.present_mass and cand_mass >= t.present_mass:
        return "match", min(ref_mass, cand_mass)
    if ref_mass >= t.present_mass and cand_mass <= t.absent_mass and coverage(cand_top) >= t.absent_coverage:
        return "mismatch", min(ref_mass, coverage(cand_top))
    if cand_mass >= t.present_mass and ref_mass <= t.absent_mass and coverage(ref_top) >= t.absent_coverage:
        return "mismatch", min(cand_mass, coverage(ref_top))
    return None


def _compare_values(text: str, ref_value: str, cand_value: str) -> str | None:
    """match / mismatch for one attribute's two known values, or None when the criterion's sense is unclear."""
    words = set(re.findall(r"[a-z0-9]+", text.lower()))
    named = [value for value in {ref_value, cand_value} if set(value.split()) <= words]
    if len(named) > 1:
        return None
    if not named:  # "same fur length": equal values match
        return "match" if ref_value == cand_value else "mismatch"
    wanted = named[0]
    if ref_value == wanted:  # "short fur": the reference has it; does the candidate?
        return "match" if cand_value == wanted else "mismatch"
    return None  # the reference lacks the named value: the criterion's sense is unclear
