"""The retrieval database: embeddings cached per (image, embedder) and the live set of entries.

One SQLite file, ``<store_root>/retrieval/vectors.sqlite``, is the source of truth for
retrieval. ANN index files are *derived* from it and may lag behind or be lost: every search
result is checked against the ``entries`` table, and any index can be rebuilt from the
``embeddings`` table without running a model.

Tables::

    embeddings(embedder, image_sha256, dim, vector)   one row per image per vector key (see vector_key)
    entries(label, embedder, namespace, ref_id,        one row per indexed reference, with the catalog
            image_sha256, metadata, revision, scope)    revision whose state it reflects and the scope
                                                       its vector was cached under
    removals(embedder, namespace, ref_id, revision)   tombstones of removed ids (see entry_sync.py)
    synced(embedder, namespace, revision)             the catalog revision the entries reflect

Vectors are cached per image for the whole store (an image embeds once, whoever adds it) unless
a tenant's references are isolated: then they are cached under that tenant's scope
(:func:`vector_key`), so how fast a tenant's reference is indexed never depends on whether
another tenant holds the same image (issue 25 item 6, as packages are salted by scope).

``label`` is ``INTEGER PRIMARY KEY AUTOINCREMENT``: SQLite never hands out the same label
twice, even after deletes, so a stale index can never map an old label onto a new reference.
"""

from __future__ import annotations

import json
import re
import sqlite3
import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from refsight.errors import InvalidInputError, StoreError
from refsight.retrieval import entry_sync
from refsight.store.sqlite import SqliteConnections

__all__ = ["VectorDB", "Entry", "validate_where", "vector_key", "MAX_WHERE_KEYS"]

_KEY = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
# SQLite caps bound parameters per statement (32766 by default); stay well below
_CHUNK = 900
# Queries by label name the table "NOT INDEXED": otherwise the planner prefers the
# (embedder, namespace, ref_id) index and scans the whole namespace (23 ms at 100k entries)
# instead of a few rowid lookups (0.03 ms). NOT INDEXED still allows the rowid.
_BY_LABEL = "NOT INDEXED"
_MMAP_BYTES = 1 << 34
_PAGE_BYTES = 16384

_SCHEMA = """
CREATE TABLE IF NOT EXISTS embeddings (
    embedder TEXT NOT NULL,
    image_sha256 TEXT NOT NULL,
    dim INTEGER NOT NULL,
    vector BLOB NOT NULL,
    PRIMARY KEY (embedder, image_sha256)
);
CREATE TABLE IF NOT EXISTS entries (
    label INTEGER PRIMARY KEY AUTOINCREMENT,
    embedder TEXT NOT NULL,
    namespace TEXT NOT NULL,
    ref_id TEXT NOT NULL,
    image_sha256 TEXT NOT NULL,
    metadata TEXT NOT NULL DEFAULT '{}',
    revision INTEGER,
    scope TEXT,
    UNIQUE (embedder, namespace, ref_id)
);
CREATE INDEX IF NOT EXISTS entries_by_ref ON entries (namespace, ref_id);
CREATE TABLE IF NOT EXISTS synced (
    embedder TEXT NOT NULL,
    namespace TEXT NOT NULL,
    revision INTEGER NOT NULL,
    PRIMARY KEY (embedder, namespace)
);
"""


def vector_key(embedder_digest: str, scope: str | None = None) -> str:
    """Under what the vectors of one embedder are cached: the digest, salted by an isolation scope."""
    return embedder_digest if scope is None else f"{embedder_digest}@{scope}"


# SQL for the vector key of an entry (its embedder salted by its scope), as vector_key() spells it.
_ENTRY_VECTOR_KEY = "e.embedder || COALESCE('@' || e.scope, '')"


