"""The catalog and package index on PostgreSQL, for replicas that share one store (psycopg 3).

:class:`PgDatabase` offers what :class:`~refsight.store.sqlite.SqliteDatabase` offers
(``connection()``, ``write()``, ``close()``), so the catalog
(:class:`~refsight.store.catalog.SqlCatalog`) and the package index
(:class:`~refsight.store.disk.DiskPackageStore`) run their same, portable SQL on either:
one implementation of every rule, two databases. What differs lives here:

* **Placeholders**: ``?`` becomes ``%s`` on the way to psycopg.
* **Writes** are ``BEGIN`` + ``pg_advisory_xact_lock`` on one store-wide key: writers queue as
  SQLite's ``BEGIN IMMEDIATE`` makes them, so every check-then-act (is the row there? then
  rename the file, then insert) and the journal's ``MAX(revision) + 1`` stay single steps
  across replicas. The lock goes with the transaction, also when a replica dies mid-write.
* **Read transactions** (``BEGIN``) are ``REPEATABLE READ``: one snapshot, as in SQLite.
* **Schema**: the store's schema and migrations (:mod:`refsight.store.schema`) translated (``REAL`` → ``DOUBLE PRECISION``,
  ``INTEGER`` → ``BIGINT``, text compared bytewise like SQLite), under the same version
  number, migrated in place the same way.
* **Failures**: PostgreSQL down, a connection cut or a statement past its timeout raise
  :class:`~refsight.errors.StoreUnavailableError` (the server's 503 ``store_unavailable``)
  within ``connect_timeout`` / ``statement_timeout``; the next call reconnects, so a restarted
  PostgreSQL needs no restarted replica.
* **Leases** (:meth:`PgDatabase.lease`): a session advisory lock per package key, so two
  replicas adding the same new image encode it once. PostgreSQL drops the lock when the
  holder's connection ends (a SIGKILLed replica included), and a waiter stops waiting after
  ``timeout_s`` and encodes anyway: content-addressed writes make that a wasted encode, never
  a second row or a torn file.

Connections are one per thread, opened on first use and again after a fork or a failure.
"""

from __future__ import annotations

import functools
import os
import re
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..errors import StoreError, StoreUnavailableError
from ..support.extras import install_command
from . import schema
from ._failures import closed_on_failure

__all__ = ["PgDatabase", "DEFAULT_CONNECT_TIMEOUT_S", "DEFAULT_STATEMENT_TIMEOUT_MS", "DEFAULT_LEASE_TIMEOUT_S",
           "is_catalog_url", "redact_url"]

DEFAULT_CONNECT_TIMEOUT_S = 3  # libpq's minimum is 2
DEFAULT_STATEMENT_TIMEOUT_MS = 15_000
#: How long a replica waits for another's encode of the same image before encoding it too.
DEFAULT_LEASE_TIMEOUT_S = 120.0

# Advisory lock keys: one store-wide key for writes (bigint form), and a class id for the
# per-package leases (the two-int4 form; its key space is separate from the bigint form's).
_WRITE_LOCK = 0x7265_6673_6967_6874  # "refsight"
_LEASE_CLASS = 0x5253_4C53 - (1 << 31)  # "RSLS", as a signed int4


def is_catalog_url(value: object) -> bool:
    """Whether ``value`` names a PostgreSQL catalog (``postgresql://`` or ``postgres://``)."""
    return isinstance(value, str) and value.startswith(("postgresql://", "postgres://"))


def redact_url(url: str) -> str:
    """``url`` without its password, for messages and logs."""
    return re.sub(r"(://[^:/@]*):[^@/]*@", r"\1:***@", url)


def _pg_type(sql: str) -> str:
    sql = re.sub(r"\)\s*WITHOUT ROWID", ")", sql)
    sql = re.sub(r"\bREAL\b", "DOUBLE PRECISION", sql)
    sql = re.sub(r"\bINTEGER\b", "BIGINT", sql)
    # Byte order, as SQLite's BINARY collation: listings sort the same whatever the database's locale.
    return re.sub(r"\bTEXT\b", 'TEXT COLLATE "C"', sql)


#: The SQLite schema and its migrations, in PostgreSQL's types (one definition of the tables).
PG_SCHEMA = _pg_type(schema.SCHEMA)
PG_MIGRATIONS = {version: _pg_type(sql) for version, sql in schema.MIGRATIONS.items()}


