"""Nearest-neighbour search over one embedder × namespace: exact when small, HNSW when large.

Library: **usearch** (HNSW, int8-quantised vectors, inner product, connectivity 32), with the
top ``3k`` candidates rescored against exact float32 vectors (a memory-mapped copy beside the
graph, see exact_copy.py; the database when the copy lacks a row). Chosen after
``benchmarks/retrieval.py`` runs (n=20,000, dim=512, clustered data, 2 busy cores): at equal
graph settings usearch, faiss (``IndexHNSWFlat``/``IndexHNSWSQ``) and hnswlib reached the same
recall (0.74–0.78 at ef=96 on that hard small set), faiss was a little faster per query, and
int8 cut the index to ~660 bytes/vector against ~2,200 for float32. The deciding features are
usearch's: ``remove`` by key (faiss HNSW cannot remove; hnswlib only marks deleted and stores
float32 only), int8 storage with a one-file atomic ``save``/``load``, and multi-threaded build.
The int8 graph misorders near-ties (recall plateaus near 0.96 alone); rescoring 3k candidates
with exact vectors brings it to ~1.0 at the same ef (measured at n=20,000). Rescoring more
candidates (the whole ef-sized pool) gained nothing at n=200,000: past that, recall is bounded
by the graph walk, and the walk is bound by memory latency (p50 barely moves from 200k to 1M).
faiss IVF-SQ8 (nlist 1024) needed nprobe 64 and 4 ms for recall 0.968 at n=200,000: no better.

Layout beside the store::

    <root>/retrieval/vectors.sqlite                  source of truth (see vectors.py)
    <root>/retrieval/<embedder digest>/<namespace>/  one index per embedder and namespace
        hnsw.usearch                                 the ANN graph (derived, rebuildable)
        manifest.json                                format, library, dim, dtype
        exact.f32, exact.labels                      float32 rows for rescoring (derived)

Crash safety. The index file is only ever replaced whole (write a temp file, fsync,
``os.replace``), so it is either the old or the new version, never half-written. It may be
*stale*: on open we reconcile it with the live labels in the database (add what is missing,
drop what was removed), and every result is checked against the live set again at query time.
A file that cannot be loaded, or whose manifest disagrees, is rebuilt from the cached vectors.
The float32 copy has its own append-only crash story (exact_copy.py) and the same fallback.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from refsight.errors import InvalidInputError
from refsight.retrieval.exact_copy import ExactCopy
from refsight.retrieval.vectors import VectorDB

__all__ = ["AnnIndex", "VectorIndex", "DEFAULT_GRAPH", "EXACT_THRESHOLD", "FORMAT_VERSION"]

#: Below this many live vectors, search is exact (a matrix product beats any graph here).
EXACT_THRESHOLD = 10_000
#: With a filter matching at most this many entries, search them exactly instead of over-fetching.
EXACT_FILTER_LIMIT = 20_000
FORMAT_VERSION = 1
#: The float32 copy is rewritten on open once it holds more than twice the live rows plus this.
COPY_SLACK_ROWS = 1000
#: HNSW settings: graph degree, build breadth and search breadth. From ``benchmarks/retrieval.py``
#: at n=1,000,000, dim=512 on 2 cores, three builds: search breadth 96 gave recall@10 0.969-0.970
#: at p50 1.99-2.21 ms; 80 gave 0.949-0.954 at 1.78-2.12 ms; 128 gave 0.985 at 2.32-2.61 ms.
#: 96 keeps recall clear of 0.95 for a shortlist the VLM judges. Connectivity 16 was worse at
#: equal recall (0.963 needed breadth 160: 2.28 ms).
DEFAULT_GRAPH = {"connectivity": 32, "expansion_add": 200, "expansion_search": 96}
_INDEX_FILE = "hnsw.usearch"
_MANIFEST = "manifest.json"


def checked_breadth(expansion_search: object) -> int:
    """``expansion_search`` if it is a positive integer, else :class:`InvalidInputError`."""
    if not isinstance(expansion_search, int) or isinstance(expansion_search, bool) or expansion_search < 1:
        raise InvalidInputError("expansion_search", f"must be a positive integer, got {expansion_search!r}")
    return expansion_search


class AnnIndex:
    """A usearch HNSW index over unit vectors (inner product), keyed by integer labels."""

    def __init__(
        self,
        dim: int,
        *,
        dtype: str = "i8",
        connectivity: int = DEFAULT_GRAPH["connectivity"],
        expansion_add: int = DEFAULT_GRAPH["expansion_add"],
        expansion_search: int = DEFAULT_GRAPH["expansion_search"],
    ):
        from usearch.index import Index

        self.dim = int(dim)
        self.dtype = dtype
        self._index = Index(
            ndim=self.dim,
            metric="ip",
            dtype=dtype,
            connectivity=connectivity,
            expansion_add=expansion_add,
            expansion_search=expansion_search,
        )

    @property
    def expansion_search(self) -> int:
        """HNSW search breadth (higher: better recall, slower)."""
        return int(self._index.expansion_search)

    @expansion_search.setter
    def expansion_search(self, value: int) -> None:
        self._index.expansion_search = int(value)

    def __len__(self) -> int:
        return len(self._index)

    def keys(self) -> np.ndarray:
        """All labels held (int64)."""
        return np.asarray(self._index.keys, dtype=np.int64) if len(self._index) else np.zeros(0, np.int64)

    def add(self, labels: np.ndarray, vectors: np.ndarray) -> None:
        """Add vectors under labels (labels must not be present already)."""
        if len(labels):
            self._index.add(np.asarray(labels, np.uint64), np.ascontiguousarray(vectors, np.float32), threads=0)

    def remove(self, labels: np.ndarray) -> None:
        """Remove labels (absent ones are ignored)."""
        if len(labels):
            self._index.remove(np.asarray(labels, np.uint64))

    def search(self, query: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Up to k (labels, scores) by descending inner product, one thread."""
        k = min(int(k), len(self._index))
        if k <= 0:
            return np.zeros(0, np.int64), np.zeros(0, np.float32)
        m = self._index.search(np.asarray(query, np.float32), k, threads=1)
        # usearch's "ip" distance is 1 - dot
        return np.asarray(m.keys, np.int64), (1.0 - np.asarray(m.distances, np.float32))

    def save(self, path: Path) -> None:
        """Write atomically: a temp file in the same folder, fsync, then rename over ``path``."""
        path = Path(path)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
        os.close(fd)
        try:
            self._index.save(tmp)
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    @classmethod
    def load(cls, path: Path, dim: int, dtype: str, expansion_search: int = DEFAULT_GRAPH["expansion_search"]) -> "AnnIndex":
        """Load a saved index; raises ``ValueError``/``RuntimeError``/``OSError`` if unreadable."""
        idx = cls(dim, dtype=dtype)
        idx._index.load(str(path))
        idx.expansion_search = expansion_search  # a search setting: not taken from the file
        if idx._index.ndim != dim:
            raise ValueError(f"index has dim {idx._index.ndim}, expected {dim}")
        return idx


