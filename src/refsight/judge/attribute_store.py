"""The attribute store: attribute records in SQLite, computed once per image, source and schema."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..package import canonical_json
from ..cache.packages import ModelImage
from ..store.sqlite import SqliteConnections
from .attribute_schema import ERROR_KEY
from .attribute_sources import AttributeSource, subject_of

__all__ = ["AttributeStore"]


class AttributeStore:
    """Attribute records in SQLite at ``<root>/attributes/attributes.sqlite``.

    Keyed by (image sha256, source fingerprint, schema digest). Records are deterministic
    for a key, so concurrent writers may race harmlessly: the first insert wins.
    ``hits``/``misses`` count lookups in this process.
    """

    def __init__(self, root: str | Path) -> None:
        self.path = Path(root) / "attributes" / "attributes.sqlite"
        self._sqlite = SqliteConnections(
            self.path, schema=_create_table, open_error="cannot open the attribute store at {path}: {exc}"
        )
        self.hits = 0
        self.misses = 0

    def get(self, subject: str, source_fingerprint: str, schema_digest: str) -> dict[str, Any] | None:
        """The stored record, or None."""
        row = self._sqlite.connection().execute(
            "SELECT record FROM attributes WHERE subject=? AND source=? AND schema=?",
            (subject, source_fingerprint, schema_digest),
        ).fetchone()
        return None if row is None else json.loads(row[0])

    def put(self, subject: str, source_fingerprint: str, schema_digest: str, record: Mapping[str, Any]) -> None:
        """Store a record (a no-op when one is already stored under the key)."""
        self._sqlite.connection().execute(
            "INSERT OR IGNORE INTO attributes VALUES (?, ?, ?, ?, ?)",
            (subject, source_fingerprint, schema_digest, canonical_json(dict(record)), time.time()),
        )

    def get_or_compute(
        self, source: AttributeSource, items: Sequence[ModelImage], scope: str | None = None
    ) -> list[dict[str, Any]]:
        """Each item's record from ``source``: stored ones are read, the rest computed in one batch and stored
        (images under ``scope``, packages under their own: see :func:`subject_of`)."""
        fp, schema = source.fingerprint, source.schema_digest
        subjects = [subject_of(item, scope) for item in items]
        records: list[dict[str, Any] | None] = [self.get(subject, fp, schema) for subject in subjects]
        missing = [i for i, r in enumerate(records) if r is None]
        self.hits += len(items) - len(missing)
        self.misses += len(missing)
        if missing:
            computed = source.compute([items[i] for i in missing])
            for i, record in zip(missing, computed):
                records[i] = record
                if ERROR_KEY not in record:  # a failed record would hide a later success
                    self.put(subjects[i], fp, schema, record)
        return [r for r in records if r is not None]

    def close(self) -> None:
        """Close the database. Idempotent."""
        self._sqlite.close()


def _create_table(conn: sqlite3.Connection) -> None:
    conn.execute(
        "CREATE TABLE IF NOT EXISTS attributes (subject TEXT NOT NULL, source TEXT NOT NULL,"
        " schema TEXT NOT NULL, record TEXT NOT NULL, created_at REAL NOT NULL,"
        " PRIMARY KEY (subject, source, schema))"
    )
