"""Connections to one SQLite file, as every refsight database opens them, and the embedded store's database.

The store's database (``refsight.db``, :class:`SqliteDatabase`), the retrieval database
(``retrieval/vectors.sqlite``) and the attribute store (``attributes/attributes.sqlite``) share
one helper, :class:`SqliteConnections`; each keeps its own schema and migrations (the store's
are :mod:`refsight.store.schema`, shared with PostgreSQL). What they share:

* connections that never cross a ``fork`` (a child process opens its own: an SQLite
  connection used in two processes corrupts locks), either one per thread or one per process;
* WAL mode, so readers never block the writer, checked rather than assumed;
* a ``busy_timeout``, so writers from several processes queue instead of failing;
* writes as ``BEGIN IMMEDIATE`` transactions (:meth:`SqliteConnections.write`): the write
  lock is taken up front, which serialises writers across processes and lets callers do a
  check-then-act as one step;
* the schema set up once, in such a write, when the file is opened.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

from ..errors import StoreError, StoreUnavailableError
from . import schema
from ._failures import closed_on_failure, store_failure, unavailable_reason

__all__ = ["BUSY_TIMEOUT_MS", "SqliteConnections", "SqliteDatabase", "open_database"]

BUSY_TIMEOUT_MS = 30_000


class SqliteConnections:
    """Fork-safe WAL connections to the SQLite file at ``path``, with ``BEGIN IMMEDIATE`` writes.

    ``schema(conn)`` runs once, inside a write transaction, when the helper is built (it
    must use ``conn.execute``: ``executescript`` would commit the transaction).
    ``pragmas`` (e.g. ``"page_size = 16384"``) run on every new connection before the switch
    to WAL, which is where ``page_size`` must come for a new file. ``per_thread=False`` shares
    one connection among the threads of a process (the caller serialises its use); the
    default gives each thread its own. ``open_error`` formats the :class:`StoreError` raised
    when the file cannot be opened or set up (fields ``path`` and ``exc``).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        schema: Callable[[sqlite3.Connection], None] | None = None,
        pragmas: Sequence[str] = (),
        per_thread: bool = True,
        open_error: str = "cannot open the database {path}: {exc}",
        closed_error: str = "the database {path} is closed",
    ) -> None:
        self.path = Path(path)
        self.per_thread = per_thread
        self._pragmas = tuple(pragmas)
        self._open_error = open_error
        self._closed_error = closed_error
        self._local = threading.local()
        self._shared: tuple[int, sqlite3.Connection] | None = None
        self._lock = threading.Lock()
        #: Every connection opened: (process, the thread it is for or None when shared, connection).
        self._connections: list[tuple[int, threading.Thread | None, sqlite3.Connection]] = []
        self._closed = False
        if schema is not None:
            with closed_on_failure(self):
                try:
                    with self.write() as conn:
                        schema(conn)
                except sqlite3.Error as exc:
                    raise self._open_failure(exc) from exc

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has been called."""
        return self._closed

    def connection(self) -> sqlite3.Connection:
        """The connection for this thread (or process), opened on first use and again after a fork."""
        pid = os.getpid()
        if self.per_thread:
            conn = getattr(self._local, "conn", None)
            if conn is not None and self._local.pid == pid:
                return conn
        else:
            shared = self._shared
            if shared is not None and shared[0] == pid:
                return shared[1]
        if self._closed:
            raise StoreError(self._closed_error.format(path=self.path))
        conn = self._open()
        if self.per_thread:
            self._local.conn, self._local.pid = conn, pid
        else:
            self._shared = (pid, conn)
        return conn

    def _open(self) -> sqlite3.Connection:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # isolation_level=None: we issue BEGIN ourselves, so no implicit transactions
            # hold locks behind our back. check_same_thread=False only so close() can close
            # every thread's connection (and per_thread=False can share one under a lock).
            conn = sqlite3.connect(
                self.path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None, check_same_thread=False
            )
            conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            for pragma in self._pragmas:
                conn.execute(f"PRAGMA {pragma}")
            # WAL: readers and one writer proceed together, across processes.
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                conn.close()
                raise sqlite3.OperationalError(f"cannot switch the database to WAL mode (got {mode!r})")
        except (OSError, sqlite3.Error) as exc:
            raise self._open_failure(exc) from exc
        with self._lock:
            self._connections.append((os.getpid(), threading.current_thread() if self.per_thread else None, conn))
        return conn

    @contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        """A ``BEGIN IMMEDIATE`` transaction: the write lock is held from the start, committed on success."""
        conn = self.connection()
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            # Another process held the write lock for the whole busy_timeout (or the disk failed).
            raise store_failure(exc, self.path, f"{self.path}: cannot start a write") from exc
        try:
            yield conn
        except sqlite3.Error as exc:
            # A statement failed (a full disk shows here as SQLITE_FULL): roll back and say why,
            # as a refsight error rather than a raw sqlite3 exception.
            _rollback(conn)
            raise store_failure(exc, self.path, f"{self.path}: cannot write") from exc
        except BaseException:
            _rollback(conn)
            raise
        try:
            conn.execute("COMMIT")
        except sqlite3.OperationalError as exc:
            _rollback(conn)
            raise store_failure(exc, self.path, f"{self.path}: cannot commit a write") from exc

    def _open_failure(self, exc: BaseException) -> StoreError:
        # A full or read-only disk is named as such (StoreUnavailableError), never as
        # "not a refsight store"; anything else keeps the caller's wording.
        reason = unavailable_reason(exc, self.path)
        if reason is not None:
            return StoreUnavailableError(f"cannot open the database {self.path}: {reason}", reason)
        return StoreError(self._open_error.format(path=self.path, exc=exc))

    def close(self) -> None:
        """Close the connections this process opened; later use raises :class:`StoreError`. Idempotent.

        The caller's connection, the shared one and those of threads that have ended are closed now.
        Another live thread's connection is only let go of: that thread may be inside a statement on
        it, and closing a connection under a running statement frees memory the statement still reads
        (a segmentation fault). It closes when that thread drops it; the thread's next use raises.
        """
        me = threading.current_thread()
        with self._lock:
            self._closed = True
            here = [(owner, c) for pid, owner, c in self._connections if pid == os.getpid()]
            # Connections inherited through fork are left alone: closing them in the
            # child could disturb the parent's locks.
            self._connections = [entry for entry in self._connections if entry[0] != os.getpid()]
            self._shared = None
        mine = [c for owner, c in here if owner is None or owner is me or not owner.is_alive()]
        for conn in mine:
            try:
                conn.close()
            except sqlite3.Error:
                pass
        self._local = threading.local()


def _rollback(conn: sqlite3.Connection) -> None:
    # SQLite may already have rolled back by itself (e.g. after SQLITE_FULL).
    if conn.in_transaction:
        try:
            conn.execute("ROLLBACK")
        except sqlite3.Error:
            pass


class SqliteDatabase:
    """The embedded store's database ``<root>/refsight.db``: per-thread, per-process connections, schema checked.

    The connection handling is :class:`SqliteConnections`; this class adds the store's schema
    (:mod:`refsight.store.schema`), its version check and its migrations. Writes go through
    :meth:`write`, a ``BEGIN IMMEDIATE`` transaction: it takes the database's write lock up
    front, which serialises writers across processes, and lets callers do a check-then-act
    (is the row there? then rename, then insert) as one step.
    """

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.path = self.root / schema.DB_NAME
        self._sqlite = SqliteConnections(
            self.path,
            # NORMAL is safe in WAL (never corrupts); a power loss can only drop the last
            # commits. Package files are fsynced before their rows, so the worst case is an
            # orphan file without a row, which gc() removes. Rows never point at lost data.
            pragmas=("synchronous = NORMAL",),
            schema=self._ensure_schema,
            open_error="{path} is not a refsight store: {exc}",
            closed_error=f"store {self.root} is closed",
        )

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has been called."""
        return self._sqlite.closed

    def connection(self) -> sqlite3.Connection:
        """This thread's connection (opened on first use; a new one after a fork)."""
        return self._sqlite.connection()

    def write(self) -> AbstractContextManager[sqlite3.Connection]:
        """A ``BEGIN IMMEDIATE`` transaction: the write lock is held from the start, committed on success."""
        return self._sqlite.write()

    def close(self) -> None:
        """Close the connections this process opened. Idempotent."""
        self._sqlite.close()

    def _ensure_schema(self, conn: sqlite3.Connection) -> None:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if not tables:
            schema.create(conn)
            return
        foreign = lambda: StoreError(f"{self.path} is an SQLite database but not a refsight store")  # noqa: E731
        if "meta" not in tables:
            raise foreign()
        schema.upgrade(conn, str(self.path), foreign=foreign)


def open_database(root: Path, database=None):
    """``database`` when given (a shared one), else the embedded database of ``root``, creating the directory."""
    if database is not None:
        return database
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StoreError(f"cannot create store directory {root}: {exc}") from exc
    return SqliteDatabase(root)
