"""Fixtures for the store tests: a fresh store directory per test, on SQLite or on PostgreSQL."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from refsight.store import open_store

# The helpers module is shared with the subprocess workers, which run as plain scripts.
sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture
def store(tmp_path):
    with open_store(tmp_path / "store", memory_bytes=1 << 20) as s:
        yield s


class StoreOpener:
    """Opens stores of one kind: embedded (SQLite beside the files) or shared (PostgreSQL + blob directory).

    ``opener(root)`` opens a store at ``root``; ``opener.sql(root, statements)`` runs raw SQL on
    that store's database (to fake an older schema); ``opener.args(root)`` gives what a
    subprocess passes to ``open_store`` (root, catalog, local_dir).
    """

    def __init__(self, kind: str, url: str | None = None, local: Path | None = None) -> None:
        self.kind, self.url, self.local = kind, url, local

    def __call__(self, root: Path, **options):
        if self.url is None:
            return open_store(root, **options)
        return open_store(root, catalog=self.url, local_dir=self.local, **options)

    def args(self, root: Path) -> list[str]:
        return [str(root), self.url or "", str(self.local or "")]

    def sql(self, root: Path, statements: list) -> list:
        """Run each statement (a string, or ``(sql, params)`` with ``?`` placeholders); their rows."""
        items = [(s, ()) if isinstance(s, str) else s for s in statements]
        if self.url is None:
            import sqlite3

            conn = sqlite3.connect(root / "refsight.db")
            try:
                return [conn.execute(s, params).fetchall() for s, params in items]
            finally:
                conn.commit()
                conn.close()
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            out = []
            for statement, params in items:
                cursor = conn.execute(statement.replace("?", "%s"), params)
                out.append(cursor.fetchall() if cursor.description else [])
            return out

    def __repr__(self) -> str:
        return self.kind


# PostgreSQL is a server started for the session: its half of each test is left to the slow runs.
@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.slow)])
def opener(request, tmp_path_factory) -> StoreOpener:
    """A :class:`StoreOpener` for each catalog implementation (the PostgreSQL one on a fresh database)."""
    if request.param == "sqlite":
        return StoreOpener("sqlite")
    url = request.getfixturevalue("postgres")
    return StoreOpener("postgresql", url, tmp_path_factory.mktemp("replica"))