@functools.lru_cache(maxsize=512)
def _translate(sql: str) -> str:
    if sql == "BEGIN":
        return "BEGIN ISOLATION LEVEL REPEATABLE READ"
    return sql.replace("%", "%%").replace("?", "%s")


class PgConnection:
    """One thread's PostgreSQL session, used like an ``sqlite3.Connection`` (``execute``, ``executemany``).

    Statements run in autocommit unless inside ``BEGIN`` … ``COMMIT``. A failure of the server or
    the network raises :class:`StoreUnavailableError`; the next statement outside a transaction
    opens a new session.
    """

    def __init__(self, database: "PgDatabase") -> None:
        self._database = database
        self._raw = None
        self._in_tx = False

    def _live(self):
        raw = self._raw
        if raw is not None and not raw.closed and not raw.broken:
            return raw
        if self._in_tx:
            # The transaction died with the session: nothing of it was committed.
            self._in_tx = False
            raise self._database.unavailable("the connection was lost in a transaction")
        self._raw = self._database.connect()
        return self._raw

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        """Run one statement (``?`` placeholders); returns the psycopg cursor (``fetchone``, ``fetchall``, …)."""
        import psycopg

        raw = self._live()
        head = sql.lstrip()[:8].upper()
        try:
            cursor = raw.execute(_translate(sql), tuple(params))
        except psycopg.OperationalError as exc:
            self._in_tx = False
            self._drop_if_broken()
            raise self._database.unavailable(exc) from exc
        except psycopg.Error as exc:
            raise StoreError(f"catalog {self._database.safe_url}: {str(exc).strip()}") from exc
        if head.startswith("BEGIN"):
            self._in_tx = True
        elif head.startswith(("COMMIT", "ROLLBACK")):
            self._in_tx = False
        return cursor

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        """Run one statement once per row of parameters."""
        for row in rows:
            self.execute(sql, row)

    @property
    def in_transaction(self) -> bool:
        """Whether a ``BEGIN`` is open on this session."""
        return self._in_tx

    def rollback(self) -> None:
        """Roll back the open transaction, if the session still lives (a dead one rolled back by itself)."""
        if not self._in_tx:
            return
        self._in_tx = False
        raw = self._raw
        if raw is None or raw.closed or raw.broken:
            return
        try:
            raw.execute("ROLLBACK")
        except Exception:  # noqa: BLE001 - the session failed: its transaction is gone anyway
            self._drop_if_broken()

    def _drop_if_broken(self) -> None:
        raw = self._raw
        if raw is not None and (raw.closed or raw.broken):
            self._raw = None

    def close(self) -> None:
        """Close the session. Idempotent."""
        raw, self._raw = self._raw, None
        self._in_tx = False
        if raw is not None:
            try:
                raw.close()
            except Exception:  # noqa: BLE001 - closing a dead session
                pass


