"""The catalog's change journal: what changed in a namespace after some revision, in O(changes).

``reference_changes`` holds one row per id ever used in a namespace: its latest revision and
whether that change removed it. Every added, re-described or removed reference is journaled
(:func:`record_change`) inside the write transaction that makes the change, and that
transaction holds the store-wide write lock (SQLite's ``BEGIN IMMEDIATE``, PostgreSQL's advisory
lock), so ``MAX(revision) + 1`` cannot race another writer and revisions commit in the order
they are handed out: a reader that sees revision *r* sees every change up to *r*.
:func:`changes_since` reads one snapshot, so the revision it returns covers exactly its rows.
"""

from __future__ import annotations

from .base import ReferenceChanges, ReferenceRow, metadata_from_json

__all__ = ["record_change", "current_revision", "changes_since", "last_change"]


def record_change(conn, namespace: str, ref_id: str, *, removed: bool) -> None:
    """Journal a change of ``ref_id`` under the namespace's next revision (inside the caller's write)."""
    conn.execute(
        "INSERT INTO reference_changes (namespace, ref_id, revision, removed) "
        "SELECT ?, ?, COALESCE(MAX(revision), 0) + 1, ? FROM reference_changes WHERE namespace = ? "
        "ON CONFLICT (namespace, ref_id) DO UPDATE SET revision = excluded.revision, removed = excluded.removed",
        (namespace, ref_id, int(removed), namespace),
    )


def current_revision(conn, namespace: str) -> int:
    """The journal's highest revision in the namespace (an index lookup, not a scan)."""
    row = conn.execute("SELECT MAX(revision) FROM reference_changes WHERE namespace = ?", (namespace,)).fetchone()
    return int(row[0] or 0)


def last_change(conn, namespace: str, ref_id: str) -> tuple[int, bool] | None:
    """``(revision, removed)`` of the id's latest journaled change, or None when it never had one."""
    row = conn.execute(
        "SELECT revision, removed FROM reference_changes WHERE namespace = ? AND ref_id = ?", (namespace, ref_id)
    ).fetchone()
    return None if row is None else (int(row[0]), bool(row[1]))


def changes_since(conn, namespace: str, revision: int | None) -> ReferenceChanges:
    """What changed in ``namespace`` after ``revision`` (``None``: every reference, as changed), one snapshot."""
    conn.execute("BEGIN")
    try:
        now = current_revision(conn, namespace)
        if revision is not None and now <= revision:
            return ReferenceChanges(now, [], [])  # the common case: nothing new
        if revision is None:
            rows = conn.execute(
                'SELECT ref_id, image_sha256, metadata FROM "references" WHERE namespace = ?', (namespace,)
            ).fetchall()
            removed: list[str] = []
        else:
            rows = conn.execute(
                'SELECT r.ref_id, r.image_sha256, r.metadata FROM reference_changes c JOIN "references" r '
                "ON r.namespace = c.namespace AND r.ref_id = c.ref_id "
                "WHERE c.namespace = ? AND c.revision > ? AND c.removed = 0",
                (namespace, revision),
            ).fetchall()
            removed = [r[0] for r in conn.execute(
                "SELECT ref_id FROM reference_changes WHERE namespace = ? AND revision > ? AND removed = 1",
                (namespace, revision),
            )]
    finally:
        conn.execute("COMMIT")
    changed = [ReferenceRow(ref_id, sha, metadata_from_json(meta)) for ref_id, sha, meta in rows]
    return ReferenceChanges(now, changed, removed)