def _create_tables(conn: sqlite3.Connection) -> None:
    # One statement at a time: executescript() would commit the caller's transaction.
    for statement in _SCHEMA.split(";"):
        if statement.strip():
            conn.execute(statement)
    # A database of an earlier refsight: entries learn their revision, removed ids their tombstones.
    columns = {row[1] for row in conn.execute("PRAGMA table_info(entries)")}
    for column in ("revision INTEGER", "scope TEXT"):
        if column.split()[0] not in columns:
            conn.execute(f"ALTER TABLE entries ADD COLUMN {column}")
    conn.execute(entry_sync.MIGRATION)


class Entry(tuple):
    """(label, ref_id, image_sha256, metadata) of one indexed reference."""

    __slots__ = ()

    def __new__(cls, label: int, ref_id: str, image_sha256: str, metadata: dict[str, Any]):
        return super().__new__(cls, (label, ref_id, image_sha256, metadata))

    label = property(lambda self: self[0], doc="integer label used inside the ANN index")
    ref_id = property(lambda self: self[1], doc="the reference id")
    image_sha256 = property(lambda self: self[2], doc="content hash of the reference image")
    metadata = property(lambda self: self[3], doc="the reference's metadata dict")


#: Most keys one ``where`` filter may hold. Each key is one SQL term, and SQLite refuses an
#: expression tree over 1000 deep, so a bound well below that keeps every filter answerable.
MAX_WHERE_KEYS = 32


def validate_where(where: Mapping[str, Any] | None) -> dict[str, Any]:
    """Check a metadata filter: at most MAX_WHERE_KEYS keys, plain names, JSON scalar values; returns a copy."""
    if where is None:
        return {}
    if not isinstance(where, Mapping):
        raise InvalidInputError(where, "where must be a mapping of metadata key to value")
    if len(where) > MAX_WHERE_KEYS:
        raise InvalidInputError("where", f"{len(where)} keys, over the limit of {MAX_WHERE_KEYS} keys in one filter")
    out = {}
    for key, value in where.items():
        if not isinstance(key, str) or not _KEY.fullmatch(key):
            raise InvalidInputError(key, "a where key uses letters, digits, '_', '.', '-' (max 64 characters)")
        if value is not None and not isinstance(value, (str, int, float, bool)):
            raise InvalidInputError(f"where[{key}]", f"values must be str, int, float, bool or None, got {type(value).__name__}")
        out[key] = value
    return out


