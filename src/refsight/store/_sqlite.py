"""The SQLite database a store's package index and catalog share (``<root>/refsight.db``).

Connections come from :class:`~refsight.store.sqlite.SqliteConnections` (one per thread
and per process, WAL, a busy timeout; shared with the retrieval and attribute databases).
Writes go through :meth:`Database.write`, a ``BEGIN IMMEDIATE`` transaction: it takes the
database's write lock up front, which serialises writers across processes, and lets callers
do a check-then-act (is the row there? then rename, then insert) as one step.
"""

from __future__ import annotations

import sqlite3
from contextlib import AbstractContextManager
from pathlib import Path

from ..errors import StoreError
from .sqlite import SqliteConnections

__all__ = ["Database", "open_database", "SCHEMA_VERSION", "APPLICATION", "DB_NAME"]

#: Bumped when the tables change; a store written by a newer refsight is refused,
#: an older one is migrated in place (see ``_MIGRATIONS``).
SCHEMA_VERSION = 4
APPLICATION = "refsight"
DB_NAME = "refsight.db"

_SCHEMA = """
CREATE TABLE meta (name TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE packages (
    key TEXT PRIMARY KEY,
    image_sha256 TEXT NOT NULL,
    fingerprint_digest TEXT NOT NULL,
    fingerprint_json TEXT NOT NULL,
    bytes INTEGER NOT NULL,
    spec_json TEXT NOT NULL,
    created_at REAL NOT NULL,
    encode_ms REAL NOT NULL,
    checksum TEXT NOT NULL
) WITHOUT ROWID;
CREATE INDEX packages_by_image ON packages (image_sha256);
CREATE TABLE "references" (
    namespace TEXT NOT NULL,
    ref_id TEXT NOT NULL,
    image_sha256 TEXT NOT NULL,
    metadata TEXT NOT NULL,
    created_at REAL NOT NULL,
    PRIMARY KEY (namespace, ref_id)
);
CREATE INDEX references_by_image ON "references" (image_sha256);
CREATE TABLE reference_packages (
    namespace TEXT NOT NULL,
    ref_id TEXT NOT NULL,
    fingerprint_digest TEXT NOT NULL,
    package_key TEXT NOT NULL,
    PRIMARY KEY (namespace, ref_id, fingerprint_digest)
);
CREATE INDEX reference_packages_by_key ON reference_packages (package_key);
CREATE TABLE images (
    sha256 TEXT PRIMARY KEY,
    path TEXT NOT NULL,
    bytes INTEGER NOT NULL,
    format TEXT,
    checksum TEXT NOT NULL
) WITHOUT ROWID;
CREATE TABLE counters (name TEXT PRIMARY KEY, value REAL NOT NULL) WITHOUT ROWID;
-- version 2: a change journal (one row per id ever used in a namespace, holding its latest
-- revision), so derived indexes catch up in O(changes), not O(references)
CREATE TABLE reference_changes (
    namespace TEXT NOT NULL,
    ref_id TEXT NOT NULL,
    revision INTEGER NOT NULL,
    removed INTEGER NOT NULL,
    PRIMARY KEY (namespace, ref_id)
) WITHOUT ROWID;
CREATE INDEX reference_changes_by_revision ON reference_changes (namespace, revision);
-- version 3: the isolation scope that salts a package's key (NULL: shared across namespaces)
ALTER TABLE packages ADD COLUMN scope TEXT;
-- version 4: when each package was last used (buffered, see store/usage.py), for the byte
-- quota's least-recently-used eviction (existing packages start at their creation time)
ALTER TABLE packages ADD COLUMN last_used REAL NOT NULL DEFAULT 0;
UPDATE packages SET last_used = created_at;
CREATE INDEX packages_by_use ON packages (last_used);
"""

