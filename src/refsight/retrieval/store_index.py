"""The retrieval side of one store: a retriever that follows the catalog, searches, and forgets.

:class:`StoreIndex` is what the engine holds for recall. It builds the
:class:`~refsight.retrieval.Retriever` (and loads its embedder) on first use, brings its
entries up to date with the catalog before every search (O(changes), see
:mod:`refsight.retrieval.catalog_sync`), and drops a removed reference's entry
without loading any model (:meth:`StoreIndex.forget`, a removal listener).

Query images are embedded and never stored: a compared candidate leaves no vector on disk,
and a query never reads another tenant's cached vector (no timing can depend on one).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from ..images import ImageInput
from ..results import IndexReport, SearchHit, SearchResult
from ..store.base import Catalog, ReferenceRow
from .catalog_sync import SyncReport, sync_with_catalog
from .embedders import Embedder
from .retriever import DB_NAME, Retriever
from .vectors import VectorDB

__all__ = ["StoreIndex"]


class StoreIndex:
    """Retrieval over the store at ``root``; ``embedder=None`` means the default (loaded on first use)."""

    def __init__(
        self,
        root: Path,
        catalog: Catalog,
        kept_image: Callable[[ReferenceRow], ImageInput],
        *,
        embedder: Embedder | None = None,
        progress: Callable[[int, str], AbstractContextManager[Any]] | None = None,
    ) -> None:
        self.root = Path(root)
        self.catalog = catalog
        self._kept_image = kept_image
        self._embedder = embedder
        self._progress = progress
        self._retriever: Retriever | None = None

    def retriever(self) -> Retriever:
        """The retriever (its embedder loaded now if it was not yet)."""
        if self._retriever is None:
            from . import default_embedder

            self._retriever = Retriever(self.root, self._embedder or default_embedder())
        return self._retriever

    def sync(self, namespace: str, *, rebuild: bool = False) -> IndexReport:
        """Bring ``namespace``'s entries up to the catalog (``rebuild``: from scratch); what it did."""
        report = self._sync(namespace, rebuild=rebuild)
        retriever = self.retriever()
        return IndexReport(
            embedder=retriever.embedder_name,
            indexed=retriever.count(namespace),
            embedded_now=report.indexed,
            removed_now=report.removed,
            revision=report.revision,
        )

    def _sync(self, namespace: str, *, rebuild: bool = False) -> SyncReport:
        # Costs two indexed lookups when nothing changed: it runs before every search.
        progress = (lambda total: self._progress(total, "indexing")) if self._progress else None
        return sync_with_catalog(
            self.retriever(), self.catalog, namespace, self._kept_image, rebuild=rebuild, progress_bar=progress
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
    ) -> SearchResult:
        """The ``k`` references of ``namespace`` closest to ``text`` or ``image`` (after a sync)."""
        self._sync(namespace)
        retriever = self.retriever()
        scope = {"where": where, "namespace": namespace, "ref_ids": restrict_to or None}
        if text is not None:
            hits = retriever.search_text(text, k=k, **scope)
        else:
            assert image is not None
            # Embedded now and never stored (see the module docstring).
            vector = retriever.embedder.embed_images([image])[0]
            hits = retriever.search_vector(vector, k, **scope)
        return SearchResult(retriever.embedder_name, [SearchHit(r, round(float(s), 6)) for r, s in hits])

    def forget(self, namespace: str, ref_id: str) -> None:
        """Drop a removed reference's entries (every embedder); needs no model.

        The index must never point at a removed reference. Dropping the live entry is
        enough: every index answer is checked against the live entries.
        """
        if self._retriever is not None:
            self._retriever.remove(ref_id, namespace=namespace)
            return
        database = self.root / "retrieval" / DB_NAME
        if database.exists():
            vectors = VectorDB(database)
            try:
                vectors.delete_ref(namespace, ref_id)
            finally:
                vectors.close()

    def count(self, namespace: str) -> int:
        """Entries indexed for ``namespace``."""
        return self.retriever().count(namespace)

    def close(self) -> None:
        """Close the retriever's files. Idempotent."""
        if self._retriever is not None:
            self._retriever.close()
            self._retriever = None