class VectorIndex:
    """Search one embedder × namespace; the database is the truth, the ANN file a cache.

    ``search`` returns ``[(label, score)]`` for live labels only, scored exactly with the
    float32 vectors from the database (the int8 graph only proposes candidates).
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
        dtype: str = "i8",
        expansion_search: int = DEFAULT_GRAPH["expansion_search"],
    ):
        self.expansion_search = checked_breadth(expansion_search)
        self.directory = Path(root) / embedder / namespace
        self.db, self.embedder, self.namespace, self.dim = db, embedder, namespace, int(dim)
        self.exact_threshold = exact_threshold
        self.dtype = dtype
        self._ann: AnnIndex | None = None
        self._copy: ExactCopy | None = None  # float32 rows for rescoring, beside the graph
        self._exact: tuple[np.ndarray, np.ndarray] | None = None  # (labels, vectors) in memory
        self._seen_max = 0  # highest label merged into the in-memory structures
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
        version = self.db.version()
        if version == self._seen_version:
            return  # nothing committed since: skip the O(n) count and label scan
        self._sync_from_db()
        self._seen_version = version

    def _sync_from_db(self) -> None:
        live = self.db.count(self.embedder, self.namespace)
        if live < self.exact_threshold:
            self._ann = self._copy = None
            if self._exact is None:
                self._exact = self.db.vectors_for_labels(self.embedder, self.namespace)
                self._seen_max = int(self._exact[0].max()) if len(self._exact[0]) else 0
            else:
                new = self.db.labels(self.embedder, self.namespace, after=self._seen_max)
                if len(new):
                    lbl, vec = self.db.vectors_for_labels(self.embedder, self.namespace, new)
                    self._append_exact(lbl, vec)
            return
        self._exact = None
        if self._ann is None:
            self._open_ann()
        else:
            self._copy.refresh()  # rows other processes wrote since
            new = self.db.labels(self.embedder, self.namespace, after=self._seen_max)
            if len(new):
                lbl, vec = self.db.vectors_for_labels(self.embedder, self.namespace, new)
                self._ann.add(lbl, vec)
                self._copy.append(lbl, vec)
                self._seen_max = int(new.max())
                self._dirty = True

    def _append_exact(self, lbl: np.ndarray, vec: np.ndarray) -> None:
        labels, vectors = self._exact
        vectors = vec if not len(labels) else np.concatenate([vectors, vec])
        self._exact = (np.concatenate([labels, lbl]), vectors)
        self._seen_max = max(self._seen_max, int(lbl.max()))

    def _manifest(self) -> dict[str, Any]:
        return {"format": FORMAT_VERSION, "library": "usearch", "dim": self.dim, "dtype": self.dtype, "metric": "ip"}

    def _open_ann(self) -> None:
        path = self.directory / _INDEX_FILE
        ann = None
        try:
            manifest = json.loads((self.directory / _MANIFEST).read_text())
            if manifest == self._manifest() and path.is_file():
                ann = AnnIndex.load(path, self.dim, self.dtype, self.expansion_search)
        except (OSError, ValueError, RuntimeError):
            ann = None  # missing, truncated or foreign: rebuild below
        if ann is None:
            self.rebuild()
            return
        # reconcile: the file may predate adds (crash before flush) or removes
        live = self.db.labels(self.embedder, self.namespace)
        held = ann.keys()
        missing = np.setdiff1d(live, held, assume_unique=True)
        dead = np.setdiff1d(held, live, assume_unique=True)
        if len(dead):
            ann.remove(dead)
        if len(missing):
            lbl, vec = self.db.vectors_for_labels(self.embedder, self.namespace, missing)
            ann.add(lbl, vec)
        self._ann = ann
        self._seen_max = int(live.max()) if len(live) else 0
        self._dirty = bool(len(dead) or len(missing))
        self.rebuilt = False
        self._open_copy(live)

    def _open_copy(self, live: np.ndarray) -> None:
        """Open the float32 copy and fill in what it lacks; rewrite it when mostly dead rows."""
        copy = self._copy = ExactCopy(self.directory, self.dim)
        lacking = np.setdiff1d(live, copy.held(), assume_unique=True)
        if copy.rows_written > 2 * len(live) + COPY_SLACK_ROWS or len(lacking) > len(live) // 2:
            copy.replace(*self.db.vectors_for_labels(self.embedder, self.namespace))
        elif len(lacking):
            copy.append(*self.db.vectors_for_labels(self.embedder, self.namespace, lacking))
            self._dirty = True

    def rebuild(self) -> None:
        """Rebuild the ANN file from the cached vectors (no model runs) and save it."""
        self._exact = None
        labels, vectors = self.db.vectors_for_labels(self.embedder, self.namespace)
        ann = AnnIndex(self.dim, dtype=self.dtype, expansion_search=self.expansion_search)
        ann.add(labels, vectors)
        self._ann = ann
        self._copy = ExactCopy(self.directory, self.dim)
        self._copy.replace(labels, vectors)
        self._seen_max = int(labels.max()) if len(labels) else 0
        self._dirty = True
        self.rebuilt = True
        self.flush()

    def flush(self) -> None:
        """Persist the ANN index if it changed (exact mode has nothing to persist)."""
        if self._ann is None or not self._dirty:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        self._copy.flush()
        # the index file first, then the manifest: a crash in between leaves a valid pair
        # (the manifest only names the format, which does not change between saves)
        self._ann.save(self.directory / _INDEX_FILE)
        _atomic_write_text(self.directory / _MANIFEST, json.dumps(self._manifest(), sort_keys=True))
        self._dirty = False

    # -- updates --------------------------------------------------------------------------

    def added(self, label: int, vector: np.ndarray) -> None:
        """Tell the index a label was inserted in the database (call after the insert)."""
        if self._ann is not None:
            self._ann.add(np.array([label], np.int64), vector[None, :])
            self._copy.append(np.array([label], np.int64), vector[None, :])
            self._seen_max = max(self._seen_max, int(label))
            self._dirty = True
        elif self._exact is not None:
            self._append_exact(np.array([label], np.int64), vector[None, :].astype(np.float32))

    def removed(self, labels: list[int]) -> None:
        """Tell the index labels were deleted from the database (call after the delete)."""
        arr = np.asarray(labels, np.int64)
        if self._ann is not None and len(arr):
            self._ann.remove(arr)
            self._dirty = True
        if self._exact is not None and len(arr):
            keep = ~np.isin(self._exact[0], arr)
            self._exact = (self._exact[0][keep], self._exact[1][keep])

    def reset(self) -> None:
        """Forget in-memory state and delete the ANN files (after a namespace is cleared)."""
        self._ann = self._exact = None
        self._seen_max = 0
        self._seen_version = None
        self._dirty = False
        if self.directory.is_dir():
            (self._copy or ExactCopy(self.directory, self.dim)).clear()
        self._copy = None
        for name in (_INDEX_FILE, _MANIFEST):
            try:
                (self.directory / name).unlink()
            except FileNotFoundError:
                pass

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
            labels, vectors = self.db.vectors_for_labels(self.embedder, self.namespace, allowed)
            return _exact_top(labels, vectors, query, k, self._live)
        return self._ann_search(query, k, allowed)

    def _live(self, labels: np.ndarray) -> set[int]:
        return self.db.live_labels(self.embedder, self.namespace, labels)

    def _exact_vectors(self, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Float32 vectors for these labels: from the copy beside the graph, else the database."""
        found, vectors, lacking = self._copy.get(labels)
        if len(lacking):  # not copied yet (another process added them): the database has them
            lbl, vec = self.db.vectors_for_labels(self.embedder, self.namespace, lacking)
            if len(lbl):
                found, vectors = np.concatenate([found, lbl]), np.concatenate([vectors, vec])
        return found, vectors

    def _ann_search(self, query: np.ndarray, k: int, allowed: np.ndarray | None) -> list[tuple[int, float]]:
        assert self._ann is not None
        allowed_set = None if allowed is None else set(map(int, allowed))
        # the int8 graph misorders near-ties; rescoring 3k candidates restores recall (benchmarked)
        fetch = k * 3 if allowed is None else k * 8
        while True:
            cand, _ = self._ann.search(query, fetch)
            if allowed_set is not None:
                cand = np.asarray([c for c in cand if int(c) in allowed_set], np.int64)
            # rescore with the exact float32 vectors, keeping live labels only
            labels, vectors = self._exact_vectors(cand)
            hits = _exact_top(labels, vectors, query, k, self._live)
            if len(hits) >= k or fetch >= len(self._ann):
                return hits
            fetch = min(fetch * 4, len(self._ann))  # too few survived the filter: look further


def _exact_top(labels: np.ndarray, vectors: np.ndarray, query: np.ndarray, k: int, live) -> list[tuple[int, float]]:
    if not len(labels):
        return []
    scores = vectors @ query
    order = np.argsort(-scores, kind="stable")
    if live is None:
        return [(int(labels[i]), float(scores[i])) for i in order[:k]]
    # exact mode reads from memory, which another process may have made stale: confirm liveness
    out: list[tuple[int, float]] = []
    start = 0
    while len(out) < k and start < len(order):
        chunk = order[start : start + 2 * k]
        alive = live(labels[chunk])
        out += [(int(labels[i]), float(scores[i])) for i in chunk if int(labels[i]) in alive]
        start += len(chunk)
    return out[:k]


def _atomic_write_text(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
