"""Remembered images in the store: which namespaces' inline images the store keeps, by package key.

A *remembered image* is an image a tenant sent inline (not a named reference) whose package the store keeps
under the ``remember_images`` policy (:mod:`refsight.settings.remembering`). Its package (features and fingerprint,
never the image bytes) sits in the package index like any other, under the byte quota's least-recently-used
order; ``remembered_packages`` holds one row per namespace that sent it again:

- a package some row names is in use: ``gc`` keeps it and removing a reference that shares it leaves it,
  as for a reference's linked package;
- deleting a package (the quota, ``prune``, a corrupt read) deletes its rows in the same transaction
  (:meth:`~refsight.store.disk.DiskPackageStore.delete`), so no row outlives its package;
- :meth:`RememberedImages.forget` drops rows and says which packages nothing names any more, for the
  caller to delete from every tier.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..package import EncoderFingerprint
from ..results import FieldRecord

if TYPE_CHECKING:  # pragma: no cover
    from .postgres import PgDatabase
    from .sqlite import SqliteDatabase

__all__ = ["RememberedImage", "RememberedImages"]


@dataclass(frozen=True)
class RememberedImage(FieldRecord):
    """One namespace's remembered image: its package key, the package's size and model, when kept and last used."""

    namespace: str
    package_key: str
    bytes: int
    model_id: str
    remembered_at: float
    last_used: float


_LISTED = (
    "SELECT m.namespace, m.package_key, p.bytes, p.fingerprint_json, m.created_at, p.last_used "
    "FROM remembered_packages m JOIN packages p ON p.key = m.package_key"
)


class RememberedImages:
    """The ``remembered_packages`` rows of one store (SQLite or PostgreSQL, the same SQL)."""

    def __init__(self, database: SqliteDatabase | PgDatabase) -> None:
        self._db = database

    def contains(self, namespace: str, package_key: str) -> bool:
        """Whether ``namespace`` remembers the image of ``package_key`` (a read: no lock, no write)."""
        found = self._db.connection().execute(
            "SELECT 1 FROM remembered_packages WHERE namespace = ? AND package_key = ?", (namespace, package_key)
        ).fetchone()
        return found is not None

    def add(self, namespace: str, package_key: str) -> None:
        """Remember the image of ``package_key`` (already durable) for ``namespace``; idempotent."""
        with self._db.write() as conn:
            conn.execute(
                "INSERT INTO remembered_packages (namespace, package_key, created_at) VALUES (?, ?, ?) "
                "ON CONFLICT (namespace, package_key) DO NOTHING",
                (namespace, package_key, time.time()),
            )

    def list(self, *, namespace: str | None = None) -> list[RememberedImage]:
        """The remembered images of ``namespace`` (None: every namespace), most recently used first."""
        sql, params = _LISTED, ()
        if namespace is not None:
            sql, params = f"{sql} WHERE m.namespace = ?", (namespace,)
        rows = self._db.connection().execute(f"{sql} ORDER BY p.last_used DESC, m.package_key, m.namespace", params)
        return [
            RememberedImage(ns, key, int(size), EncoderFingerprint.from_json(fingerprint).model_id, float(kept), float(used))
            for ns, key, size, fingerprint, kept, used in rows.fetchall()
        ]

    def totals(self, *, namespace: str | None = None) -> tuple[int, int]:
        """``(images, bytes)`` remembered by ``namespace`` (None: the store; a package several namespaces
        remember counts once)."""
        where, params = ("WHERE namespace = ?", (namespace,)) if namespace is not None else ("", ())
        count, total = self._db.connection().execute(
            "SELECT COUNT(*), COALESCE(SUM(p.bytes), 0) FROM packages p WHERE p.key IN "
            f"(SELECT package_key FROM remembered_packages {where})",
            params,
        ).fetchone()
        return int(count), int(total)

    def forget(self, *, namespace: str | None = None, keys: Sequence[str] | None = None) -> tuple[int, list[str]]:
        """Drop the rows of ``namespace`` (None: every namespace), only those of ``keys`` when given.

        Returns ``(rows dropped, package keys no row or reference names any more)``: the caller deletes
        those packages (every tier); the others stay, still another namespace's or a reference's.
        """
        clauses, params = [], []
        if namespace is not None:
            clauses.append("namespace = ?")
            params.append(namespace)
        if keys is not None:
            if not keys:
                return 0, []
            clauses.append(f"package_key IN ({', '.join('?' * len(keys))})")
            params.extend(keys)
        where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
        with self._db.write() as conn:
            found = sorted({row[0] for row in conn.execute(f"SELECT package_key FROM remembered_packages{where}", params)})
            dropped = conn.execute(f"DELETE FROM remembered_packages{where}", params).rowcount
            unused = [key for key in found if not _in_use(conn, key)]
        return int(dropped), unused


def _in_use(conn: Any, package_key: str) -> bool:
    """Whether a remembered row or a reference's link still names the package."""
    return conn.execute(
        "SELECT 1 FROM remembered_packages WHERE package_key = ? UNION ALL "
        "SELECT 1 FROM reference_packages WHERE package_key = ? LIMIT 1",
        (package_key, package_key),
    ).fetchone() is not None
