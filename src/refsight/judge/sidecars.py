"""Attribute sidecars for one comparison: stored records per image, computed once when missing."""

from __future__ import annotations

import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any, Callable, Sequence

from ..images import ImageInput
from .attributes import (
    ERROR_KEY,
    AttributeSource,
    AttributeStore,
    ImageNetAttributeSource,
    Visual,
    VlmAttributeSource,
    merge_records,
    subject_of,
)

__all__ = ["SIDECAR_SOURCES", "SidecarRecords"]

#: The sidecar names a comparison may ask for.
SIDECAR_SOURCES = ("imagenet", "vlm")

#: Candidate records kept in memory (a few KB each).
CANDIDATE_RECORDS = 1024

#: ``(image sha256, package or image, loader of the kept image)`` for one reference
SidecarReference = tuple[str, Visual, Callable[[], ImageInput]]


class SidecarRecords:
    """Reads and fills the attribute store under ``<root>/attributes`` for comparisons.

    References' records are stored (computed once, reused by every later comparison). A
    candidate's record is computed for the comparison and kept in a small memory LRU only:
    a compared image leaves nothing on disk. The ImageNet classifier needs pixels, so a
    reference's kept image is decoded only when its record is missing; the VLM source
    works from packages.
    """

    def __init__(self, root: str | Path, *, candidate_records: int = CANDIDATE_RECORDS) -> None:
        self.store = AttributeStore(root)
        self._imagenet: ImageNetAttributeSource | None = None
        self._candidates: OrderedDict[tuple[str, str, str], dict[str, Any]] = OrderedDict()
        self._capacity = candidate_records
        self._lock = threading.Lock()

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
                computed = self.store.get_or_compute(source, [references[i][2]() for i in todo])
                for i, record in zip(todo, computed):
                    stored[i] = record
                candidate.append(self._candidate(source, candidate_image))
            else:
                source = VlmAttributeSource(backend)
                stored = self.store.get_or_compute(source, [visual for _, visual, _ in references])
                candidate.append(self._candidate(source, candidate_package))
            for records, record in zip(per_reference, stored):
                records.append(record)
        return [merge_records(*r) for r in per_reference], merge_records(*candidate)

    def _candidate(self, source: AttributeSource, item: Visual) -> dict[str, Any]:
        """The candidate's record: from the memory LRU, else computed (never written to disk)."""
        key = (subject_of(item), source.fingerprint, source.schema_digest)
        with self._lock:
            record = self._candidates.get(key)
            if record is not None:
                self._candidates.move_to_end(key)
                return record
        record = source.compute([item])[0]
        if ERROR_KEY not in record:  # a failed record would hide a later success
            with self._lock:
                self._candidates[key] = record
                while len(self._candidates) > self._capacity:
                    self._candidates.popitem(last=False)
        return record

    def imagenet(self) -> ImageNetAttributeSource:
        """The ImageNet source, its classifier loaded on first use."""
        if self._imagenet is None:
            self._imagenet = ImageNetAttributeSource()
        return self._imagenet

    def close(self) -> None:
        """Close the attribute store."""
        self.store.close()
