"""Nearest-neighbour search over one embedder × namespace: exact when small, HNSW when large.

Library: **hnswlib** (HNSW over float32 vectors, inner product, connectivity 32; wrapped in
ann.py), chosen on ``benchmarks/retrieval.py`` figures: clustered data, dim 512, one query at
a time on one core, recall@10 against brute force in the same run.

- n=1,000,000, two builds: search breadth 128 gave recall 0.983 / 0.984 at p50 1.41 / 1.28 ms
  (1.55 / 1.73 ms through the whole ``Retriever.search_vector`` path), breadth 96 gave 0.970 /
  0.963 at 1.17 / 1.20 ms. The usearch int8 graph
  used before, with its 30 best candidates rescored exactly, needed 1.99-2.21 ms for 0.97
  (breadth 96, three builds), and 2.9-3.5 ms through the store path, which read the float32
  rows from SQLite.
- n=200,000, one run per library, same settings: hnswlib 0.964 at 1.68 ms (breadth 128);
  usearch int8 + rescoring 0.950 at 1.96 ms (96) and 0.968 at 2.24 ms (128).

The walk is bound by memory latency (a million nodes far exceed the caches). hnswlib keeps a
node's vector and links in one block and prefetches the next neighbour's block while it
scores the current one; and its float32 scores are exact, so there is no rescoring read. The
costs: float32 in memory (2,324 bytes per vector at connectivity 32, against 788 for usearch
int8; within 1.3x the raw float32 size), removal only marks a node deleted (a later add
reuses the slot), and pip builds it from source. Also measured and not taken: faiss IVF-SQ8
(nlist 1024) needed nprobe 64 and 4 ms for recall 0.968 at n=200,000; connectivity 16 was
worse than 32 at equal recall (usearch, n=1,000,000).

Layout beside the store::

    <root>/retrieval/vectors.sqlite                  source of truth (see vectors.py)
    <root>/retrieval/<embedder digest>/<namespace>/  one index per embedder and namespace
        hnsw.bin                                     the ANN graph (derived, rebuildable)
        manifest.json                                format, library, dim, dtype

Crash safety. The index file is only ever replaced whole (write a temp file, fsync,
``os.replace``), so it is either the old or the new version, never half-written. It may be
*stale*: on open we reconcile it with the live labels in the database (add what is missing,
mark what was removed deleted), and every result is checked against the live set again at
query time. A file that cannot be loaded, or whose manifest disagrees (an earlier format
included), is rebuilt from the cached vectors.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import numpy as np

from refsight.errors import InvalidInputError
from refsight.support.atomic import replace_atomically
from refsight.retrieval.ann import DEFAULT_GRAPH, AnnIndex
from refsight.retrieval.vectors import VectorDB

__all__ = ["AnnIndex", "VectorIndex", "DEFAULT_GRAPH", "EXACT_THRESHOLD", "FORMAT_VERSION"]

#: Below this many live vectors, search is exact (a matrix product beats any graph here).
EXACT_THRESHOLD = 10_000
#: With a filter matching at most this many entries, search them exactly instead of over-fetching.
EXACT_FILTER_LIMIT = 20_000
#: 2: hnswlib float32 graphs (1 was usearch int8; such files are rebuilt on open).
FORMAT_VERSION = 2
_INDEX_FILE = "hnsw.bin"
_MANIFEST = "manifest.json"
# Files of earlier formats: a rebuild deletes them (a million-vector usearch graph is 800 MB).
_LEGACY_FILES = ("hnsw.usearch", "exact.f32", "exact.labels", "exact.lock")


def checked_breadth(expansion_search: object) -> int:
    """``expansion_search`` if it is a positive integer, else :class:`InvalidInputError`."""
    if not isinstance(expansion_search, int) or isinstance(expansion_search, bool) or expansion_search < 1:
        raise InvalidInputError("expansion_search", f"must be a positive integer, got {expansion_search!r}")
    return expansion_search


class VectorIndex:
    """Search one embedder × namespace; the database is the truth, the ANN file a cache.

    ``search`` returns ``[(label, score)]`` for live labels only, with exact float32 scores.
    """

    def __init__(
        self,
        root: Path,
        db: VectorDB,
        embedder: str,
        namespace: str,
        dim: int,
        *,
        exact_threshold: int = EXACT_THRESHOLD,
        expansion_search: int = DEFAULT_GRAPH["expansion_search"],
    ):
        self.expansion_search = checked_breadth(expansion_search)
        self.directory = Path(root) / embedder / namespace
        self.db, self.embedder, self.namespace, self.dim = db, embedder, namespace, int(dim)
        self.exact_threshold = exact_threshold
        self._ann: AnnIndex | None = None
        self._exact: tuple[np.ndarray, np.ndarray] | None = None  # (labels, vectors) in memory
        self._seen_max = 0  # highest label read from the database into the in-memory structures
        # Syncs, removals, rebuilds and saves of this process's threads, one at a time (searches
        # read a snapshot of the exact arrays, or the graph under its own lock).
        self._lock = threading.RLock()
        self._seen_version: tuple[int, int] | None = None  # database version at the last sync
        self._dirty = False
        self.rebuilt = False  # whether the last open had to rebuild the ANN file

    # -- lifecycle ------------------------------------------------------------------------

    @property
    def mode(self) -> str:
        """``"exact"`` or ``"ann"``: what the next search will use."""
        return "ann" if self.db.count(self.embedder, self.namespace) >= self.exact_threshold else "exact"

    def _sync(self) -> None:
        """Bring the in-memory structures up to date with the database."""
        with self._lock:
            version = self.db.version()
            if version == self._seen_version:
                return  # nothing committed since: skip the O(n) count and label scan
            self._sync_from_db()
            self._seen_version = version

    def _sync_from_db(self) -> None:
        # Labels are handed out in commit order (AUTOINCREMENT under SQLite's write lock), so
        # "every label above the highest one read from the database" is exactly what is new,
        # whichever process or thread committed it. ``_seen_max`` therefore moves only with a
        # database read, never with a label this process wrote itself: a label another writer
        # committed just before ours would otherwise be skipped for good.
        live = self.db.count(self.embedder, self.namespace)
        if live >= self.exact_threshold:
            self._exact = None
            if self._ann is None:
                self._open_ann()
                return
        else:
            self._ann = None
            if self._exact is None or len(self._exact[0]) > 2 * live + 64:
                # First read, or most vectors held belong to labels removed since: read afresh.
                self._exact = self._read_vectors()
                self._seen_max = self._highest(self._exact[0])
                return
        new = self.db.labels(self.embedder, self.namespace, after=self._seen_max)
        if not len(new):
            return
        lbl, vec = self._read_vectors(new)
        if self._ann is not None:
            self._ann.add(lbl, vec)
            self._dirty = True
        else:
            self._append_exact(lbl, vec)
        self._seen_max = max(self._seen_max, int(new.max()))

    def _read_vectors(self, labels: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(labels, vectors) of the live entries among ``labels`` (all when None), vectors ``(n, dim)``.

        Shaped here because the database answers an empty read with a ``(0, 0)`` array, and an
        empty read is an ordinary race: the labels listed a moment ago may since have been removed.
        """
        lbl, vec = self.db.vectors_for_labels(self.embedder, self.namespace, labels)
        return lbl, vec.reshape(len(lbl), self.dim)

    @staticmethod
    def _highest(labels: np.ndarray) -> int:
        return int(labels.max()) if len(labels) else 0

    def _append_exact(self, lbl: np.ndarray, vec: np.ndarray) -> None:
        labels, vectors = self._exact
        vectors = vec if not len(labels) else np.concatenate([vectors, vec])
        self._exact = (np.concatenate([labels, lbl]), vectors)

    def _manifest(self) -> dict[str, Any]:
        return {"format": FORMAT_VERSION, "library": "hnswlib", "dim": self.dim, "dtype": "f32", "metric": "ip"}

    def _open_ann(self) -> None:
        path = self.directory / _INDEX_FILE
        ann = None
        try:
            manifest = json.loads((self.directory / _MANIFEST).read_text())
            if manifest == self._manifest() and path.is_file():
                ann = AnnIndex.load(path, self.dim, self.expansion_search)
        except (OSError, ValueError, RuntimeError, MemoryError):
            ann = None  # missing, truncated or foreign: rebuild below
        if ann is None:
            self.rebuild()
            return
        # reconcile: the file may predate adds (crash before flush) or removes
        live = self.db.labels(self.embedder, self.namespace)
        missing, newly_deleted = ann.retain(live)
        if len(missing):
            ann.add(*self._read_vectors(missing))
        self._ann = ann
        self._seen_max = int(live.max()) if len(live) else 0
        self._dirty = bool(len(missing) or newly_deleted)
        self.rebuilt = False

    def rebuild(self) -> None:
        """Rebuild the ANN file from the cached vectors (no model runs) and save it."""
        with self._lock:
            self._exact = None
            labels, vectors = self._read_vectors()
            ann = AnnIndex(self.dim, expansion_search=self.expansion_search, capacity=len(labels))
            ann.add(labels, vectors)
            self._ann = ann
            self._seen_max = int(labels.max()) if len(labels) else 0
            self._dirty = True
            self.rebuilt = True
            self.flush()
            for name in _LEGACY_FILES:
                (self.directory / name).unlink(missing_ok=True)

    def flush(self) -> None:
        """Persist the ANN index if it changed (exact mode has nothing to persist)."""
        with self._lock:
            if self._ann is None or not self._dirty:
                return
            self.directory.mkdir(parents=True, exist_ok=True)
            # the index file first, then the manifest: a crash in between leaves a valid pair
            # (the manifest only names the format, which does not change between saves)
            self._ann.save(self.directory / _INDEX_FILE)
            _atomic_write_text(self.directory / _MANIFEST, json.dumps(self._manifest(), sort_keys=True))
            self._dirty = False

    # -- updates --------------------------------------------------------------------------

    def removed(self, labels: list[int]) -> None:
        """Tell the index labels were deleted from the database (call after the delete).

        Optional: every answer is checked against the live labels anyway. New labels need no
        telling at all: the next search reads them from the database.
        """
        arr = np.asarray(labels, np.int64)
        if not len(arr):
            return
        with self._lock:
            if self._ann is not None:
                self._ann.remove(arr)
                self._dirty = True
            if self._exact is not None:
                keep = ~np.isin(self._exact[0], arr)
                self._exact = (self._exact[0][keep], self._exact[1][keep])

    def reset(self) -> None:
        """Forget in-memory state and delete the ANN files (after a namespace is cleared)."""
        with self._lock:
            self._ann = self._exact = None
            self._seen_max = 0
            self._seen_version = None
            self._dirty = False
            for name in (_INDEX_FILE, _MANIFEST, *_LEGACY_FILES):
                (self.directory / name).unlink(missing_ok=True)

    # -- search ---------------------------------------------------------------------------

    def search(self, query: np.ndarray, k: int, allowed: np.ndarray | None = None) -> list[tuple[int, float]]:
        """Top-k live labels for a unit query vector, optionally restricted to ``allowed`` labels."""
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise InvalidInputError("k", f"must be a positive integer, got {k!r}")
        query = np.asarray(query, np.float32).reshape(-1)
        if query.shape[0] != self.dim:
            raise InvalidInputError("query", f"has dimension {query.shape[0]}, the index expects {self.dim}")
        self._sync()
        if allowed is not None and len(allowed) == 0:
            return []
        if self._exact is not None:
            labels, vectors = self._exact
            if allowed is not None:
                mask = np.isin(labels, allowed)
                labels, vectors = labels[mask], vectors[mask]
            return _exact_top(labels, vectors, query, k, self._live)
        if allowed is not None and len(allowed) <= EXACT_FILTER_LIMIT:
            labels, vectors = self._read_vectors(allowed)
            return _exact_top(labels, vectors, query, k, self._live)
        return self._ann_search(query, k, allowed)

    def _live(self, labels: np.ndarray) -> set[int]:
        return self.db.live_labels(self.embedder, self.namespace, labels)

    def _ann_search(self, query: np.ndarray, k: int, allowed: np.ndarray | None) -> list[tuple[int, float]]:
        assert self._ann is not None
        allowed_set = None if allowed is None else set(map(int, allowed))
        # The graph's scores are exact (float32), so k is all we need. Labels another process
        # removed since (the graph has not heard yet) fail the liveness check; then, as when a
        # filter leaves too few, the loop asks the graph for more.
        fetch = k if allowed is None else k * 8
        while True:
            labels, scores = self._ann.search(query, fetch)
            if allowed_set is not None:
                keep = np.fromiter((int(c) in allowed_set for c in labels), bool, count=len(labels))
                labels, scores = labels[keep], scores[keep]
            hits = _top_live(labels, scores, k, self._live)
            if len(hits) >= k or fetch >= len(self._ann):
                return hits
            fetch = min(fetch * 4, len(self._ann))  # too few survived the filter: look further


def _exact_top(labels: np.ndarray, vectors: np.ndarray, query: np.ndarray, k: int, live) -> list[tuple[int, float]]:
    return _top_live(labels, vectors @ query if len(labels) else np.zeros(0, np.float32), k, live)


def _top_live(labels: np.ndarray, scores: np.ndarray, k: int, live) -> list[tuple[int, float]]:
    """The k best (label, score) whose labels ``live`` confirms, checked best first in chunks."""
    order = np.argsort(-scores, kind="stable")
    out: list[tuple[int, float]] = []
    start = 0
    while len(out) < k and start < len(order):
        chunk = order[start : start + 2 * k]
        # the graph and exact mode read from memory, which another process may have made stale
        alive = live(labels[chunk])
        out += [(int(labels[i]), float(scores[i])) for i in chunk if int(labels[i]) in alive]
        start += len(chunk)
    return out[:k]


def _atomic_write_text(path: Path, text: str) -> None:
    replace_atomically(path, lambda tmp: Path(tmp).write_text(text))
