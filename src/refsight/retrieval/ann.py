"""The HNSW graph: hnswlib over float32 unit vectors, inner product, integer labels.

hnswlib keeps each node's vector and its bottom-layer links in one block and prefetches the
next neighbour's block while it scores the current one, so a walk that is bound by memory
latency (a million nodes far exceed the caches) waits less per node than libraries that keep
vectors and links apart. It stores float32 only, so its scores are exact and need no rescoring.

hnswlib cannot unlink a node: a removed label is *marked* deleted (never returned, still
walked through) and its slot is reused by a later add. hnswlib does not report how many
slots are deleted, so this wrapper counts them: exactly after :meth:`AnnIndex.retain`, and
kept up to date by :meth:`AnnIndex.remove` and :meth:`AnnIndex.add` from then on.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

from refsight.support.locks import ReadWriteLock
from refsight.support.atomic import replace_atomically

__all__ = ["DEFAULT_GRAPH", "AnnIndex"]

#: HNSW settings: graph degree, build breadth and search breadth. ``benchmarks/retrieval.py`` at
#: n=1,000,000, dim=512, two builds: breadth 96 gave recall@10 0.970 / 0.963 at p50 1.17 / 1.20 ms,
#: 128 gave 0.983 / 0.984 at 1.41 / 1.28 ms, 160 gave 0.991 / 0.990 at 1.65 / 1.64 ms. 128 keeps
#: recall clear of 0.95 on a harder, smaller set too (0.962 at n=200,000, where 96 gave 0.935).
DEFAULT_GRAPH = {"connectivity": 32, "expansion_add": 200, "expansion_search": 128}
_MIN_CAPACITY = 1024
# hnswlib's file header: offsetLevel0, max_elements, count, size_per_element, label_offset, data_offset
_HEADER = struct.Struct("<6Q")


class AnnIndex:
    """An hnswlib HNSW graph over unit vectors (inner product), keyed by integer labels.

    Thread-safe: searches and saves share a readers-writer lock and run side by side (hnswlib
    releases the GIL while it walks); adds, removals and breadth changes take it alone, since
    hnswlib's resize and delete marks may not run beside a search.
    """

    def __init__(
        self,
        dim: int,
        *,
        connectivity: int = DEFAULT_GRAPH["connectivity"],
        expansion_add: int = DEFAULT_GRAPH["expansion_add"],
        expansion_search: int = DEFAULT_GRAPH["expansion_search"],
        capacity: int = _MIN_CAPACITY,
        _empty: bool = False,
    ):
        import hnswlib

        self.dim = int(dim)
        self._lock = ReadWriteLock()
        self._deleted: int | None = 0  # slots holding a deleted label; None: unknown (after a load)
        self._index = hnswlib.Index(space="ip", dim=self.dim)
        if not _empty:
            self._index.init_index(max_elements=max(int(capacity), 1), M=connectivity,
                                   ef_construction=expansion_add, allow_replace_deleted=True)
        self._index.set_ef(int(expansion_search))

    @property
    def expansion_search(self) -> int:
        """HNSW search breadth (higher: better recall, slower)."""
        return int(self._index.ef)

    @expansion_search.setter
    def expansion_search(self, value: int) -> None:
        with self._lock.writing():
            self._index.set_ef(int(value))

    def __len__(self) -> int:
        """Live labels held (deleted slots not counted)."""
        return self._index.element_count - (self._deleted or 0)

    def keys(self) -> np.ndarray:
        """Every label with a slot, deleted ones included until their slot is reused (int64)."""
        with self._lock.reading():
            return np.asarray(self._index.get_ids_list(), dtype=np.int64)

    def retain(self, live: np.ndarray) -> tuple[np.ndarray, int]:
        """Mark every held label not in ``live`` deleted.

        Returns the live labels not held and how many labels this call newly marked (labels
        already marked in a saved file do not count: the file needs no rewrite for them).
        This is how a loaded graph is reconciled with the database, and it makes the
        deleted-slot count exact again.
        """
        live = np.asarray(live, np.int64)
        held = self.keys()
        dead = np.setdiff1d(held, live, assume_unique=True)
        marked = 0
        with self._lock.writing():
            for label in dead:
                try:
                    self._index.mark_deleted(int(label))
                    marked += 1
                except RuntimeError:
                    pass  # deleted already: still a deleted slot, counted below
            self._deleted = len(dead)
        return np.setdiff1d(live, held, assume_unique=True), marked

    def add(self, labels: np.ndarray, vectors: np.ndarray) -> None:
        """Add vectors under labels (labels must be new); reuses deleted slots first."""
        labels = np.asarray(labels, np.uint64).reshape(-1)
        if not len(labels):
            return
        vectors = np.ascontiguousarray(vectors, np.float32).reshape(len(labels), self.dim)
        with self._lock.writing():
            deleted = self._deleted or 0
            needed = self._index.element_count + max(0, len(labels) - deleted)
            if needed > self._index.max_elements:
                self._index.resize_index(max(needed, 2 * self._index.max_elements, _MIN_CAPACITY))
            self._index.add_items(vectors, labels, num_threads=-1, replace_deleted=True)
            if self._deleted is not None:
                self._deleted = max(0, deleted - len(labels))

    def remove(self, labels: np.ndarray) -> None:
        """Mark labels deleted (absent or already deleted ones are ignored)."""
        with self._lock.writing():
            for label in np.asarray(labels, np.int64).reshape(-1):
                try:
                    self._index.mark_deleted(int(label))
                except RuntimeError:
                    continue  # not held, or deleted already
                if self._deleted is not None:
                    self._deleted += 1

    def search(self, query: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Up to k (labels, exact scores) by descending inner product, one thread."""
        k = min(int(k), len(self))
        q = np.asarray(query, np.float32).reshape(1, -1)
        with self._lock.reading():
            while k > 0:
                try:
                    labels, distances = self._index.knn_query(q, k=k, num_threads=1)
                    # hnswlib's "ip" distance is 1 - dot
                    return labels[0].astype(np.int64), (1.0 - distances[0]).astype(np.float32)
                except RuntimeError:
                    k //= 2  # fewer live nodes reachable than asked for (many deletions)
        return np.zeros(0, np.int64), np.zeros(0, np.float32)

    def save(self, path: Path) -> None:
        """Write atomically: a temp file in the same folder, fsync, then rename over ``path``."""
        def write(tmp: str) -> None:
            with self._lock.reading():  # a save only reads: searches may overlap it, changes wait
                self._index.save_index(tmp)

        replace_atomically(Path(path), write)

    @classmethod
    def load(cls, path: Path, dim: int, expansion_search: int = DEFAULT_GRAPH["expansion_search"]) -> AnnIndex:
        """Load a saved graph; raises ``ValueError``/``RuntimeError``/``OSError`` if unreadable.

        Its deleted-slot count is unknown until :meth:`retain` is called.
        """
        path = Path(path)
        with open(path, "rb") as f:
            header = f.read(_HEADER.size)
        if len(header) < _HEADER.size:
            raise ValueError(f"{path} is too short to be an hnswlib index")
        label_offset, data_offset = _HEADER.unpack(header)[4:6]
        if label_offset - data_offset != 4 * int(dim):  # hnswlib itself never checks the dimension
            raise ValueError(f"{path} holds vectors of {(label_offset - data_offset) // 4} dims, expected {dim}")
        idx = cls(dim, expansion_search=expansion_search, _empty=True)
        idx._index.load_index(str(path), max_elements=0, allow_replace_deleted=True)
        idx._index.set_ef(int(expansion_search))  # a search setting: not taken from the file
        idx._deleted = None
        return idx
