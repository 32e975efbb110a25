"""Attribute sidecars for one comparison: stored records per image, computed once when missing."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Sequence

from ..images import ImageInput
from .attributes import AttributeStore, ImageNetAttributeSource, VlmAttributeSource, Visual, merge_records

__all__ = ["SIDECAR_SOURCES", "SidecarRecords"]

#: The sidecar names a comparison may ask for.
SIDECAR_SOURCES = ("imagenet", "vlm")

#: ``(image sha256, package or image, loader of the kept image)`` for one reference
SidecarReference = tuple[str, Visual, Callable[[], ImageInput]]


class SidecarRecords:
    """Reads and fills the attribute store under ``<root>/attributes`` for comparisons.

    The ImageNet classifier needs pixels, so a reference's kept image is decoded only
    when its record is missing; the VLM source works from packages.
    """

    def __init__(self, root: str | Path) -> None:
        self.store = AttributeStore(root)
        self._imagenet: ImageNetAttributeSource | None = None

    def records(
        self,
        references: Sequence[SidecarReference],
        candidate_image: ImageInput,
        candidate_package: Visual,
        sources: Sequence[str],
        backend: Any,
    ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """Merged records for each reference (in order) and for the candidate."""
        per_reference: list[list[dict]] = [[] for _ in references]
        candidate: list[dict] = []
        for name in sources:
            if name == "imagenet":
                source = self.imagenet()
                stored = [self.store.get(sha, source.fingerprint, source.schema_digest) for sha, _, _ in references]
                todo = [i for i, record in enumerate(stored) if record is None]
                computed = self.store.get_or_compute(source, [references[i][2]() for i in todo] + [candidate_image])
                for i, record in zip(todo, computed):
                    stored[i] = record
                candidate.append(computed[-1])
            else:
                stored = self.store.get_or_compute(
                    VlmAttributeSource(backend), [visual for _, visual, _ in references] + [candidate_package]
                )
                candidate.append(stored.pop())
            for records, record in zip(per_reference, stored):
                records.append(record)
        return [merge_records(*r) for r in per_reference], merge_records(*candidate)

    def imagenet(self) -> ImageNetAttributeSource:
        """The ImageNet source, its classifier loaded on first use."""
        if self._imagenet is None:
            self._imagenet = ImageNetAttributeSource()
        return self._imagenet

    def close(self) -> None:
        """Close the attribute store."""
        self.store.close()
