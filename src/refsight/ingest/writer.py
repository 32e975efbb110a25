"""The driver side of an ingest: probe the store before any encode, and be its ONE writer.

Why the driver writes (and workers never open the store): SQLite takes one writer at a time,
and a worker killed mid-write is the hard case for any store. Here workers are pure compute
(decode, encode, embed, classify) and send back rows: the kept image bytes, the pickled
package, the vector, the attribute record. The driver writes each row through the same parts
``refsight add`` uses, in this order:

1. the package, through :meth:`PackageCache.store_encoded` (file then index row; idempotent);
2. the reference: :meth:`Catalog.ingest_reference` keeps the bytes, creates the reference and
   links its package in ONE transaction (the catalog interface, so a PostgreSQL catalog works too);
3. the retrieval vector into the vector cache, then the ImageNet record into the attribute store.

With a PostgreSQL catalog (``--catalog``) the same calls go to the shared catalog and blob
directory, and vectors and records to this replica's derived directory. Workers take no
cross-replica encode lease: two ingests of one image at once may both encode it, and the
second write is a no-op (keys are content-addressed, writes idempotent).

A crash or Ctrl-C between two steps leaves what the probe of the next run finds missing, so
re-running the command does only that (a package on disk is never encoded again). A row a
retried Ray task delivers twice is written twice harmlessly (every step is idempotent).
"""

from __future__ import annotations

import json
import pickle
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..context import RequestContext
from ..errors import InvalidInputError, RefsightError, StoreUnavailableError
from ..inputs.images import IntakeLimits
from ..judge.attribute_records import AttributeRecords
from ..judge.attribute_sources import scoped_subject
from ..package import EncoderFingerprint
from ..cache.packages import PackageCache
from ..references import ReferenceBook, validate_metadata
from ..retrieval.store_index import StoreIndex
from ..retrieval.vectors import vector_key
from ..store import Catalog
from .sources import IngestItem

__all__ = ["IngestParts", "IngestWriter", "Todo"]


@dataclass(frozen=True)
class IngestParts:
    """What an ingest writes through: the parts ``refsight add`` uses, and the intake limits."""

    catalog: Catalog
    packages: PackageCache
    book: ReferenceBook
    retrieval: StoreIndex
    attribute_records: AttributeRecords
    limits: IntakeLimits


@dataclass
class Todo:
    """One good image after the probe: its chosen id and what it still lacks."""

    index: int
    item: IngestItem
    sha256: str
    ref_id: str
    need_package: bool
    need_vector: bool
    need_record: bool
    need_reference: bool

    @property
    def needs_worker(self) -> bool:
        """Whether a worker must read the file (anything but a reference row from kept bytes)."""
        return self.need_package or self.need_vector or self.need_record or self.need_reference

    def row(self) -> dict[str, Any]:
        """The encode stage's input row."""
        return {
            "index": self.index, "path": self.item.path, "sha256": self.sha256,
            "need_package": self.need_package, "need_vector": self.need_vector, "need_record": self.need_record,
        }


