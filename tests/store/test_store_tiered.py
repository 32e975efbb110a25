"""TieredPackageStore and open_store: memory in front of disk, promotion, eviction counters."""

from __future__ import annotations

import os
import sqlite3

import pytest
import torch
from store_helpers import make_package

from refsight.errors import CorruptPackageError, StoreError
from refsight.store import SCHEMA_VERSION, DiskPackageStore, MemoryPackageStore, TieredPackageStore, open_store


def test_writes_reach_disk_and_memory_and_reads_promote(tmp_path):
    with open_store(tmp_path / "s", memory_bytes=1 << 20) as store:
        package = make_package(0)
        store.packages.put(package)
        assert store.local.contains(package.key) and store.memory.get(package.key) is package
        store.memory.clear()
        loaded = store.packages.get(package.key)  # from disk
        assert loaded is not package and torch.equal(loaded.tensors["features"], package.tensors["features"])
        assert store.memory.get(package.key) is loaded  # promoted
        assert store.packages.get(package.key) is loaded  # now a memory hit
        assert store.packages.delete(package.key)
        assert store.packages.get(package.key) is None and not store.packages.contains(package.key)


def test_evictions_are_counted_in_the_catalog_and_persist(tmp_path):
    first = make_package(0)
    with open_store(tmp_path / "s", memory_bytes=2 * first.nbytes) as store:
        for n in range(5):
            store.packages.put(make_package(n))
        # counted in memory first (an eviction may happen on a read's promotion: no write there)
        assert store.counters.pending()["evictions"] == 3
        store.counters.flush()
        assert store.catalog.counters()["evictions"] == 3
        assert set(store.packages.keys()) == {make_package(n).key for n in range(5)}
    with open_store(tmp_path / "s") as store:
        assert store.catalog.counters()["evictions"] == 3


def test_a_corrupt_disk_copy_is_never_served(tmp_path):
    with open_store(tmp_path / "s") as store:
        package = make_package(0)
        store.packages.put(package)
        store.memory.clear()
        path = store.local.path_for(package.key)
        data = bytearray(path.read_bytes())
        data[-1] ^= 0xFF
        path.write_bytes(data)
        with pytest.raises(CorruptPackageError):
            store.packages.get(package.key)
        assert store.memory.get(package.key) is None


def test_tiers_compose_without_open_store(tmp_path):
    local = DiskPackageStore(tmp_path)
    memory = MemoryPackageStore(1 << 20)
    tiered = TieredPackageStore([memory, local])
    package = make_package(1)
    assert tiered.put(package) == local.path_for(package.key).stat().st_size
    assert tiered.contains(package.key)
    tiered.close()


def test_open_store_refuses_unusable_paths(tmp_path):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    for path, reason in ((a_file, "not a directory"), (a_file / "sub", "cannot create")):
        with pytest.raises(StoreError, match=reason):
            open_store(path)


def test_open_store_refuses_a_foreign_database(tmp_path):
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "refsight.db").write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StoreError, match="not a refsight store"):
        open_store(junk)
    other = tmp_path / "other"
    other.mkdir()
    with sqlite3.connect(other / "refsight.db") as conn:
        conn.execute("CREATE TABLE t (x)")
    with pytest.raises(StoreError, match="not a refsight store"):
        open_store(other)


def test_open_store_records_and_checks_the_schema_version(tmp_path):
    root = tmp_path / "s"
    open_store(root).close()
    with sqlite3.connect(root / "refsight.db") as conn:
        assert conn.execute("SELECT value FROM meta WHERE name = 'schema_version'").fetchone()[0] == str(SCHEMA_VERSION)
        conn.execute("UPDATE meta SET value = ? WHERE name = 'schema_version'", (str(SCHEMA_VERSION + 1),))
    with pytest.raises(StoreError, match="newer"):
        open_store(root)


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
def test_open_store_refuses_a_read_only_directory(tmp_path):
    root = tmp_path / "ro"
    root.mkdir()
    root.chmod(0o500)
    try:
        with pytest.raises(StoreError, match="not writable"):
            open_store(root)
    finally:
        root.chmod(0o700)


def test_closed_store_refuses_work_and_import_stays_light(tmp_path):
    store = open_store(tmp_path / "s")
    store.close()
    store.close()  # idempotent
    with pytest.raises(StoreError, match="closed"):
        store.local.contains("0" * 64)
    import subprocess
    import sys

    code = "import sys, refsight.store; assert 'torch' not in sys.modules, 'torch imported'"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
