"""The retrieval side of one store: a retriever that follows the catalog, searches, and forgets.

:class:`StoreIndex` is what the engine holds for recall. It builds the
:class:`~refsight.retrieval.Retriever` (and loads its embedder) on first use, brings its
entries up to date with the catalog before every search (O(changes), see
:mod:`refsight.retrieval.catalog_sync`), and drops a removed reference's entry
without loading any model (:meth:`StoreIndex.forget`, a removal listener).

Query images are embedded and never stored: a compared candidate leaves no vector on disk,
and a query never reads another tenant's cached vector (no timing can depend on one).
Reference vectors are cached per image for the whole store, or, when the caller passes the
namespace's isolation ``scope``, for that tenant alone: then how long indexing takes never
depends on whether another tenant holds the same image.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import numpy as np

from ..inputs.images import ImageInput
from ..results import IndexReport, SearchHit, SearchResult
from ..store.base import Catalog, ReferenceRow
from .catalog_sync import SyncReport, sync_with_catalog
from ..embedders.base import Embedder
from .retriever import DB_NAME, Retriever
from .vectors import VectorDB, vector_key

__all__ = ["StoreIndex"]


class StoreIndex:
    """Retrieval over the store at ``root``.

    ``embedder`` is an :class:`Embedder`, a registry name (``conse``, ``clip:PATH``,
    ``vlm:MODEL``; see :func:`refsight.embedders.get_embedder`) or None for the default;
    a name is loaded on first use.
    """

    def __init__(
        self,
        root: Path,
        catalog: Catalog,
        kept_image: Callable[[ReferenceRow], ImageInput],
        *,
        embedder: Embedder | str | None = None,
        progress: Callable[[int, str], AbstractContextManager[Any]] | None = None,
    ) -> None:
        self.root = Path(root)
        self.catalog = catalog
        self._kept_image = kept_image
        self._embedder = embedder
        #: the registry name the embedder is loaded by (None when an Embedder object was given)
        from ..embedders.registry import DEFAULT_EMBEDDER

        self.registry_name: str | None = None if isinstance(embedder, Embedder) else (embedder or DEFAULT_EMBEDDER)
        self._progress = progress
        self._retriever: Retriever | None = None
        self._vectors: VectorDB | None = None
        self._lock = threading.RLock()

    def retriever(self) -> Retriever:
        """The retriever (its embedder loaded now if it was not yet)."""
        with self._lock:  # one retriever for every thread of this engine
            if self._retriever is None:
                self._retriever = Retriever(self.root, self.embedder())
            return self._retriever

    def vector_db(self) -> VectorDB:
        """The retrieval database, its vector cache included, opened without loading any embedder."""
        with self._lock:
            if self._retriever is not None:
                return self._retriever.db
            if self._vectors is None:
                self._vectors = VectorDB(self.root / "retrieval" / DB_NAME)
            return self._vectors

    def embedder(self) -> Embedder:
        """The embedder (loaded from the registry now when it was given by name)."""
        if not isinstance(self._embedder, Embedder):
            from ..embedders.registry import DEFAULT_EMBEDDER, get_embedder

            self._embedder = get_embedder(self._embedder or DEFAULT_EMBEDDER)
        return self._embedder

    def sync(self, namespace: str, *, rebuild: bool = False, scope: str | None = None) -> IndexReport:
        """Bring ``namespace``'s entries up to the catalog (``rebuild``: from scratch); what it did.

        ``scope`` is the namespace's isolation scope (``Engine.context(namespace).scope``; None when
        references are shared): reference vectors are then cached for that tenant alone.
        """
        report = self._sync(namespace, rebuild=rebuild, scope=scope)
        retriever = self.retriever()
        return IndexReport(
            embedder=retriever.embedder_name,
            indexed=retriever.count(namespace),
            embedded_now=report.indexed,
            removed_now=report.removed,
            revision=report.revision,
        )

    def _sync(self, namespace: str, *, rebuild: bool = False, scope: str | None = None) -> SyncReport:
        # Costs two indexed lookups when nothing changed: it runs before every search.
        progress = (lambda total: self._progress(total, "indexing")) if self._progress else None
        return sync_with_catalog(
            self.retriever(), self.catalog, namespace, self._kept_image, rebuild=rebuild, progress_bar=progress,
            scope=scope,
        )

    def search(
        self,
        *,
        text: str | None,
        image: ImageInput | None,
        k: int,
        namespace: str,
        where: Mapping[str, Any] | None = None,
        restrict_to: Sequence[str] | None = None,
        vector: np.ndarray | None = None,
        scope: str | None = None,
    ) -> SearchResult:
        """The ``k`` references of ``namespace`` closest to ``vector``, ``text`` or ``image`` (after a sync).

        ``scope``: the namespace's isolation scope, as for :meth:`sync`.
        """
        self._sync(namespace, scope=scope)
        retriever = self.retriever()
        scope = {"where": where, "namespace": namespace, "ref_ids": restrict_to or None}
        if vector is not None:
            hits = retriever.search_vector(vector, k, **scope)
        elif text is not None:
            hits = retriever.search_text(text, k=k, **scope)
        else:
            assert image is not None
            # Embedded now and never stored (see the module docstring).
            vector = retriever.embedder.embed_images([image])[0]
            hits = retriever.search_vector(vector, k, **scope)
        return SearchResult(retriever.embedder_name, [SearchHit(r, round(float(s), 6)) for r, s in hits])

    def reference_vectors(
        self, references: Sequence[ReferenceRow], embedder: Embedder | None = None, *, scope: str | None = None,
    ) -> np.ndarray:
        """Unit vectors of references under ``embedder`` (default: the index's), from the vector cache.

        Only references whose vector is not cached yet (for ``scope``, see :meth:`sync`) are
        decoded and embedded (then cached).
        """
        retriever = self.retriever()
        embedder = embedder or retriever.embedder
        key = vector_key(embedder.digest, scope)
        shas = [row.image_sha256 for row in references]
        cached = retriever.db.get_vectors(key, shas)
        todo = {row.image_sha256: row for row in references if row.image_sha256 not in cached}
        if todo:
            fresh = embedder.embed_images([self._kept_image(row) for row in todo.values()])
            new = dict(zip(todo, fresh))
            retriever.db.put_vectors(key, new)
            cached.update(new)
        return np.stack([cached[sha] for sha in shas]) if shas else np.zeros((0, embedder.dim), np.float32)

    def forget(self, namespace: str, ref_id: str) -> None:
        """Drop a removed reference's entries (every embedder); needs no model.

        The index must never point at a removed reference. The removal is applied at the
        revision the journal gave it, like any change a sync applies: a sync of an older
        snapshot cannot bring the entry back, and when the id was re-added since (by another
        process), the newer entry stays. Dropping the live entry is enough: every index answer
        is checked against the live entries.
        """
        change = self.catalog.last_change(ref_id, namespace=namespace)
        if change is None or not change[1]:
            return  # re-added meanwhile (or never journaled): the next sync indexes what is there
        if self._retriever is not None:
            self._forget(self._retriever.db, namespace, ref_id, change[0])
            return
        database = self.root / "retrieval" / DB_NAME
        if database.exists():
            vectors = VectorDB(database)
            try:
                self._forget(vectors, namespace, ref_id, change[0])
            finally:
                vectors.close()

    def _forget(self, vectors: VectorDB, namespace: str, ref_id: str, revision: int) -> None:
        for embedder in vectors.embedders_of(namespace):
            done = vectors.apply(embedder, namespace, revision, removals=[ref_id])
            if self._retriever is not None and embedder == self._retriever.embedder.digest:
                self._retriever.forget_labels(namespace, done.dropped)

    def count(self, namespace: str) -> int:
        """Entries indexed for ``namespace``."""
        return self.retriever().count(namespace)

    def close(self) -> None:
        """Close the retriever's files. Idempotent."""
        if self._retriever is not None:
            self._retriever.close()
            self._retriever = None
        if self._vectors is not None:
            self._vectors.close()
            self._vectors = None
