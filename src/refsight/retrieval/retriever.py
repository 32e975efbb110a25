"""The retrieval stage: embed references once, recall a shortlist by text or by image.

``Retriever(root, embedder)`` keeps everything under ``<root>/retrieval/`` (``root`` is the
store root): the SQLite database of cached vectors and live entries, and one ANN index folder
per embedder digest and namespace. It does not know about packages or backends; the engine
calls ``add``/``remove`` alongside the store.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import numpy as np

from refsight.errors import InvalidInputError, ReferenceNotFoundError
from refsight.inputs.images import ImageInput
from refsight.embedders.base import Embedder
from refsight.retrieval.index import DEFAULT_GRAPH, EXACT_THRESHOLD, VectorIndex, checked_breadth
from refsight.retrieval.vectors import VectorDB, validate_where, vector_key

__all__ = ["Retriever"]

DB_NAME = "vectors.sqlite"


def _check_namespace(namespace: object) -> str:
    # namespaces name a folder, so they follow the reference-id rules
    from refsight.inputs.ref_ids import validate_ref_id

    if not isinstance(namespace, str):
        raise InvalidInputError(namespace, "a namespace must be a string")
    try:
        return validate_ref_id(namespace)
    except InvalidInputError as exc:
        raise InvalidInputError(namespace, f"invalid namespace: {exc.reason}") from None


class Retriever(AbstractContextManager):
    """Embedding cache + per-namespace index for one embedder under ``<root>/retrieval``."""

    def __init__(
        self,
        root: Path | str,
        embedder: Embedder,
        *,
        exact_threshold: int = EXACT_THRESHOLD,
        expansion_search: int = DEFAULT_GRAPH["expansion_search"],
    ):
        if not isinstance(embedder, Embedder):
            raise InvalidInputError("embedder", f"expected an Embedder, got {type(embedder).__name__}")
        #: HNSW search breadth for large namespaces: higher gives better recall, slower searches
        self.expansion_search = checked_breadth(expansion_search)
        self.root = Path(root) / "retrieval"
        self.embedder = embedder
        self.db = VectorDB(self.root / DB_NAME)
        self.exact_threshold = exact_threshold
        self._indexes: dict[str, VectorIndex] = {}
        self._lock = threading.Lock()

    @property
    def embedder_name(self) -> str:
        """The embedder's short name (reported with search results)."""
        return self.embedder.name

    def _index(self, namespace: str) -> VectorIndex:
        namespace = _check_namespace(namespace)
        with self._lock:  # one index per namespace, whichever thread asks first
            idx = self._indexes.get(namespace)
            if idx is None:
                idx = VectorIndex(
                    self.root, self.db, self.embedder.digest, namespace, self.embedder.dim,
                    exact_threshold=self.exact_threshold, expansion_search=self.expansion_search,
                )
                self._indexes[namespace] = idx
            return idx

    # -- embedding cache ------------------------------------------------------------------

    def vectors(self, images: list[ImageInput], *, scope: str | None = None) -> np.ndarray:
        """Vectors for these images, computing only those not cached under this embedder (and ``scope``)."""
        digest = vector_key(self.embedder.digest, scope)
        cached = self.db.get_vectors(digest, [im.sha256 for im in images])
        todo = [im for im in dict((im.sha256, im) for im in images).values() if im.sha256 not in cached]
        if todo:
            fresh = self.embedder.embed_images(todo)
            new = {im.sha256: v for im, v in zip(todo, fresh)}
            self.db.put_vectors(digest, new)
            cached.update(new)
        return np.stack([cached[im.sha256] for im in images]) if images else np.zeros((0, self.embedder.dim), np.float32)

    # -- updates --------------------------------------------------------------------------

    def add(self, ref_id: str, image: ImageInput, metadata: Mapping[str, Any] | None = None, namespace: str = "default") -> None:
        """Index a reference (replacing any earlier entry with this id); embeds at most once per image."""
        from refsight.inputs.ref_ids import validate_ref_id

        validate_ref_id(ref_id)
        if not isinstance(image, ImageInput):
            raise InvalidInputError("image", f"expected an ImageInput, got {type(image).__name__}")
        self.add_vector(ref_id, image.sha256, self.vectors([image])[0], metadata, namespace=namespace)

    def add_vector(
        self, ref_id: str, image_sha256: str, vec: np.ndarray, metadata: Mapping[str, Any] | None = None,
        namespace: str = "default",
    ) -> None:
        """Index a reference whose vector under this embedder is already known (no image, no model)."""
        from refsight.inputs.ref_ids import validate_ref_id

        validate_ref_id(ref_id)
        metadata = dict(metadata or {})
        idx = self._index(namespace)
        # The vector, then the entry: the index reads every new label, with its vector, from the
        # database at its next search (what it has not read yet is never lost, see index.py).
        self.db.put_vectors(self.embedder.digest, {image_sha256: vec})
        _, old = self.db.upsert_entry(self.embedder.digest, namespace, ref_id, image_sha256, metadata)
        if old is not None:
            idx.removed([old])

    def apply(
        self, namespace: str, revision: int, *, upserts: Sequence[tuple[str, str, Mapping[str, Any]]] = (),
        removals: Sequence[str] = (), scope: str | None = None,
    ) -> tuple[int, int]:
        """Bring these references to the catalog's state at ``revision``; returns (indexed, removed).

        ``upserts`` are ``(ref_id, image_sha256, metadata)`` whose vectors are cached already. A
        reference whose entry reflects ``revision`` or later is left as it is (see
        :mod:`refsight.retrieval.entry_sync`): concurrent syncs never undo each other. New entries
        use the vectors cached under ``scope``.
        """
        self._index(namespace)  # the namespace is checked before anything is written
        done = self.db.apply(self.embedder.digest, namespace, revision, upserts=upserts, removals=removals, scope=scope)
        self.forget_labels(namespace, done.dropped)
        return done.indexed, done.removed

    def forget_labels(self, namespace: str, labels: Sequence[int]) -> None:
        """Tell the namespace's index that these labels left the database (saves it checking them)."""
        self._index(namespace).removed(list(labels))

    def remove(self, ref_id: str, namespace: str = "default") -> bool:
        """Remove a reference from every embedder's index in this namespace; False if absent."""
        idx = self._index(namespace)
        removed = self.db.delete_ref(namespace, ref_id)
        mine = [label for digest, label in removed if digest == self.embedder.digest]
        idx.removed(mine)
        # other embedders' index files still hold their labels: harmless, since every result is
        # checked against the live entries and reconciled on the next open
        return bool(removed)

    def rebuild(self, items: Iterable[tuple[str, ImageInput, Mapping[str, Any]]] | None = None, namespace: str = "default") -> int:
        """Rebuild the namespace from scratch; returns the number of entries.

        With ``items`` the namespace's entries are replaced by exactly these (cached vectors are
        reused, new images embedded). With ``None`` the index is rebuilt from the database alone,
        which never needs the model.
        """
        idx = self._index(namespace)
        if items is not None:
            items = list(items)
            for i, item in enumerate(items):
                if not (isinstance(item, tuple) and len(item) == 3 and isinstance(item[1], ImageInput)):
                    raise InvalidInputError(f"items[{i}]", "expected (ref_id, ImageInput, metadata)")
            self.vectors([im for _, im, _ in items])  # batch-embed what is not cached
            self.db.clear_namespace(self.embedder.digest, namespace)
            idx.reset()
            for ref_id, image, metadata in items:
                self.db.upsert_entry(self.embedder.digest, namespace, ref_id, image.sha256, dict(metadata or {}))
        count = self.db.count(self.embedder.digest, namespace)
        idx.reset()
        if count >= self.exact_threshold:
            idx.rebuild()
        return count

    def flush(self) -> None:
        """Persist every ANN index that changed (call before exit; a crash only costs catch-up time)."""
        for idx in self._indexes.values():
            idx.flush()

    def close(self) -> None:
        """Flush and close the database."""
        self.flush()
        self.db.close()

    def __exit__(self, *exc: object) -> None:
        self.close()  # ``with Retriever(...)``: AbstractContextManager's __enter__ returns the retriever

    # -- queries --------------------------------------------------------------------------

    def __len__(self) -> int:
        return self.db.count(self.embedder.digest, "default")

    def count(self, namespace: str = "default") -> int:
        """Live entries in a namespace for this embedder."""
        return self.db.count(self.embedder.digest, _check_namespace(namespace))

    def metadata(self, ref_id: str, namespace: str = "default") -> dict[str, Any]:
        """The metadata stored with an indexed reference."""
        entry = self.db.entry_for_ref(self.embedder.digest, _check_namespace(namespace), ref_id)
        if entry is None:
            raise ReferenceNotFoundError(ref_id)
        return entry.metadata

    def search_text(self, query: str, k: int = 10, where: Mapping[str, Any] | None = None, namespace: str = "default",
                    instruction: str | None = None, ref_ids: Sequence[str] | None = None) -> list[tuple[str, float]]:
        """References best matching a text, as [(ref_id, score)], best first."""
        if not isinstance(query, str) or not query.strip():
            raise InvalidInputError(query, "a text query must be a non-empty string")
        return self.search_vector(self.embedder.embed_texts([query], instruction)[0], k, where, namespace, ref_ids)

    def search_image(self, image: ImageInput, k: int = 10, where: Mapping[str, Any] | None = None,
                     namespace: str = "default", ref_ids: Sequence[str] | None = None) -> list[tuple[str, float]]:
        """References most similar to an image, as [(ref_id, score)], best first."""
        if not isinstance(image, ImageInput):
            raise InvalidInputError("image", f"expected an ImageInput, got {type(image).__name__}")
        return self.search_vector(self.vectors([image])[0], k, where, namespace, ref_ids)

    def search_vector(self, vector: np.ndarray, k: int = 10, where: Mapping[str, Any] | None = None,
                      namespace: str = "default", ref_ids: Sequence[str] | None = None) -> list[tuple[str, float]]:
        """Search with a ready query vector in this embedder's space.

        ``where`` keeps references whose metadata matches; ``ref_ids`` keeps only those
        references (both are exact searches over the allowed set when it is small).
        """
        where = validate_where(where)
        idx = self._index(namespace)
        digest = self.embedder.digest
        allowed = self.db.filtered_labels(digest, namespace, where) if where else None
        if ref_ids is not None:
            if isinstance(ref_ids, str):
                raise InvalidInputError("ref_ids", "expected a list of reference ids, got a single string")
            chosen = np.fromiter((e.label for e in self.db.entries_by_ref(digest, namespace, ref_ids).values()), np.int64)
            allowed = chosen if allowed is None else np.intersect1d(allowed, chosen)
        hits = idx.search(vector, k, allowed)
        entries = self.db.entries(self.embedder.digest, namespace, [label for label, _ in hits])
        # the final liveness check: a label deleted since the index answered is dropped here
        return [(entries[label].ref_id, score) for label, score in hits if label in entries]
