"""Attribute sources: what fills an attribute record for an image or a package.

Two sources fill *attribute records*:

- :class:`VlmAttributeSource` asks the VLM, with constrained JSON, to fill the attributes of
  an :class:`~refsight.judge.attribute_schema.AttributeSchema`, once per reference package and schema.
- :class:`~refsight.embedders.imagenet_source.ImageNetAttributeSource` (model code, so it lives
  in :mod:`refsight.embedders`; re-exported here) runs the real EfficientNet-Lite0 ImageNet
  classifier: ``{"imagenet_top5": [{"label", "score"}, ...]}``. It needs pixels, not packages.

The VLM source's fingerprint holds the backend's encoder fingerprint, so (image sha256, that
fingerprint) names the same thing as the package key.
"""

from __future__ import annotations

from typing import Any, Mapping, Protocol, Sequence

from ..backends.base import Backend
from ..requests import GenerationRequest
from ..embedders.imagenet_source import IMAGENET_KEY, ImageNetAttributeSource
from ..package import VisualPackage
from ..cache.packages import ModelImage
from .attribute_schema import ERROR_KEY, UNKNOWN, AttributeSchema, canonical_digest
from .batches import generate_texts
from .prompts import build_attribute_request
from .verdict import VerdictParseError, extract_json

__all__ = [
    "AttributeSource", "VlmAttributeSource", "ImageNetAttributeSource", "merge_records", "subject_of", "scoped_subject", "IMAGENET_KEY",
]


def subject_of(item: ModelImage, scope: str | None = None) -> str:
    """What an attribute record is stored under: the image hash, and the isolation scope (a scoped
    package's own, else ``scope``), so an isolated tenant's records are that tenant's alone."""
    if isinstance(item, VisualPackage):
        return scoped_subject(item.image_sha256, item.scope)
    return scoped_subject(item.sha256, scope)


def scoped_subject(image_sha256: str, scope: str | None) -> str:
    """The subject of an image's records in ``scope`` (None: shared by the whole store)."""
    return image_sha256 if scope is None else f"{image_sha256}@{scope}"


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

    def compute(self, items: Sequence[ModelImage]) -> list[dict[str, Any]]:
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
        return canonical_digest({"source": "vlm", "model": self.backend.name, "encoder": self.backend.fingerprint().to_dict()})

    @property
    def schema_digest(self) -> str:
        """The attribute schema's digest."""
        return self.schema.digest

    def _request(self, item: ModelImage, retry_reason: str | None = None) -> GenerationRequest:
        constrained = self.backend.supports_constrained_decoding
        return build_attribute_request(
            item,
            {s.name: s.values for s in self.schema.specs},
            value_max_chars=self.schema.value_max_chars,
            max_new_tokens=self.schema.token_budget() + (0 if constrained else 32),
            json_schema=self.schema.json_schema() if constrained else None,
            retry_reason=retry_reason,
        )

    def _generate(self, requests: list[GenerationRequest]) -> list[str]:
        self.calls += len(requests)
        return generate_texts(self.backend, requests)

    def _parse(self, text: str) -> dict[str, Any]:
        import jsonschema

        data = extract_json(text)
        error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(self.schema.json_schema()).iter_errors(data))
        if error is not None:
            path = "/".join(str(p) for p in error.absolute_path) or "(root)"
            raise VerdictParseError(text, f"schema violation at {path}: {error.message[:120]}")
        return {name: data[name] for name in self.schema.names}

    def compute(self, items: Sequence[ModelImage]) -> list[dict[str, Any]]:
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
