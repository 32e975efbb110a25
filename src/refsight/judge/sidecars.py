"""Attribute sidecars for one comparison: stored records per image, computed once when missing."""

from __future__ import annotations

import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from ..images import ImageInput
from .attributes import (
    ERROR_KEY,
    AttributeSchema,
    AttributeSource,
    AttributeStore,
    ImageNetAttributeSource,
    Visual,
    VlmAttributeSource,
    merge_records,
    subject_of,
)

__all__ = ["SIDECAR_SOURCES", "SidecarRecords", "check_sources", "load_attribute_schema"]

#: The sidecar names a comparison may ask for.
SIDECAR_SOURCES = ("imagenet", "vlm")

#: Candidate records kept in memory (a few KB each).
CANDIDATE_RECORDS = 1024

#: ``(image sha256, package or image, loader of the kept image)`` for one reference
SidecarReference = tuple[str, Visual, Callable[[], ImageInput]]


def check_sources(sources: Sequence[str], what: str = "attributes") -> tuple[str, ...]:
    """``sources`` as a tuple, or InvalidInputError naming the unknown ones."""
    from ..errors import InvalidInputError

    if isinstance(sources, str):
        sources = [sources]
    unknown = sorted(set(sources) - set(SIDECAR_SOURCES))
    if unknown:
        raise InvalidInputError(what, f"unknown sources {unknown}; use {', '.join(SIDECAR_SOURCES)}")
    return tuple(sources)


def load_attribute_schema(value: AttributeSchema | Mapping[str, Any] | str | Path | None) -> AttributeSchema | None:
    """An attribute schema from a schema, a mapping ``name → allowed values or None``, or a JSON/YAML file.

    A mapping may also be ``{"attributes": {...}, "value_max_chars": n}`` (what
    :meth:`AttributeSchema.to_dict` writes).
    """
    from ..errors import InvalidInputError

    if value is None or isinstance(value, AttributeSchema):
        return value
    if isinstance(value, (str, Path)):
        import yaml

        from ..reading import FileReadError, read_regular_file

        path = Path(value)
        try:
            # A regular file only, never blocking (a FIFO) and never unbounded (/dev/zero).
            text = read_regular_file(path, 1024 * 1024).decode("utf-8")
        except FileReadError as e:
            raise InvalidInputError(str(path), f"cannot read the attribute schema: {e.reason}") from None
        except UnicodeDecodeError:
            raise InvalidInputError(str(path), "the attribute schema is not UTF-8 text") from None
        try:
            value = yaml.safe_load(text)  # JSON is YAML too
        except yaml.YAMLError as e:
            raise InvalidInputError(str(path), f"not JSON or YAML: {e}") from None
    if not isinstance(value, Mapping) or not value:
        raise InvalidInputError("attribute schema", "expected a mapping of attribute name to allowed values (or null)")
    if isinstance(value.get("attributes"), Mapping):
        return AttributeSchema.from_dict(value["attributes"], value_max_chars=int(value.get("value_max_chars", 40)))
    for name, values in value.items():
        if values is not None and (isinstance(values, str) or not isinstance(values, (list, tuple))):
            raise InvalidInputError(str(name), "allowed values must be a list of strings or null")
    return AttributeSchema.from_dict(value)


class SidecarRecords:
    """Reads and fills the attribute store under ``<root>/attributes`` for comparisons.

    References' records are stored (computed once, reused by every later comparison). A
    candidate's record is computed for the comparison and kept in a small memory LRU only:
    a compared image leaves nothing on disk. The ImageNet classifier needs pixels, so a
    reference's kept image is decoded only when its record is missing; the VLM source
    works from packages.
    """

    def __init__(
        self, root: str | Path, *, candidate_records: int = CANDIDATE_RECORDS, schema: AttributeSchema | None = None
    ) -> None:
        self.store = AttributeStore(root)
        #: the VLM record's attributes (default: :meth:`AttributeSchema.default`)
        self.schema = schema
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
                source = VlmAttributeSource(backend, self.schema)
                stored = self.store.get_or_compute(source, [visual for _, visual, _ in references])
                candidate.append(self._candidate(source, candidate_package))
            for records, record in zip(per_reference, stored):
                records.append(record)
        return [merge_records(*r) for r in per_reference], merge_records(*candidate)

    def ingest(self, references: Sequence[tuple[ImageInput, Visual]], sources: Sequence[str], backend: Any) -> int:
        """Compute and store the records of newly added references (``(image, package)`` each); how many were new.

        The ingest hook: the image is still decoded in hand, so the ImageNet classifier
        runs without decoding the kept bytes again; the VLM source works from the package.
        """
        computed = 0
        for name in sources:
            if name == "imagenet":
                source: AttributeSource = self.imagenet()
                items: list[Visual] = [image for image, _ in references]
            else:
                source = VlmAttributeSource(backend, self.schema)
                items = [package for _, package in references]
            before = self.store.misses
            self.store.get_or_compute(source, items)
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
                # ImageNet records are per image; VLM records per package subject (scope included).
                subject = sha if name == "imagenet" or scope is None else f"{sha}@{scope}"
                record = self.store.get(subject, source.fingerprint, source.schema_digest)
                if record is not None:
                    records.append(record)
        return [merge_records(*records) if records else None for records in found]

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
