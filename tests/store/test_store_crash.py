"""A writer killed with SIGKILL leaves a store where every indexed package verifies."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from refsight.store import open_store

WORKER = Path(__file__).with_name("store_workers.py")
pytestmark = [
    pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL"),
    pytest.mark.slow,  # writer processes killed mid-write
]


def start_writer(root: Path, count: int, hang_after: int) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(WORKER), "writer", str(root), str(count), str(hang_after)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def read_until(proc: subprocess.Popen, prefix: str, times: int) -> list[str]:
    lines = []
    while len([entry for entry in lines if entry.startswith(prefix)]) < times:
        line = proc.stdout.readline()
        if not line:
            proc.kill()
            raise AssertionError(f"writer ended early: {proc.stderr.read()}")
        lines.append(line.strip())
    return lines


def assert_store_is_clean(root: Path, written: set[str]) -> None:
    with open_store(root) as store:
        keys = set(store.local.keys())
        # Everything the writer reported as stored survived, and nothing else is visible.
        assert written <= keys
        assert len(keys - written) <= 1  # at most the write in flight, and only if it committed
        problems = {k: p for k, p in store.local.verify_all() if p is not None}
        assert problems == {}
        for key in keys:
            assert store.local.get(key) is not None
        # Readers only ever see published names: no temp file is reachable through the index.
        assert all(not k.startswith(".") for k in keys)
        store.local.gc(temp_age_s=0)
        leftovers = [p.name for p in (root / "packages").rglob("*") if p.is_file()]
        assert sorted(leftovers) == sorted(f"{k}.safetensors" for k in keys)


def test_sigkill_during_many_writes_leaves_only_verified_packages(tmp_path):
    root = tmp_path / "store"
    proc = start_writer(root, count=2000, hang_after=-1)
    lines = read_until(proc, "PUT", 25)
    os.kill(proc.pid, signal.SIGKILL)  # lands in whatever write comes next
    proc.wait()
    written = {entry.split()[1] for entry in lines if entry.startswith("PUT")}
    assert_store_is_clean(root, written)


def test_sigkill_between_rename_and_index_row_leaves_an_orphan_that_gc_removes(tmp_path):
    root = tmp_path / "store"
    proc = start_writer(root, count=10, hang_after=3)
    lines = read_until(proc, "RENAMED", 1)
    # The writer now holds the database write lock, with its file renamed but no row.
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    written = {entry.split()[1] for entry in lines if entry.startswith("PUT")}
    orphan_name = next(entry.split()[1] for entry in lines if entry.startswith("RENAMED"))
    orphan_key = orphan_name.removesuffix(".safetensors")
    with open_store(root) as store:
        # The kill released the lock: this store can write at once.
        assert set(store.local.keys()) == written and len(written) == 3
        assert store.local.get(orphan_key) is None, "an unindexed file must be invisible"
        assert store.local.path_for(orphan_key).exists()
        assert store.local.gc()["orphans"] == 1
        assert not store.local.path_for(orphan_key).exists()
    assert_store_is_clean(root, written)