class IngestWriter:
    """Probe and write the context's namespace of one store for one model, embedder and attribute set."""

    def __init__(
        self, parts: IngestParts, context: RequestContext, *, fingerprint: EncoderFingerprint, attributes: tuple[str, ...]
    ) -> None:
        self.parts = parts
        self.context = context
        self.namespace = context.namespace
        self.fingerprint = fingerprint
        self.digest = fingerprint.digest
        retriever = parts.retrieval.retriever()  # the embedder loads on the driver: its digest names the vectors
        self.vectors = retriever.db
        # The tenant's scope salts the vectors' key, as the index's own sync does (retrieval/vectors.py).
        self.vector_key = vector_key(retriever.embedder.digest, context.scope)
        self.imagenet = parts.attribute_records.imagenet() if "imagenet" in attributes else None
        self.records = parts.attribute_records.store
        self._claimed: dict[str, str] = {}  # ref id → image hash, for the ids chosen in this run
        self._pending: dict[str, int] = {}  # image hash → index of the row that computes its package
        self.stored = {"packages": 0, "vectors": 0, "records": 0}

    # -- probe ---------------------------------------------------------------------------
    def probe(self, batch: list[tuple[int, IngestItem, str]]) -> tuple[list[Todo], list[tuple[int, str]]]:
        """``(index, item, image hash)`` rows → what each lacks, and ``(index, error)`` for ids that cannot be had.

        Nothing is encoded or written here. An image already being computed in this run (the
        same picture at two paths) needs only its reference row, written after the others.
        """
        shas = [sha for _, _, sha in batch]
        have_vector = set(self.vectors.get_vectors(self.vector_key, list(dict.fromkeys(shas))))
        todos, errors = [], []
        for index, item, sha in batch:
            try:
                validate_metadata(item.metadata)  # the rules `add` applies (valid text, JSON, size)
                ref_id = self._choose(item, sha)
            except StoreUnavailableError:
                raise  # the store, not this image: the job stops (a re-run resumes)
            except RefsightError as e:
                errors.append((index, str(e)))
                continue
            first = sha not in self._pending
            key = self.context.package_key(sha, self.fingerprint)
            todo = Todo(
                index, item, sha, ref_id,
                need_package=first and not self.parts.packages.is_durable(key),
                need_vector=first and sha not in have_vector,
                need_record=first and self._record_missing(sha),
                need_reference=self._reference_missing(ref_id, sha, key, item.metadata),
            )
            if first and (todo.need_package or todo.need_vector or todo.need_record):
                self._pending[sha] = index
            todos.append(todo)
        return todos, errors

    def _choose(self, item: IngestItem, sha: str) -> str:
        ref_id = self.parts.book.choose_id(item.ref_id, item.name or item.path, sha, self.namespace)
        claimed = self._claimed.get(ref_id)
        if claimed is not None and claimed != sha:
            if item.ref_id is not None:
                raise InvalidInputError(ref_id, "another image of this ingest has this reference id")
            ref_id = f"{ref_id}-{sha[:8]}"  # two files of this run derive the same id: as add does
        self._claimed[ref_id] = sha
        return ref_id

    def _record_missing(self, sha: str) -> bool:
        return self.imagenet is not None and self.records.get(
            scoped_subject(sha, self.context.scope), self.imagenet.fingerprint, self.imagenet.schema_digest) is None

    def _reference_missing(self, ref_id: str, sha: str, key: str, metadata: dict[str, Any]) -> bool:
        ref = self.parts.book.find(ref_id, self.namespace)
        if ref is None or ref.packages.get(self.digest) != key:
            return True
        return any(ref.metadata.get(k) != v for k, v in metadata.items())

    def is_pending_elsewhere(self, todo: Todo) -> bool:
        """Whether another row of this run computes this image's package, vector and record."""
        return self._pending.get(todo.sha256, todo.index) != todo.index

    # -- write ---------------------------------------------------------------------------
    def write(self, todo: Todo, row: dict[str, Any]) -> bool:
        """Store what a worker computed for ``todo`` (see the module docstring); True when a package was encoded."""
        encoded = False
        if row["package"]:
            package = pickle.loads(row["package"])
            if package.key != self.context.package_key(todo.sha256, self.fingerprint):
                raise RuntimeError(f"{todo.item.path}: a worker returned a package under another key")
            if self.parts.packages.store_encoded(package):
                self.stored["packages"] += 1
            encoded = True
        self._reference(todo, row["data"], row["fmt"] or None)
        if row["vector"]:
            self.vectors.put_vectors(self.vector_key, {todo.sha256: np.frombuffer(row["vector"], dtype=np.float32)})
            self.stored["vectors"] += 1
        if row["record"] and self.imagenet is not None:
            self.records.put(scoped_subject(todo.sha256, self.context.scope), self.imagenet.fingerprint, self.imagenet.schema_digest, json.loads(row["record"]))
            self.stored["records"] += 1
        return encoded

    def write_from_kept(self, todo: Todo) -> None:
        """The reference row of an image whose bytes the store already keeps (no file read)."""
        self._reference(todo, self.parts.catalog.get_image(todo.sha256), None)

    def _reference(self, todo: Todo, data: bytes, fmt: str | None) -> None:
        if not todo.need_reference:
            return
        key = self.context.package_key(todo.sha256, self.fingerprint)
        self.parts.catalog.ingest_reference(
            todo.ref_id, todo.sha256, data, fmt, todo.item.metadata, namespace=self.namespace, link=(self.digest, key)
        )
