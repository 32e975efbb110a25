"""SqliteConnections, the one connection helper of the store, retrieval and attribute databases."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import threading

import pytest

from refsight.errors import StoreError
from refsight.store.sqlite import SqliteConnections


def _table(conn: sqlite3.Connection) -> None:
    conn.execute("CREATE TABLE IF NOT EXISTS t (x INTEGER)")


def test_schema_runs_once_in_wal_mode_with_the_pragmas(tmp_path):
    db = SqliteConnections(tmp_path / "sub" / "a.sqlite", schema=_table, pragmas=("page_size = 16384",))
    conn = db.connection()
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA page_size").fetchone()[0] == 16384
    assert conn.execute("PRAGMA busy_timeout").fetchone()[0] == 30_000
    assert conn.execute("SELECT name FROM sqlite_master").fetchall() == [("t",)]
    db.close()


def test_threads_get_their_own_connection_unless_shared(tmp_path):
    for per_thread in (True, False):
        db = SqliteConnections(tmp_path / f"{per_thread}.sqlite", schema=_table, per_thread=per_thread)
        seen = []
        worker = threading.Thread(target=lambda: seen.append(db.connection()))
        worker.start()
        worker.join()
        assert (seen[0] is db.connection()) is (not per_thread)
        assert db.connection() is db.connection()
        db.close()


def test_a_forked_child_opens_its_own_connection(tmp_path):
    db = SqliteConnections(tmp_path / "a.sqlite", schema=_table)
    parent = id(db.connection())
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: a fresh connection, and it can write
        try:
            with db.write() as conn:
                conn.execute("INSERT INTO t VALUES (7)")
            os.write(write, b"new" if id(db.connection()) != parent else b"same")
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(read, 8) == b"new"
    assert db.connection().execute("SELECT x FROM t").fetchall() == [(7,)]
    db.close()


def test_write_commits_or_rolls_back_as_a_whole(tmp_path):
    db = SqliteConnections(tmp_path / "a.sqlite", schema=_table)
    with db.write() as conn:
        conn.execute("INSERT INTO t VALUES (1)")
    with pytest.raises(RuntimeError), db.write() as conn:
        conn.execute("INSERT INTO t VALUES (2)")
        raise RuntimeError("half-way")
    assert db.connection().execute("SELECT x FROM t").fetchall() == [(1,)]
    assert not db.connection().in_transaction and not db.closed
    db.close()
    db.close()  # idempotent
    assert db.closed
    with pytest.raises(StoreError, match="closed"):
        db.connection()


def test_a_file_that_is_not_sqlite_raises_the_callers_message(tmp_path):
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"not a database at all " * 200)
    with pytest.raises(StoreError, match=r"cannot open the junk database .*junk\.sqlite"):
        SqliteConnections(junk, schema=_table, open_error="cannot open the junk database {path}: {exc}")


#: Three threads query in a loop while the main thread closes the helper, twenty times over; prints each
#: thread's outcome. Before the fix, closing a connection under a running statement crashed the process.
_CLOSE_UNDER_READERS = """
import sqlite3, sys, threading, time
from refsight.errors import StoreError
from refsight.store.sqlite import SqliteConnections

QUERY = "WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM c WHERE n < 20000) SELECT sum(n) FROM c"
outcomes = []
for round in range(20):
    db = SqliteConnections(f"{sys.argv[1]}/{round}.sqlite", schema=lambda c: c.execute("CREATE TABLE t (x)"))
    def reader():
        while True:
            try:
                db.connection().execute(QUERY).fetchone()
            except (StoreError, sqlite3.Error) as exc:
                outcomes.append(type(exc).__name__)
                return
    threads = [threading.Thread(target=reader) for _ in range(3)]
    for t in threads:
        t.start()
    time.sleep(0.05)
    db.close()
    for t in threads:
        t.join()
print(sorted(set(outcomes)), len(outcomes))
"""


def test_closing_while_other_threads_query_stops_them_with_an_error_not_a_crash(tmp_path):
    """A live thread's connection is let go of, not closed under its running statement (which freed memory the
    statement still read: CI's segfaults of stops 54, 55 and 58, a reader thread of the Redis tier's tests). Each
    reader's next use raises StoreError. In a child process, so that a regression fails this test, not the run."""
    run = subprocess.run([sys.executable, "-X", "faulthandler", "-c", _CLOSE_UNDER_READERS, str(tmp_path)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, (run.returncode, run.stderr[-3000:])
    assert run.stdout.split() == ["['StoreError']", "60"]


def test_a_thread_that_ended_has_its_connection_closed_with_the_helper(tmp_path):
    db = SqliteConnections(tmp_path / "a.sqlite", schema=_table)
    opened = []
    worker = threading.Thread(target=lambda: opened.append(db.connection()))
    worker.start()
    worker.join()
    db.close()
    with pytest.raises(sqlite3.ProgrammingError, match="closed"):
        opened[0].execute("SELECT 1")
