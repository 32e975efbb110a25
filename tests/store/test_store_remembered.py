"""The store's remembered images (store/remembered.py): rows per namespace beside their packages, kept by gc and by
a reference's removal, gone with their package, forgotten on demand; on SQLite and on PostgreSQL."""

from __future__ import annotations

import pytest
from store_helpers import make_package, written_before_the_codec


def _remembered(store, n: int, *namespaces: str) -> str:
    """A package written as PackageCache.served_prompt writes a remembered image's, remembered by ``namespaces``."""
    package = make_package(n)
    store.packages.put(package)
    for namespace in namespaces:
        store.remembered.add(namespace, package.key)
    return package.key


def test_rows_list_count_and_forget_per_namespace(opener, tmp_path):
    with opener(tmp_path / "store") as store:
        shared = _remembered(store, 1, "a", "b")
        own = _remembered(store, 2, "a")
        store.remembered.add("a", own)  # idempotent: the second request of a process writes nothing new
        assert store.remembered.contains("a", own) and not store.remembered.contains("b", own)
        assert {i.package_key for i in store.remembered.list(namespace="a")} == {shared, own}
        assert [i.package_key for i in store.remembered.list(namespace="b")] == [shared]
        size = store.local.record(own).bytes
        assert store.remembered.totals(namespace="a") == (2, size + store.local.record(shared).bytes)
        assert store.remembered.totals()[0] == 2  # a package two namespaces remember counts once
        dropped, unused = store.remembered.forget(namespace="a")
        assert dropped == 2 and unused == [own]  # b still remembers the shared one
        assert store.remembered.forget(namespace="b", keys=[]) == (0, [])


def test_gc_and_a_reference_removal_keep_a_remembered_package_and_deleting_it_drops_its_rows(opener, tmp_path):
    with opener(tmp_path / "store") as store:
        key = _remembered(store, 3, "a")
        package = store.local.get(key)
        store.catalog.put_image(package.image_sha256, b"bytes", "PNG")
        store.catalog.add_reference("ref", package.image_sha256, {})
        store.catalog.link_package("ref", package.fingerprint.digest, key)
        _, orphans = store.catalog.remove_reference("ref")
        assert orphans == []  # still remembered: not the reference's to delete
        assert store.gc(grace_s=0)["unlinked_packages"] == 0 and store.local.contains(key)
        store.local.delete(key)  # the quota, prune or a corrupt read
        assert store.remembered.list() == [] and not store.remembered.contains("a", key)


@pytest.mark.parametrize("version", [4])
def test_a_store_before_remembered_images_gets_the_table(opener, tmp_path, version):
    root = tmp_path / "v4"
    with opener(root) as store:
        store.packages.put(package := make_package(4))
        written_before_the_codec(store, package.key)
    opener.sql(root, ["ALTER TABLE packages DROP COLUMN raw_bytes", "DROP TABLE remembered_packages",
                      f"UPDATE meta SET value = '{version}' WHERE name = 'schema_version'"])
    with opener(root) as store:
        assert store.remembered.list() == [] and store.remembered.totals() == (0, 0)
        key = _remembered(store, 5, "a")
        assert [i.package_key for i in store.remembered.list()] == [key]