#: Statements that bring a store from version ``v`` to ``v + 1``.
_MIGRATIONS = {
    # The journal starts empty: a reader that has never synced lists every reference anyway.
    1: _SCHEMA[_SCHEMA.index("-- version 2") : _SCHEMA.index("-- version 3")],
    # Existing packages were all shared: NULL is exactly their scope.
    2: _SCHEMA[_SCHEMA.index("-- version 3") : _SCHEMA.index("-- version 4")],
    3: _SCHEMA[_SCHEMA.index("-- version 4") :],
}


class Database:
    """Per-thread, per-process connections to one refsight SQLite file, with its schema checked.

    The connection handling is :class:`~refsight.store.sqlite.SqliteConnections`, shared with
    the retrieval and attribute databases; this class adds the store's schema, its version
    check and its migrations.
    """

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.path = self.root / DB_NAME
        self._sqlite = SqliteConnections(
            self.path,
            # NORMAL is safe in WAL (never corrupts); a power loss can only drop the last
            # commits. Package files are fsynced before their rows, so the worst case is an
            # orphan file without a row, which gc() removes. Rows never point at lost data.
            pragmas=("synchronous = NORMAL",),
            open_error="{path} is not a refsight store: {exc}",
            closed_error=f"store {self.root} is closed",
        )
        self._ensure_schema()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has been called."""
        return self._sqlite.closed

    # -- connections ------------------------------------------------------------
    def connection(self) -> sqlite3.Connection:
        """This thread's connection (opened on first use; a new one after a fork)."""
        return self._sqlite.connection()

    def write(self) -> AbstractContextManager[sqlite3.Connection]:
        """A ``BEGIN IMMEDIATE`` transaction: the write lock is held from the start, committed on success."""
        return self._sqlite.write()

    def close(self) -> None:
        """Close the connections this process opened. Idempotent."""
        self._sqlite.close()

    # -- schema -----------------------------------------------------------------
    def _ensure_schema(self) -> None:
        try:
            with self.write() as conn:
                tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
                if not tables:
                    # One statement at a time: executescript() would COMMIT our transaction.
                    for statement in _SCHEMA.split(";"):
                        if statement.strip():
                            conn.execute(statement)
                    conn.executemany(
                        "INSERT INTO meta (name, value) VALUES (?, ?)",
                        [("application", APPLICATION), ("schema_version", str(SCHEMA_VERSION))],
                    )
                    return
                if "meta" not in tables:
                    raise StoreError(f"{self.path} is an SQLite database but not a refsight store")
                meta = dict(conn.execute("SELECT name, value FROM meta"))
                if meta.get("application") == APPLICATION:
                    meta["schema_version"] = str(_migrate(conn, int(meta.get("schema_version", "0"))))
        except sqlite3.DatabaseError as exc:
            self.close()
            raise StoreError(f"{self.path} is not a refsight store: {exc}") from exc
        except StoreError:
            self.close()
            raise
        if meta.get("application") != APPLICATION:
            self.close()
            raise StoreError(f"{self.path} is an SQLite database but not a refsight store")
        version = int(meta.get("schema_version", "0"))
        if version > SCHEMA_VERSION:
            self.close()
            raise StoreError(
                f"{self.path} has schema version {version}, newer than this refsight ({SCHEMA_VERSION}); upgrade refsight"
            )
        if version < SCHEMA_VERSION:
            self.close()
            raise StoreError(f"{self.path} has schema version {version}, which this refsight cannot read")


def open_database(root: Path, database=None):
    """``database`` when given (a shared one), else the embedded database of ``root``, creating the directory."""
    if database is not None:
        return database
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StoreError(f"cannot create store directory {root}: {exc}") from exc
    return Database(root)


def _migrate(conn: sqlite3.Connection, version: int) -> int:
    """Upgrade an older store in the caller's write transaction; returns the resulting version."""
    while version < SCHEMA_VERSION and version in _MIGRATIONS:
        for statement in _MIGRATIONS[version].split(";"):
            if statement.strip():
                conn.execute(statement)
        version += 1
        conn.execute("UPDATE meta SET value = ? WHERE name = 'schema_version'", (str(version),))
    return version
