"""A full disk while a new file is published (issue 25 item 9): the store says so and leaves nothing behind.

Kept images, packages and prefix states share one publish path (``store/_files.py``: temp file,
fsync, rename inside the transaction, row). On a full disk each raises
:class:`StoreUnavailableError` "no space left on device" naming the disk, and leaves no temp file
and no row. The disk is a real, small tmpfs when this machine lets the test mount one (root);
elsewhere ENOSPC is injected where the OS reports it for a new file's data (its ``fsync``).
"""

from __future__ import annotations

import errno
import os
import subprocess

import pytest
import torch
from store_helpers import image_hash, make_package

from refsight.errors import StoreUnavailableError
from refsight.store import open_store

DISK_BYTES = 8 << 20
BIG = 2 << 20  # more than the room left on the filled disk


class SmallDisk:
    """A directory on a small file system, and a way to fill that file system up."""

    def __init__(self, root, monkeypatch) -> None:
        self.root = root
        self.mounted = False
        self._monkeypatch = monkeypatch

    def fill(self) -> None:
        """Leave less room than one big write needs (a real tmpfs), or make new files fail with ENOSPC."""
        if not self.mounted:
            import refsight.store._files as files

            def no_space(fd):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

            self._monkeypatch.setattr(files.os, "fsync", no_space)
            return
        with open(self.root / "filler", "wb") as f:
            try:
                while True:
                    f.write(b"\0" * 65536)
                    f.flush()
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
        os.truncate(self.root / "filler", os.path.getsize(self.root / "filler") - (256 << 10))


@pytest.fixture
def small_disk(tmp_path, monkeypatch):
    root = tmp_path / "disk"
    root.mkdir()
    disk = SmallDisk(root, monkeypatch)
    mount = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK_BYTES}", "tmpfs", str(root)], capture_output=True)
    disk.mounted = mount.returncode == 0
    try:
        yield disk
    finally:
        if disk.mounted:
            subprocess.run(["umount", "-l", str(root)], check=False)


def _assert_nothing_left(store) -> None:
    assert not list(store.root.rglob(".tmp-*")), "a temp file outlived the failed write"
    conn = store._db.connection()
    assert conn.execute("SELECT COUNT(*) FROM images").fetchone()[0] == 0
    assert conn.execute('SELECT COUNT(*) FROM "references"').fetchone()[0] == 0
    assert conn.execute("SELECT COUNT(*) FROM packages").fetchone()[0] == 0


def _assert_full_disk(info, disk) -> None:
    assert info.value.reason == "no space left on device"
    assert "no space left on device" in str(info.value) and str(disk.root) in str(info.value)


def test_a_new_image_published_by_an_add_on_a_full_disk_is_store_unavailable(small_disk):
    with open_store(small_disk.root / "store", memory_bytes=1 << 20) as store:
        small_disk.fill()
        with pytest.raises(StoreUnavailableError) as info:
            store.catalog.ingest_reference("ref", image_hash(1), os.urandom(BIG), "PNG", {"k": "v"})
        _assert_full_disk(info, small_disk)
        _assert_nothing_left(store)
        with pytest.raises(StoreUnavailableError) as info:
            store.catalog.put_image(image_hash(2), os.urandom(BIG), "PNG")
        _assert_full_disk(info, small_disk)
        _assert_nothing_left(store)


def test_a_package_and_a_prefix_state_on_a_full_disk_are_store_unavailable(small_disk):
    with open_store(small_disk.root / "store", memory_bytes=1 << 20) as store:
        small_disk.fill()
        with pytest.raises(StoreUnavailableError) as info:
            store.local.put(make_package(1, tokens=8192, dims=128))
        _assert_full_disk(info, small_disk)
        _assert_nothing_left(store)
        state = {"kv": torch.zeros(BIG // 4, dtype=torch.float32)}
        with pytest.raises(StoreUnavailableError) as info:
            store.prefixes.put("a" * 64, state, meta={}, tokens=1, build_ms=1.0)
        _assert_full_disk(info, small_disk)
        assert not store.prefixes.contains("a" * 64)
        _assert_nothing_left(store)
