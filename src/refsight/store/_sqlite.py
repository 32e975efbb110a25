"""The SQLite database a store's package index and catalog share (``<root>/refsight.db``).

One connection per thread and per process (SQLite connections must not cross a
``fork``), WAL mode so readers never block the writer, and a ``busy_timeout`` so
writers from several processes queue instead of failing. Writes go through
:meth:`Database.write`, a ``BEGIN IMMEDIATE`` transaction: it takes the database's
write lock up front, which serialises writers across processes, and lets callers
do a check-then-act (is the row there? then rename, then insert) as one step.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from ..errors import StoreError

__all__ = ["Database", "SCHEMA_VERSION", "APPLICATION", "DB_NAME"]

#: Bumped when the tables change; a store written by a newer refsight is refused,
#: an older one is migrated in place (see ``_MIGRATIONS``).
SCHEMA_VERSION = 3
APPLICATION = "refsight"
DB_NAME = "refsight.db"
BUSY_TIMEOUT_MS = 30_000

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
"""

#: Statements that bring a store from version ``v`` to ``v + 1``.
_MIGRATIONS = {
    # The journal starts empty: a reader that has never synced lists every reference anyway.
    1: _SCHEMA[_SCHEMA.index("-- version 2") : _SCHEMA.index("-- version 3")],
    # Existing packages were all shared: NULL is exactly their scope.
    2: _SCHEMA[_SCHEMA.index("-- version 3") :],
}


class Database:
    """Per-thread, per-process connections to one refsight SQLite file, with its schema checked."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.path = self.root / DB_NAME
        self._local = threading.local()
        self._lock = threading.Lock()
        self._connections: list[tuple[int, sqlite3.Connection]] = []
        self._closed = False
        self._ensure_schema()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has been called."""
        return self._closed

    # -- connections ------------------------------------------------------------
    def connection(self) -> sqlite3.Connection:
        """This thread's connection (opened on first use; a new one after a fork)."""
        conn = getattr(self._local, "conn", None)
        if conn is not None and self._local.pid == os.getpid():
            return conn
        if self._closed:
            raise StoreError(f"store {self.root} is closed")
        conn = self._open()
        self._local.conn = conn
        self._local.pid = os.getpid()
        return conn

    def _open(self) -> sqlite3.Connection:
        try:
            # isolation_level=None: we issue BEGIN ourselves, so no implicit transactions
            # hold locks behind our back. check_same_thread=False only so close() can close
            # every thread's connection; each is still used by its own thread alone.
            conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None, check_same_thread=False)
            conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            # WAL: readers and one writer proceed together, across processes.
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise StoreError(f"{self.path}: cannot switch the database to WAL mode (got {mode!r})")
            # NORMAL is safe in WAL (never corrupts); a power loss can only drop the last
            # commits. Package files are fsynced before their rows, so the worst case is an
            # orphan file without a row, which gc() removes. Rows never point at lost data.
            conn.execute("PRAGMA synchronous = NORMAL")
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"{self.path} is not a refsight store: {exc}") from exc
        with self._lock:
            self._connections.append((os.getpid(), conn))
        return conn

    @contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        """A ``BEGIN IMMEDIATE`` transaction: the write lock is held from the start, committed on success."""
        conn = self.connection()
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            # Another process held the write lock for the whole busy_timeout (or the disk failed).
            raise StoreError(f"{self.path}: cannot start a write: {exc}") from exc
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        try:
            conn.execute("COMMIT")
        except sqlite3.OperationalError as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise StoreError(f"{self.path}: cannot commit a write: {exc}") from exc

    def close(self) -> None:
        """Close the connections this process opened. Idempotent."""
        with self._lock:
            self._closed = True
            mine = [c for pid, c in self._connections if pid == os.getpid()]
            # Connections inherited through fork are left alone: closing them in the
            # child could disturb the parent's locks.
            self._connections = [(pid, c) for pid, c in self._connections if pid != os.getpid()]
        for conn in mine:
            try:
                conn.close()
            except sqlite3.Error:
                pass
        self._local = threading.local()

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


def _migrate(conn: sqlite3.Connection, version: int) -> int:
    """Upgrade an older store in the caller's write transaction; returns the resulting version."""
    while version < SCHEMA_VERSION and version in _MIGRATIONS:
        for statement in _MIGRATIONS[version].split(";"):
            if statement.strip():
                conn.execute(statement)
        version += 1
        conn.execute("UPDATE meta SET value = ? WHERE name = 'schema_version'", (str(version),))
    return version
