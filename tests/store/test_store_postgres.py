"""The shared store on PostgreSQL: leases, concurrent publishes, outages, URLs (a real server on loopback)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest
from store_helpers import image_hash, make_package

from refsight.errors import StoreError, StoreUnavailableError
from refsight.store import open_store
from refsight.store.postgres import redact_url

pytestmark = pytest.mark.slow  # starts PostgreSQL servers (and kills replicas)


@pytest.fixture
def shared(postgres, tmp_path):
    """``shared()`` opens another handle (its own sessions, as another replica has) on one shared store."""
    opened = []

    def open_one(**options):
        store = open_store(tmp_path / "blobs", catalog=postgres, local_dir=tmp_path / f"local-{len(opened)}", **options)
        opened.append(store)
        return store

    yield open_one
    for store in opened:
        store.close()


def test_a_lease_is_held_by_one_replica_at_a_time(shared):
    a, b = shared(), shared()
    key = make_package(1).key
    events = []
    with a.lease(key) as got:
        assert got
        waiter = threading.Thread(target=lambda: events.append(("b", b.lease(key).__enter__())))
        waiter.start()
        time.sleep(0.5)
        assert events == [], "b got the lease while a held it"
        events.append(("a released", True))
    waiter.join(10)
    assert events == [("a released", True), ("b", True)]
    # Patience is bounded: a waiter gives up (and the caller encodes anyway) after its timeout.
    with a.lease(make_package(2).key):
        started = time.monotonic()
        with b._db.lease(make_package(2).key, timeout_s=0.3) as got:
            assert got is False and time.monotonic() - started < 3


def test_a_killed_replica_drops_its_leases_at_once(shared, postgres, tmp_path):
    key = make_package(3).key
    code = (
        "import sys, time; from refsight.store import open_store\n"
        "s = open_store(sys.argv[1], catalog=sys.argv[2], local_dir=sys.argv[3])\n"
        "lease = s.lease(sys.argv[4]); assert lease.__enter__(); print('held', flush=True); time.sleep(600)\n"
    )
    holder = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "blobs"), postgres, str(tmp_path / "lk"), key],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        other = shared()
        with other._db.lease(key, timeout_s=0.3) as got:
            assert got is False  # held by a live replica
        holder.kill()
        holder.wait(10)
        started = time.monotonic()
        with other._db.lease(key, timeout_s=10) as got:
            assert got and time.monotonic() - started < 5
    finally:
        holder.kill()
        holder.wait()


def test_concurrent_publishes_of_one_package_leave_one_row_and_an_intact_file(shared):
    stores = [shared() for _ in range(4)]
    package = make_package(4)
    with_threads = [threading.Thread(target=store.packages.put, args=(package,)) for store in stores for _ in range(2)]
    for thread in with_threads:
        thread.start()
    for thread in with_threads:
        thread.join()
    assert list(stores[0].local.keys()) == [package.key]
    assert [problem for _, problem in stores[0].local.verify_all()] == [None]
    files = list((stores[0].root / "packages").rglob("*.safetensors"))
    assert len(files) == 1 and not list((stores[0].root / "packages").rglob(".tmp-*"))
    # what one replica wrote, another reads (memory miss → shared index → blob file)
    assert stores[3].packages.get(package.key).key == package.key


def test_an_outage_is_store_unavailable_within_the_timeouts_and_ends_by_itself(private_postgres, tmp_path):
    url = private_postgres.create_database()
    store = open_store(tmp_path / "blobs", catalog=url, local_dir=tmp_path / "local")
    try:
        store.catalog.add_reference("kept", image_hash(1), {"k": 1})
        package = make_package(1)
        store.packages.put(package)
        private_postgres.stop()
        for call in (store.catalog.list_references, lambda: store.catalog.add_reference("new", image_hash(2), {})):
            started = time.monotonic()
            with pytest.raises(StoreUnavailableError, match="catalog .* is unavailable") as info:
                call()
            assert info.value.reason.startswith("the catalog is unreachable")  # what failed: not "cannot be written"
            assert time.monotonic() - started < 10
        assert store.packages.get(package.key) is not None  # in memory: served without the catalog
        private_postgres.start()
        assert [r.ref_id for r in store.catalog.list_references()] == ["kept"]  # same Store: reconnected
        store.catalog.add_reference("new", image_hash(2), {})
        assert store.catalog.count_references() == 2
    finally:
        store.close()


def test_bad_catalog_urls_and_an_embedded_store_are_refused_clearly(tmp_path, postgres):
    with pytest.raises(StoreError, match="postgresql://"):
        open_store(tmp_path / "a", catalog="mysql://x")
    with open_store(tmp_path / "embedded"):
        pass
    with pytest.raises(StoreError, match="embedded store"):
        open_store(tmp_path / "embedded", catalog=postgres)
    with pytest.raises(StoreUnavailableError) as info:
        open_store(tmp_path / "b", catalog="postgresql://someone:hunter2@127.0.0.1:1/none")
    assert "hunter2" not in str(info.value)
    assert redact_url("postgresql://u:pw@h/db") == "postgresql://u:***@h/db"


def test_cli_commands_take_a_catalog(postgres, tmp_path, capsys, monkeypatch):
    import io
    import json

    from PIL import Image

    from refsight.cli import main

    image = tmp_path / "cat.png"
    buffer = io.BytesIO()
    Image.new("RGB", (24, 16), (200, 120, 40)).save(buffer, format="PNG")
    image.write_bytes(buffer.getvalue())
    flags = ["--store", str(tmp_path / "blobs"), "--local-dir", str(tmp_path / "local"), "--json"]
    monkeypatch.setenv("REFSIGHT_CATALOG", postgres)  # the environment names the catalog, as a deployment would
    assert main(["add", str(image), "--id", "cat", "--model", "toy", *flags]) == 0
    assert main(["stats", *flags]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert lines[0]["ref_id"] == "cat" and lines[-1]["references"] == 1 and lines[-1]["packages"] == 1
    assert not (tmp_path / "blobs" / "refsight.db").exists() and (tmp_path / "local").is_dir()
    monkeypatch.delenv("REFSIGHT_CATALOG")
    assert main(["stats", "--catalog", "mysql://u:secret@h/db", *flags]) == 1
    assert main(["stats", "--catalog", "postgresql://u:secret@127.0.0.1:1/db", *flags]) == 1
    err = capsys.readouterr().err
    assert "postgresql://" in err and "unavailable" in err and "secret" not in err
