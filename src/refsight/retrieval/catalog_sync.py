"""Keep a retriever's entries equal to one catalog namespace, in O(changes) per sync.

The catalog journals every added, changed and removed reference under a growing
``revision``; the retrieval database remembers the revision its entries reflect. A sync
with nothing new costs two indexed lookups (no listing of references), so it can run
before every search even with a million references. The first sync of a namespace (and
``rebuild``) lists the namespace once and diffs it against the entries in bulk.

Images are decoded and embedded in batches, so the first sync of a large catalog never
holds more than one batch of images in memory.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from refsight.inputs.images import ImageInput
from refsight.retrieval.retriever import Retriever
from refsight.retrieval.vectors import Entry, vector_key
from refsight.store.base import Catalog, ReferenceChanges, ReferenceRow

__all__ = ["SyncReport", "sync_with_catalog"]

#: References decoded and embedded together (bounds memory on a first sync).
BATCH = 64


@dataclass(frozen=True)
class SyncReport:
    """What one sync did: the catalog revision reached, entries (re)indexed and removed."""

    revision: int
    indexed: int
    removed: int
    full: bool  # whether the whole namespace was listed (first sync or rebuild)


def sync_with_catalog(
    retriever: Retriever,
    catalog: Catalog,
    namespace: str,
    load_image: Callable[[ReferenceRow], ImageInput],
    *,
    rebuild: bool = False,
    progress_bar: Callable[[int], AbstractContextManager[Any]] | None = None,
    scope: str | None = None,
) -> SyncReport:
    """Bring ``retriever``'s entries for ``namespace`` up to the catalog's current revision.

    ``load_image`` decodes a reference's kept image (called only for references that need
    embedding); ``progress_bar(total)`` opens a bar (tqdm-like, with ``update(n)``) for the
    references to embed. ``rebuild`` drops the namespace's entries and index files first
    (cached vectors are kept, so only images never embedded by this embedder run the model).
    ``scope`` is the namespace's isolation scope when its tenant is isolated (None: shared): new
    entries then use vectors cached for that scope alone, so indexing time never reveals
    whether another tenant holds an image. Safe to run from several threads and processes at
    once (see :mod:`refsight.retrieval.entry_sync`).
    """
    db, digest = retriever.db, retriever.embedder.digest
    if rebuild:
        retriever.rebuild([], namespace=namespace)
        db.mark_synced(digest, namespace, None)
    synced, changes = _changes(retriever, catalog, namespace)
    if synced is not None and changes.revision == synced:
        return SyncReport(synced, 0, 0, full=False)

    full = synced is None
    indexed = db.entries_by_ref(digest, namespace, None if full else [row.ref_id for row in changes.changed])
    gone = _removed(indexed, changes) if full else changes.removed
    count = _index_changed(retriever, (namespace, scope), changes, indexed, load_image, progress_bar)
    _, removed = retriever.apply(namespace, changes.revision, removals=gone)
    if rebuild:
        retriever.rebuild(namespace=namespace)  # the ANN file now, from the cached vectors
    elif count or removed:
        retriever.flush()
    # Recorded last: a crash before this line only means the next sync redoes the work.
    db.advance_synced(digest, namespace, changes.revision, since=synced)
    return SyncReport(changes.revision, count, removed, full)


def _changes(retriever: Retriever, catalog: Catalog, namespace: str) -> tuple[int | None, ReferenceChanges]:
    """(the revision ``namespace`` was synced at, or None; the catalog's changes since it)."""
    db, digest = retriever.db, retriever.embedder.digest
    synced = db.synced_revision(digest, namespace)
    changes = catalog.changes_since(synced, namespace=namespace)
    if synced is not None and changes.revision < synced:
        # revisions only grow, so this is another catalog (the store was recreated): its
        # revisions say nothing about ours, so forget them and diff everything
        db.forget_revisions(digest, namespace)
        return None, catalog.changes_since(None, namespace=namespace)
    return synced, changes


def _removed(indexed: dict[str, Entry], changes: ReferenceChanges) -> list[str]:
    """On a full diff: the references indexed that the catalog no longer holds."""
    live = {row.ref_id for row in changes.changed}
    return [ref_id for ref_id in indexed if ref_id not in live]


def _index_changed(
    retriever: Retriever, where: tuple[str, str | None], changes: ReferenceChanges, indexed: dict[str, Entry],
    load_image: Callable[[ReferenceRow], ImageInput], progress_bar: Callable[[int], AbstractContextManager[Any]] | None,
) -> int:
    """Apply the changed rows of ``(namespace, scope)`` at the changes' revision, embedding what has no cached vector."""
    namespace, scope = where
    key = vector_key(retriever.embedder.digest, scope)
    stale = [row for row in changes.changed if not _indexed_as(indexed.get(row.ref_id), row)]
    silent = nullcontext(SimpleNamespace(update=lambda n: None))
    count = 0
    with progress_bar(len(stale)) if progress_bar else silent as bar:
        for start in range(0, len(stale), BATCH):
            batch = stale[start : start + BATCH]
            _embed_uncached(retriever, key, scope, batch, load_image)
            count += retriever.apply(namespace, changes.revision, upserts=batch, scope=scope)[0]
            bar.update(len(batch))
    # Rows indexed as they are still move to this revision, so an older snapshot cannot undo them.
    same = [row for row in changes.changed if _indexed_as(indexed.get(row.ref_id), row)]
    for start in range(0, len(same), 4 * BATCH):
        retriever.apply(namespace, changes.revision, upserts=same[start : start + 4 * BATCH])
    return count


def _indexed_as(entry: Entry | None, row: ReferenceRow) -> bool:
    return entry is not None and entry.image_sha256 == row.image_sha256 and entry.metadata == row.metadata


def _embed_uncached(
    retriever: Retriever, key: str, scope: str | None, batch: list[ReferenceRow], load_image: Callable[[ReferenceRow], ImageInput],
) -> None:
    """Embed the rows of ``batch`` without a cached vector under ``key``, in one model pass, and cache them."""
    # Only images without a cached vector are decoded (bulk ingest caches them all).
    cached = retriever.db.get_vectors(key, [row.image_sha256 for row in batch])
    todo = {row.image_sha256: row for row in batch if row.image_sha256 not in cached}
    if todo:
        fresh = retriever.vectors([load_image(row) for row in todo.values()], scope=scope)  # one model pass
        retriever.db.put_vectors(key, dict(zip(todo, fresh)))  # under the catalog's hash: the entries join on it
