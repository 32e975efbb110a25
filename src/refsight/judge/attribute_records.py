"""The attribute records a comparison or an ingest uses: stored per reference, computed once when missing.

:class:`AttributeRecords` is the part the engine's pipelines hold: references' records are
read from (and written to) the :class:`~refsight.judge.attribute_store.AttributeStore`; a
candidate's record is computed for the comparison and kept in a small memory LRU only.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any, Callable, Sequence

from ..inputs.images import ImageInput
from ..cache.packages import ModelImage
from .attribute_schema import ERROR_KEY, AttributeSchema
from .attribute_sources import AttributeSource, ImageNetAttributeSource, VlmAttributeSource, merge_records, scoped_subject, subject_of
from .attribute_store import AttributeStore

__all__ = ["AttributeRecords", "RecordedReference"]

#: Candidate records kept in memory (a few KB each).
CANDIDATE_RECORDS = 1024

#: ``(image sha256, package or image, loader of the kept image)`` for one reference
RecordedReference = tuple[str, ModelImage, Callable[[], ImageInput]]


class AttributeRecords:
    """Reads and fills the attribute store under ``<root>/attributes`` (opened on first use).

    References' records are stored (computed once, reused by every later comparison). A
    candidate's record is computed for the comparison and kept in a small memory LRU only:
    a compared image leaves nothing on disk. The ImageNet classifier needs pixels, so a
    reference's kept image is decoded only when its record is missing; the VLM source
    works from packages.
    """

    def __init__(
        self, root: str | Path, *, candidate_records: int = CANDIDATE_RECORDS, schema: AttributeSchema | None = None
    ) -> None:
        self.root = Path(root)
        #: the VLM record's attributes (default: :meth:`AttributeSchema.default`)
        self.schema = schema
        self._store: AttributeStore | None = None
        self._imagenet: ImageNetAttributeSource | None = None
        self._candidates: OrderedDict[tuple[str, str, str], dict[str, Any]] = OrderedDict()
        self._capacity = candidate_records
        self._lock = threading.Lock()

    @property
    def store(self) -> AttributeStore:
        """The SQLite store, opened at the first ingest or comparison that uses records."""
        with self._lock:
            if self._store is None:
                self._store = AttributeStore(self.root)
            return self._store

    @property
    def opened(self) -> bool:
        """Whether the store has been opened (nothing has used a record yet when not)."""
        return self._store is not None

    def records(
        self,
        references: Sequence[RecordedReference],
        candidate_image: ImageInput,
        candidate_package: ModelImage,
        sources: Sequence[str],
        backend: Any,
        scope: str | None = None,
    ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """Merged records for each reference (in order) and for the candidate, in the tenant's ``scope``."""
        per_reference: list[list[dict]] = [[] for _ in references]
        candidate: list[dict] = []
        for name in sources:
            if name == "imagenet":
                source = self.imagenet()
                stored = self._imagenet_records(source, references, scope)
                candidate.append(self._candidate(source, candidate_image, scope))
            else:
                source = VlmAttributeSource(backend, self.schema)
                stored = self.store.get_or_compute(source, [visual for _, visual, _ in references])
                candidate.append(self._candidate(source, candidate_package, scope))
            for records, record in zip(per_reference, stored):
                records.append(record)
        return [merge_records(*r) for r in per_reference], merge_records(*candidate)

    def _imagenet_records(
        self, source: ImageNetAttributeSource, references: Sequence[RecordedReference], scope: str | None
    ) -> list[dict]:
        # Per image hash (not per package): the kept image is decoded only for a missing record.
        stored = [self.store.get(scoped_subject(sha, scope), source.fingerprint, source.schema_digest)
                  for sha, _, _ in references]
        todo = [i for i, record in enumerate(stored) if record is None]
        computed = self.store.get_or_compute(source, [references[i][2]() for i in todo], scope)
        for i, record in zip(todo, computed):
            stored[i] = record
        return stored

    def ingest(
        self, references: Sequence[tuple[ImageInput, ModelImage]], sources: Sequence[str], backend: Any,
        scope: str | None = None,
    ) -> int:
        """Compute and store the records of newly added references (``(image, package)`` each) in the
        tenant's ``scope``; how many were new.

        The ingest hook: the image is still decoded in hand, so the ImageNet classifier
        runs without decoding the kept bytes again; the VLM source works from the package.
        """
        computed = 0
        for name in sources:
            if name == "imagenet":
                source: AttributeSource = self.imagenet()
                items: list[ModelImage] = [image for image, _ in references]
            else:
                source = VlmAttributeSource(backend, self.schema)
                items = [package for _, package in references]
            before = self.store.misses
            self.store.get_or_compute(source, items, scope)
            computed += self.store.misses - before
        return computed

    def stored(
        self, references: Sequence[tuple[str, str | None]], sources: Sequence[str], backend: Any
    ) -> list[dict[str, Any] | None]:
        """The records already stored for ``(image sha256, scope)`` references (merged), computing nothing.

        What the prefilter reads: a reference added without attributes has none and is
        never dropped by it (the judge still computes its record if it gets that far).
        """
        found: list[list[dict[str, Any]]] = [[] for _ in references]
        for name in sources:
            source: AttributeSource = self.imagenet() if name == "imagenet" else VlmAttributeSource(backend, self.schema)
            for records, (sha, scope) in zip(found, references):
                # Both sources: per image, salted by the tenant's scope (a scoped package's subject).
                record = self.store.get(scoped_subject(sha, scope), source.fingerprint, source.schema_digest)
                if record is not None:
                    records.append(record)
        return [merge_records(*records) if records else None for records in found]

    def _candidate(self, source: AttributeSource, item: ModelImage, scope: str | None) -> dict[str, Any]:
        """The candidate's record: from the memory LRU (per tenant scope), else computed (never written to disk)."""
        key = (subject_of(item, scope), source.fingerprint, source.schema_digest)
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
        """Close the attribute store (if it was opened)."""
        with self._lock:
            if self._store is not None:
                self._store.close()
                self._store = None
