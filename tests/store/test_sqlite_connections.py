"""SqliteConnections, the one connection helper of the store, retrieval and attribute databases."""

from __future__ import annotations

import os
import sqlite3
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