class PgDatabase:
    """A store's catalog and package index in the PostgreSQL database at ``url``, files under ``root``.

    ``root`` is the shared blob directory (packages and kept images, content-addressed); it
    holds no database. ``connect_timeout_s`` and ``statement_timeout_ms`` bound how long a
    request waits when PostgreSQL is down or stuck before it gets a 503.
    """

    def __init__(
        self,
        url: str,
        root: Path,
        *,
        connect_timeout_s: int = DEFAULT_CONNECT_TIMEOUT_S,
        statement_timeout_ms: int = DEFAULT_STATEMENT_TIMEOUT_MS,
    ) -> None:
        try:
            import psycopg  # noqa: F401
        except ImportError as exc:
            raise StoreError(f"a PostgreSQL catalog needs psycopg: {install_command('postgres')}") from exc
        if not is_catalog_url(url):
            raise StoreError(f"a catalog URL starts with postgresql:// (got {redact_url(str(url))!r})")
        self.url = url
        self.safe_url = redact_url(url)
        self.root = Path(root)
        self.path = self.safe_url  # what messages name, like SqliteDatabase.path
        self._connect_timeout = max(2, int(connect_timeout_s))
        self._statement_timeout = int(statement_timeout_ms)
        self._local = threading.local()
        self._lock = threading.Lock()
        self._sessions: list[tuple[int, PgConnection]] = []
        self._closed = False
        with closed_on_failure(self):
            self._ensure_schema()

    # -- connections ------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has been called."""
        return self._closed

    def unavailable(self, reason: object) -> StoreUnavailableError:
        """The error a request gets while PostgreSQL cannot be reached (503 ``store_unavailable``)."""
        text = str(reason).strip().splitlines()[0] if str(reason).strip() else type(reason).__name__
        text = redact_url(text)
        # The reason says what failed (the catalog, not the disk), for reads and writes alike.
        return StoreUnavailableError(f"the catalog {self.safe_url} is unavailable: {text}", f"the catalog is unreachable: {text}")

    def connect(self):
        """A new autocommit session with the store's timeouts (raises StoreUnavailableError)."""
        import psycopg

        if self._closed:
            raise StoreError(f"catalog {self.safe_url} is closed")
        # lock_timeout bounds the wait for the store-wide write lock; an idle transaction of a
        # stuck replica is ended, so it cannot hold that lock for ever.
        options = (
            f"-c statement_timeout={self._statement_timeout} -c lock_timeout={self._statement_timeout} "
            f"-c idle_in_transaction_session_timeout={max(60_000, 4 * self._statement_timeout)}"
        )
        try:
            return psycopg.connect(
                self.url, autocommit=True, connect_timeout=self._connect_timeout, options=options,
                application_name="refsight", keepalives=1, keepalives_idle=10, keepalives_interval=5,
                keepalives_count=3,
            )
        except psycopg.Error as exc:
            raise self.unavailable(exc) from exc

    def connection(self) -> PgConnection:
        """This thread's session (a new one after a fork)."""
        pid = os.getpid()
        session = getattr(self._local, "session", None)
        if session is not None and self._local.pid == pid:
            return session
        if self._closed:
            raise StoreError(f"catalog {self.safe_url} is closed")
        session = PgConnection(self)
        self._local.session, self._local.pid = session, pid
        with self._lock:
            self._sessions.append((pid, session))
        return session

    @contextmanager
    def write(self) -> Iterator[PgConnection]:
        """A write transaction holding the store-wide write lock from its start; committed on success."""
        conn = self.connection()
        conn.execute("BEGIN ISOLATION LEVEL READ COMMITTED")  # each statement sees the commits before it
        try:
            conn.execute("SELECT pg_advisory_xact_lock(?)", (_WRITE_LOCK,))
            yield conn
        except BaseException:
            conn.rollback()
            raise
        conn.execute("COMMIT")

    @contextmanager
    def lease(self, key: str, *, timeout_s: float = DEFAULT_LEASE_TIMEOUT_S) -> Iterator[bool]:
        """Hold the lease of package ``key`` across replicas; yields whether it was obtained.

        Waits while another session holds it (polling), at most ``timeout_s``; then yields False
        and the caller goes ahead anyway (its write is idempotent).
        """
        conn = self.connection()
        objid = int(key[:8], 16) - (1 << 31)
        deadline = time.monotonic() + timeout_s
        delay = 0.02
        while True:
            got = bool(conn.execute("SELECT pg_try_advisory_lock(?, ?)", (_LEASE_CLASS, objid)).fetchone()[0])
            if got or time.monotonic() >= deadline:
                break
            time.sleep(delay)
            delay = min(delay * 1.5, 0.2)
        try:
            yield got
        finally:
            if got:
                try:
                    conn.execute("SELECT pg_advisory_unlock(?, ?)", (_LEASE_CLASS, objid))
                except StoreError:
                    pass  # the session is gone, and its locks with it

    def close(self) -> None:
        """Close the sessions this process opened; later use raises StoreError. Idempotent."""
        with self._lock:
            self._closed = True
            mine = [s for pid, s in self._sessions if pid == os.getpid()]
            self._sessions = [(pid, s) for pid, s in self._sessions if pid != os.getpid()]
        for session in mine:
            session.close()
        self._local = threading.local()

    # -- schema -----------------------------------------------------------------------
    def _ensure_schema(self) -> None:
        with self.write() as conn:
            tables = {r[0] for r in conn.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()"
            )}
            if "meta" not in tables:
                if tables & {"references", "packages"}:
                    raise StoreError(f"{self.safe_url} holds tables but is not a refsight catalog")
                schema.create(conn, PG_SCHEMA)
                return
            schema.upgrade(conn, self.safe_url, PG_MIGRATIONS,
                           foreign=lambda: StoreError(f"{self.safe_url} is a database but not a refsight catalog"))
