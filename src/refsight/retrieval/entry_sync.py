"""Entries that follow the catalog's journal safely, whatever the interleaving of writers.

Several syncs may run at once on one retrieval database: threads of one process, processes
sharing an SQLite store, and :meth:`~refsight.retrieval.store_index.StoreIndex.forget` after a
removal. Each applies what *its* snapshot of the catalog said, and a slow one may hold an older
snapshot than a fast one. So every entry remembers the catalog revision whose state it reflects
(``entries.revision``), a removed id leaves a tombstone with its revision (``removals``), and a
change is applied only when it is newer than both (:func:`apply_changes`): an old snapshot can
never re-add a removed reference, drop a re-added one, or restore old metadata. The sync mark
(``synced``) then only moves forward from where its sync started (:func:`advance_mark`), so it
never claims a revision some change below it has not reached.

Rows written before revisions were kept carry NULL: any change overrides them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Applied", "apply_changes", "advance_mark", "forget_revisions", "MIGRATION"]

#: Added to a retrieval database of an earlier refsight (idempotent).
MIGRATION = (
    "CREATE TABLE IF NOT EXISTS removals (embedder TEXT NOT NULL, namespace TEXT NOT NULL, ref_id TEXT NOT NULL, "
    "revision INTEGER NOT NULL, PRIMARY KEY (embedder, namespace, ref_id))"
)


@dataclass
class Applied:
    """What one :func:`apply_changes` did: entries (re)indexed, removed, and the labels it dropped."""

    indexed: int = 0
    removed: int = 0
    dropped: list[int] = field(default_factory=list)  # labels no longer live (for the in-memory index)


def metadata_text(metadata: Mapping[str, Any]) -> str:
    """How an entry's metadata is stored (one spelling, so equal metadata compares equal as text)."""
    return json.dumps(dict(metadata), sort_keys=True, ensure_ascii=False)


def apply_changes(
    conn, embedder: str, namespace: str, revision: int, *,
    upserts: Iterable[tuple[str, str, Mapping[str, Any]]] = (), removals: Sequence[str] = (), scope: str | None = None,
) -> Applied:
    """Make these ids' entries the catalog's state at ``revision`` (inside the caller's write transaction).

    ``upserts`` are ``(ref_id, image_sha256, metadata)`` (their vectors already cached);
    ``removals`` are ids absent at ``revision``. An id whose entry or tombstone reflects
    ``revision`` or a later one is left alone. A new entry takes its vector from the cache of
    ``scope`` (None: the store-wide one); one indexed as is keeps the scope it has.
    """
    done = Applied()
    for ref_id, sha, metadata in upserts:
        if _applied_revision(conn, embedder, namespace, ref_id) < revision:
            _upsert(conn, (embedder, namespace, ref_id), sha, metadata_text(metadata), revision, scope, done)
    for ref_id in removals:
        if _applied_revision(conn, embedder, namespace, ref_id) < revision:
            _remove(conn, embedder, namespace, ref_id, revision, done)
    return done


def _applied_revision(conn, embedder: str, namespace: str, ref_id: str) -> int:
    # The newest revision this id's entry or tombstone reflects (-1: none, or a row from before revisions).
    row = conn.execute(
        "SELECT MAX(r) FROM (SELECT revision AS r FROM entries WHERE embedder=? AND namespace=? AND ref_id=? "
        "UNION ALL SELECT revision FROM removals WHERE embedder=? AND namespace=? AND ref_id=?)",
        [embedder, namespace, ref_id] * 2,
    ).fetchone()
    return -1 if row[0] is None else int(row[0])


def _upsert(conn, entry: tuple[str, str, str], sha: str, meta: str, revision: int, scope, done: Applied) -> None:
    embedder, namespace, ref_id = entry
    conn.execute("DELETE FROM removals WHERE embedder=? AND namespace=? AND ref_id=?", [embedder, namespace, ref_id])
    old = conn.execute(
        "SELECT label, image_sha256, metadata FROM entries WHERE embedder=? AND namespace=? AND ref_id=?",
        [embedder, namespace, ref_id],
    ).fetchone()
    if old is not None and (old[1], old[2]) == (sha, meta):
        # Indexed as is: only the revision it reflects moves on.
        conn.execute("UPDATE entries SET revision=? WHERE label=?", [revision, old[0]])
        return
    if old is not None:
        conn.execute("DELETE FROM entries WHERE label=?", [old[0]])
        done.dropped.append(int(old[0]))
    # A replaced reference always gets a new label: an index still holding the old one never
    # returns the new image under it.
    conn.execute(
        "INSERT INTO entries (embedder, namespace, ref_id, image_sha256, metadata, revision, scope) VALUES (?,?,?,?,?,?,?)",
        [embedder, namespace, ref_id, sha, meta, revision, scope],
    )
    done.indexed += 1


def _remove(conn, embedder, namespace, ref_id, revision: int, done: Applied) -> None:
    old = conn.execute(
        "SELECT label FROM entries WHERE embedder=? AND namespace=? AND ref_id=?", [embedder, namespace, ref_id]
    ).fetchone()
    if old is not None:
        conn.execute("DELETE FROM entries WHERE label=?", [old[0]])
        done.dropped.append(int(old[0]))
        done.removed += 1
    conn.execute(
        "INSERT INTO removals (embedder, namespace, ref_id, revision) VALUES (?,?,?,?) "
        "ON CONFLICT (embedder, namespace, ref_id) DO UPDATE SET revision = excluded.revision",
        [embedder, namespace, ref_id, revision],
    )


def advance_mark(conn, embedder: str, namespace: str, revision: int, *, since: int | None) -> None:
    """Record that the entries reflect ``revision``, for a sync that started from mark ``since``.

    A full sync (``since`` None) listed everything at ``revision``: its mark is set as is. An
    incremental one moves the mark only forward, and only while the mark is still at or past
    where it started: a mark reset meanwhile (a rebuild, another catalog) stays reset.
    """
    if since is None:
        conn.execute("INSERT OR REPLACE INTO synced VALUES (?,?,?)", [embedder, namespace, int(revision)])
    else:
        conn.execute(
            "UPDATE synced SET revision=? WHERE embedder=? AND namespace=? AND revision>=? AND revision<?",
            [int(revision), embedder, namespace, int(since), int(revision)],
        )


def forget_revisions(conn, embedder: str, namespace: str) -> None:
    """Drop what the entries remember of catalog revisions (the catalog was recreated: its revisions restart)."""
    conn.execute("UPDATE entries SET revision=NULL WHERE embedder=? AND namespace=?", [embedder, namespace])
    conn.execute("DELETE FROM removals WHERE embedder=? AND namespace=?", [embedder, namespace])
