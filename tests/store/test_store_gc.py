"""Store.gc (issue 18 row 9): debris of killed or failed writes goes, live data and young writes stay.

Each test runs on the embedded store and on the shared one (PostgreSQL catalog + blob directory).
"""

from __future__ import annotations

import os
import time

import pytest
from store_helpers import image_hash, make_package

from refsight.errors import InvalidInputError


OLD = time.time() - 7200  # two hours ago: older than any grace period used here


def _age(path, when: float = OLD) -> None:
    os.utime(path, (when, when))


def _linked_reference(store, n: int) -> str:
    """A complete add: package, image bytes, reference, link (what engine.add does)."""
    package = make_package(n)
    store.packages.put(package)
    store.catalog.put_image(package.image_sha256, f"image bytes {n}".encode(), "PNG")
    store.catalog.add_reference(f"ref-{n}", package.image_sha256, {})
    store.catalog.link_package(f"ref-{n}", package.fingerprint.digest, package.key)
    return package.key


def _debris(store, root):
    """Everything a SIGKILL or an ENOSPC mid-add can leave, made old enough to collect."""
    # An add that failed after its package and image landed (e.g. ENOSPC on the reference row).
    orphan = make_package(50)
    store.packages.put(orphan)
    store.catalog.put_image(image_hash(51), b"unreferenced image", "PNG")
    _age(store.catalog.image_path(image_hash(51)))
    # Writers killed mid-write: temp files; killed between rename and commit: files without rows.
    temps = [root / "packages" / "ab" / "cd" / ".tmp-killed.partial", root / "images" / "ab" / ".tmp-killed.partial"]
    for temp in temps:
        temp.parent.mkdir(parents=True, exist_ok=True)
        temp.write_bytes(b"half written")
        _age(temp)
    stray_package = store.local.path_for("e" * 64)
    stray_package.parent.mkdir(parents=True, exist_ok=True)
    stray_package.write_bytes(b"no row")
    stray_image = store.catalog.image_path("f" * 64)
    stray_image.parent.mkdir(parents=True, exist_ok=True)
    stray_image.write_bytes(b"no row")
    return orphan.key


def test_gc_removes_every_kind_of_debris_and_keeps_live_references(opener, tmp_path):
    root = tmp_path / "store"
    with opener(root) as store:
        live = [_linked_reference(store, n) for n in range(3)]
        orphan_key = _debris(store, root)
        # The orphan package is old only if its row says so: make it so in the index.
        with store._db.write() as conn:
            conn.execute("UPDATE packages SET created_at = ? WHERE key = ?", (OLD, orphan_key))

        counts = store.gc()
        assert counts == {
            "temp_files": 2,
            "orphan_package_files": 1,
            "orphan_image_files": 1,
            "unlinked_packages": 1,
            "unreferenced_images": 1,
        }, counts
        assert not list(root.rglob(".tmp-*"))
        assert not store.packages.contains(orphan_key) and not store.local.path_for(orphan_key).exists()
        assert not store.catalog.has_image(image_hash(51))
        assert not store.catalog.image_path(image_hash(51)).exists()
        for n, key in enumerate(live):
            assert store.packages.get(key) is not None
            assert store.catalog.get_image(image_hash(n)) == f"image bytes {n}".encode()
        assert [problem for _, problem in store.local.verify_all()] == [None] * 3
        assert store.gc() == dict.fromkeys(counts, 0)  # idempotent


def test_gc_leaves_young_rows_and_temp_files_to_writes_in_progress(opener, tmp_path):
    root = tmp_path / "store"
    with opener(root) as store:
        young = make_package(7)
        store.packages.put(young)  # an add that has not linked it yet
        store.catalog.put_image(young.image_sha256, b"bytes", "PNG")
        temp = root / "images" / "ab" / ".tmp-writing.partial"
        temp.parent.mkdir(parents=True, exist_ok=True)
        temp.write_bytes(b"being written")

        counts = store.gc(grace_s=600)
        assert counts["unlinked_packages"] == counts["unreferenced_images"] == counts["temp_files"] == 0
        assert store.packages.contains(young.key) and store.catalog.has_image(young.image_sha256) and temp.exists()
        # ... and the add completes normally afterwards.
        store.catalog.add_reference("late", young.image_sha256, {})
        store.catalog.link_package("late", young.fingerprint.digest, young.key)
        assert store.gc(grace_s=0)["unlinked_packages"] == 0
        assert store.packages.get(young.key) is not None


def test_opening_a_store_sweeps_temp_files_older_than_an_hour(opener, tmp_path):
    root = tmp_path / "store"
    with opener(root) as store:
        _linked_reference(store, 1)
    old = root / "packages" / "aa" / "bb" / ".tmp-old.partial"
    new = root / "images" / "aa" / ".tmp-new.partial"
    for path in (old, new):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x")
    _age(old)
    (root / ".temp-sweep").unlink()  # the last sweep was long ago
    with opener(root):
        pass
    assert not old.exists() and new.exists()  # an hour-old temp goes; a fresh one may be a live writer's


@pytest.mark.parametrize("grace", [-5, -0.001, float("nan"), float("inf"), float("-inf"), True, "600"])
def test_gc_refuses_a_grace_that_would_let_it_delete_what_live_writers_own(store, grace):
    young = make_package(8)
    store.packages.put(young)  # an add in progress: its row is younger than any real grace
    with pytest.raises(InvalidInputError, match="grace") as info:
        store.gc(grace_s=grace)
    assert info.value.input == "grace"
    assert store.packages.contains(young.key)