class VectorDB:
    """SQLite-backed embedding cache and entry table (thread-safe, multi-process via WAL)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._sqlite = SqliteConnections(
            self.path,
            schema=_create_tables,
            pragmas=(
                # A float32 row of 512 dims is ~2.1 KB: one per 4 KB page wastes half of each page.
                # 16 KB pages hold seven, which cut a million-vector file from 4.3 to 2.6 GB and a
                # 30-row read by 40%. Only takes effect on a new (empty) file.
                f"page_size = {_PAGE_BYTES}",
                # NORMAL is durable in WAL mode up to the last checkpoint; a crash loses at most the
                # last transactions, never corrupts, and the derived indexes tolerate either outcome
                "synchronous = NORMAL",
                # Filtered searches read float32 rows scattered over the file: through a memory map
                # instead of read() calls, 30 rows took 0.55 ms against 1.9 ms at 100k entries.
                # SQLite clamps this to its own maximum (2 GB).
                f"mmap_size = {_MMAP_BYTES}",
            ),
            # One connection per process, used under self._lock: version() compares
            # PRAGMA data_version and total_changes, which are per connection.
            per_thread=False,
            open_error="cannot open retrieval database {path}: {exc}",
            closed_error="retrieval database {path} is closed",
        )
        self._lock = threading.RLock()

    @property
    def _conn(self) -> sqlite3.Connection:
        """This process's connection (a new one after a fork)."""
        return self._sqlite.connection()

    def close(self) -> None:
        """Close the connection."""
        with self._lock:
            self._sqlite.close()

    def _q(self, sql: str, params: Sequence[Any] = ()) -> list[tuple]:
        with self._lock:
            try:
                return self._conn.execute(sql, params).fetchall()
            except sqlite3.Error as exc:
                raise StoreError(f"retrieval database {self.path}: {exc}") from exc

    def _write(self, work):
        # One write transaction under this process's lock; SQLite errors as StoreError.
        with self._lock:
            try:
                with self._sqlite.write() as conn:
                    return work(conn)
            except sqlite3.Error as exc:
                raise StoreError(f"retrieval database {self.path}: {exc}") from exc

    # -- embeddings -----------------------------------------------------------------------

    def get_vectors(self, embedder: str, shas: Sequence[str]) -> dict[str, np.ndarray]:
        """Cached vectors for these image hashes (missing ones are absent from the result)."""
        out: dict[str, np.ndarray] = {}
        for s in range(0, len(shas), _CHUNK):
            chunk = list(shas[s : s + _CHUNK])
            marks = ",".join("?" * len(chunk))
            rows = self._q(
                f"SELECT image_sha256, vector FROM embeddings WHERE embedder=? AND image_sha256 IN ({marks})",
                [embedder, *chunk],
            )
            for sha, blob in rows:
                out[sha] = np.frombuffer(blob, dtype=np.float32)
        return out

    def put_vectors(self, embedder: str, items: Mapping[str, np.ndarray]) -> None:
        """Cache vectors by image hash (idempotent: a vector depends only on image and embedder)."""
        rows = [(embedder, sha, int(v.shape[0]), np.ascontiguousarray(v, np.float32).tobytes()) for sha, v in items.items()]
        with self._lock:
            try:
                self._conn.executemany("INSERT OR REPLACE INTO embeddings VALUES (?,?,?,?)", rows)
            except sqlite3.Error as exc:
                raise StoreError(f"retrieval database {self.path}: {exc}") from exc

    # -- entries --------------------------------------------------------------------------

    def upsert_entry(self, embedder: str, namespace: str, ref_id: str, sha: str, metadata: Mapping[str, Any]) -> tuple[int, int | None]:
        """Insert or replace a reference; returns (new label, replaced label or None).

        A replaced reference always gets a *new* label, so an index that still holds the old
        label can never return the new image under it.
        """
        meta = entry_sync.metadata_text(metadata)

        def replace(conn) -> tuple[int, int | None]:
            old = conn.execute(
                "SELECT label FROM entries WHERE embedder=? AND namespace=? AND ref_id=?", [embedder, namespace, ref_id]
            ).fetchone()
            if old:
                conn.execute("DELETE FROM entries WHERE label=?", [old[0]])
            cur = conn.execute(
                "INSERT INTO entries (embedder, namespace, ref_id, image_sha256, metadata) VALUES (?,?,?,?,?)",
                [embedder, namespace, ref_id, sha, meta],
            )
            return int(cur.lastrowid), (int(old[0]) if old else None)

        return self._write(replace)

    def delete_ref(self, namespace: str, ref_id: str, embedder: str | None = None) -> list[tuple[str, int]]:
        """Delete a reference from one embedder's entries, or from all (``embedder=None``).

        Returns the (embedder, label) pairs removed.
        """
        where, params = "namespace=? AND ref_id=?", [namespace, ref_id]
        if embedder is not None:
            where, params = where + " AND embedder=?", params + [embedder]

        def delete(conn) -> list[tuple[str, int]]:
            rows = conn.execute(f"SELECT embedder, label FROM entries WHERE {where}", params).fetchall()
            conn.execute(f"DELETE FROM entries WHERE {where}", params)
            return [(e, int(lbl)) for e, lbl in rows]

        return self._write(delete)

    def clear_namespace(self, embedder: str, namespace: str) -> int:
        """Delete every entry of one embedder × namespace; returns how many."""
        rows = self._q("SELECT COUNT(*) FROM entries WHERE embedder=? AND namespace=?", [embedder, namespace])
        self._q("DELETE FROM entries WHERE embedder=? AND namespace=?", [embedder, namespace])
        self._q("DELETE FROM removals WHERE embedder=? AND namespace=?", [embedder, namespace])
        return rows[0][0]

    def version(self) -> tuple[int, int]:
        """Changes whenever anything is committed, by this connection or any other (cheap: no table scan).

        ``PRAGMA data_version`` moves with other connections' commits, ``total_changes``
        with our own; together they tell a cache it may skip re-reading the tables.
        """
        with self._lock:
            try:
                return int(self._conn.execute("PRAGMA data_version").fetchone()[0]), self._conn.total_changes
            except sqlite3.Error as exc:
                raise StoreError(f"retrieval database {self.path}: {exc}") from exc

    def synced_revision(self, embedder: str, namespace: str) -> int | None:
        """The catalog revision these entries were last brought up to (None: never synced)."""
        rows = self._q("SELECT revision FROM synced WHERE embedder=? AND namespace=?", [embedder, namespace])
        return int(rows[0][0]) if rows else None

    def mark_synced(self, embedder: str, namespace: str, revision: int | None) -> None:
        """Record the catalog revision the entries now reflect (``None`` forgets it: next sync is full)."""
        if revision is None:
            self._q("DELETE FROM synced WHERE embedder=? AND namespace=?", [embedder, namespace])
        else:
            self._q("INSERT OR REPLACE INTO synced VALUES (?,?,?)", [embedder, namespace, int(revision)])

    def apply(
        self, embedder: str, namespace: str, revision: int, *, upserts=(), removals=(), scope: str | None = None,
    ) -> entry_sync.Applied:
        """Bring these ids to the catalog's state at ``revision``, one transaction (see :mod:`entry_sync`).

        New entries take their vectors from ``vector_key(embedder, scope)``.
        """
        return self._write(lambda conn: entry_sync.apply_changes(
            conn, embedder, namespace, revision, upserts=upserts, removals=removals, scope=scope))

    def advance_synced(self, embedder: str, namespace: str, revision: int, *, since: int | None) -> None:
        """Move the sync mark to ``revision`` for a sync that started at ``since`` (never back past a reset)."""
        self._write(lambda conn: entry_sync.advance_mark(conn, embedder, namespace, revision, since=since))

    def forget_revisions(self, embedder: str, namespace: str) -> None:
        """Forget the catalog revisions the entries reflect (the catalog was recreated)."""
        self._write(lambda conn: entry_sync.forget_revisions(conn, embedder, namespace))

    def embedders_of(self, namespace: str) -> list[str]:
        """Every embedder that indexed or synced ``namespace`` (a removal must reach each one)."""
        rows = self._q(
            "SELECT embedder FROM entries WHERE namespace=? UNION SELECT embedder FROM synced WHERE namespace=? ORDER BY 1",
            [namespace, namespace],
        )
        return [r[0] for r in rows]

    def entries_by_ref(self, embedder: str, namespace: str, ref_ids: Iterable[str] | None = None) -> dict[str, Entry]:
        """Live entries keyed by reference id: these ids (absent ones are left out), or all."""
        sql = "SELECT label, ref_id, image_sha256, metadata FROM entries WHERE embedder=? AND namespace=?"
        if ref_ids is None:
            rows = self._q(sql, [embedder, namespace])
        else:
            ids, rows = list(ref_ids), []
            for s in range(0, len(ids), _CHUNK):
                chunk = ids[s : s + _CHUNK]
                rows += self._q(sql + f" AND ref_id IN ({','.join('?' * len(chunk))})", [embedder, namespace, *chunk])
        return {ref_id: Entry(label, ref_id, sha, json.loads(meta)) for label, ref_id, sha, meta in rows}

    def count(self, embedder: str, namespace: str) -> int:
        """Live entries of one embedder × namespace."""
        return self._q("SELECT COUNT(*) FROM entries WHERE embedder=? AND namespace=?", [embedder, namespace])[0][0]

    def labels(self, embedder: str, namespace: str, after: int = 0) -> np.ndarray:
        """Live labels (sorted), optionally only those above ``after``."""
        hint = _BY_LABEL if after > 0 else ""  # new labels are a rowid range
        rows = self._q(
            f"SELECT label FROM entries {hint} WHERE embedder=? AND namespace=? AND label>? ORDER BY label",
            [embedder, namespace, after],
        )
        return np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))

    def _entry_rows(self, columns: str, embedder: str, namespace: str, labels: Iterable[int]) -> list[tuple]:
        """``columns`` of the live entries with these labels (rowid lookups, in chunks)."""
        labels = [int(x) for x in labels]
        rows: list[tuple] = []
        for s in range(0, len(labels), _CHUNK):
            chunk = labels[s : s + _CHUNK]
            rows += self._q(
                f"SELECT {columns} FROM entries {_BY_LABEL} "
                f"WHERE embedder=? AND namespace=? AND label IN ({','.join('?' * len(chunk))})",
                [embedder, namespace, *chunk],
            )
        return rows

    def entries(self, embedder: str, namespace: str, labels: Iterable[int]) -> dict[int, Entry]:
        """Live entries for these labels; labels no longer live are simply absent."""
        rows = self._entry_rows("label, ref_id, image_sha256, metadata", embedder, namespace, labels)
        return {label: Entry(label, ref_id, sha, json.loads(meta)) for label, ref_id, sha, meta in rows}

    def live_labels(self, embedder: str, namespace: str, labels: Iterable[int]) -> set[int]:
        """Those of these labels that are still live (no metadata decoded: cheaper than ``entries``)."""
        return {row[0] for row in self._entry_rows("label", embedder, namespace, labels)}

    def entry_for_ref(self, embedder: str, namespace: str, ref_id: str) -> Entry | None:
        """The live entry of one reference, if indexed."""
        return self.entries_by_ref(embedder, namespace, [ref_id]).get(ref_id)

    def filtered_labels(self, embedder: str, namespace: str, where: Mapping[str, Any]) -> np.ndarray:
        """Live labels whose metadata has every ``where`` key equal to its value (JSON types)."""
        clauses, params = [], [embedder, namespace]
        for key, value in validate_where(where).items():
            # the key is validated above, so building the JSON path from it is safe
            if value is None:
                clauses.append(f"json_type(metadata, '$.\"{key}\"') = 'null'")
            else:
                clauses.append(f"json_extract(metadata, '$.\"{key}\"') = ?")
                params.append(int(value) if isinstance(value, bool) else value)
        sql = "SELECT label FROM entries WHERE embedder=? AND namespace=?"
        if clauses:
            sql += " AND " + " AND ".join(clauses)
        rows = self._q(sql + " ORDER BY label", params)
        return np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))

    def vectors_for_labels(self, embedder: str, namespace: str, labels: Sequence[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(labels, vectors) of live entries joined with their cached embeddings.

        ``labels=None`` gives the whole namespace (used for exact search and rebuilds).
        """
        base = (
            "SELECT e.label, v.vector FROM entries e {hint} JOIN embeddings v "
            f"ON v.embedder = {_ENTRY_VECTOR_KEY} AND v.image_sha256 = e.image_sha256 "
            "WHERE e.embedder=? AND e.namespace=?"
        )
        if labels is None:
            rows = self._q(base.format(hint="") + " ORDER BY e.label", [embedder, namespace])
        else:
            rows = []
            labels = [int(x) for x in labels]
            by_label = base.format(hint=_BY_LABEL)
            for s in range(0, len(labels), _CHUNK):
                chunk = labels[s : s + _CHUNK]
                rows += self._q(by_label + f" AND e.label IN ({','.join('?' * len(chunk))})", [embedder, namespace, *chunk])
        if not rows:
            return np.zeros(0, np.int64), np.zeros((0, 0), np.float32)
        lbl = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
        vec = np.stack([np.frombuffer(r[1], dtype=np.float32) for r in rows])
        return lbl, vec

    def namespaces(self, embedder: str) -> list[str]:
        """Namespaces that hold entries for this embedder."""
        return [r[0] for r in self._q("SELECT DISTINCT namespace FROM entries WHERE embedder=? ORDER BY 1", [embedder])]
