"""The catalog: references per namespace, id validation, image bytes, orphan keys, counters, journal, migrations.

One suite, two implementations: every test runs on the embedded catalog (SQLite) and on the
shared one (PostgreSQL, a real server on loopback; see ``tests/services.py``).
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from store_helpers import fingerprint, image_hash, make_package, written_before_the_codec

from refsight.errors import InvalidInputError, InvalidReferenceIdError, NotFoundError, ReferenceNotFoundError, StoreError
from refsight.store import COUNTER_NAMES, SqlCatalog


@pytest.fixture
def catalog(opener, tmp_path):
    with opener(tmp_path) as store:
        assert isinstance(store.catalog, SqlCatalog)  # the one implementation of the rules, on either database
        yield store.catalog


def test_add_get_list_and_metadata_merge(catalog):
    ref = catalog.add_reference("cat-1", image_hash(1), {"label": "tabby"})
    assert ref.ref_id == "cat-1" and ref.image_sha256 == image_hash(1) and ref.packages == {}
    again = catalog.add_reference("cat-1", image_hash(1), {"colour": "grey"})
    assert again.metadata == {"label": "tabby", "colour": "grey"}
    assert again.created_at == ref.created_at
    catalog.add_reference("cat-2", image_hash(2), {})
    assert [r.ref_id for r in catalog.list_references()] == ["cat-1", "cat-2"]
    assert [r.ref_id for r in catalog.find_references(image_hash(1))] == ["cat-1"]
    assert catalog.count_references() == 2


def test_namespaces_are_isolated(catalog):
    catalog.add_reference("same-id", image_hash(1), {"tenant": "a"}, namespace="tenant-a")
    catalog.add_reference("same-id", image_hash(2), {"tenant": "b"}, namespace="tenant-b")
    assert catalog.get_reference("same-id", namespace="tenant-a").image_sha256 == image_hash(1)
    assert catalog.get_reference("same-id", namespace="tenant-b").image_sha256 == image_hash(2)
    with pytest.raises(ReferenceNotFoundError):
        catalog.get_reference("same-id")
    assert catalog.find_references(image_hash(1), namespace="tenant-b") == []
    assert catalog.namespaces() == ["tenant-a", "tenant-b"]
    catalog.remove_reference("same-id", namespace="tenant-a")
    assert catalog.get_reference("same-id", namespace="tenant-b").metadata == {"tenant": "b"}
    with pytest.raises(InvalidInputError, match="namespace"):
        catalog.list_references(namespace="../x")


@pytest.mark.parametrize("bad", ["", "../etc", "a/b", ".hidden", "a..b", "x" * 129, "sp ace", None, 7, "é"])
def test_invalid_ids_are_refused(catalog, bad):
    with pytest.raises(InvalidReferenceIdError) as info:
        catalog.add_reference(bad, image_hash(1), {})
    assert info.value.input == bad
    assert catalog.count_references() == 0


def test_same_id_with_another_image_is_refused(catalog):
    catalog.add_reference("ref", image_hash(1), {"v": 1})
    with pytest.raises(InvalidInputError, match="another image") as info:
        catalog.add_reference("ref", image_hash(2), {"v": 2})
    assert info.value.input == "ref"
    assert catalog.get_reference("ref").metadata == {"v": 1}


def test_bad_hashes_and_metadata_are_refused(catalog):
    with pytest.raises(InvalidInputError, match="sha256"):
        catalog.add_reference("ref", "../../x", {})
    with pytest.raises(InvalidInputError, match="JSON"):
        catalog.add_reference("ref", image_hash(1), {"x": object()})
    with pytest.raises(InvalidInputError, match="string keys"):
        catalog.add_reference("ref", image_hash(1), {1: "x"})


def test_link_package_and_remove_returns_only_orphaned_keys(catalog):
    fp_a, fp_b = fingerprint("model-a"), fingerprint("model-b")
    shared_key = make_package(1, model="model-a").key
    own_key = make_package(1, model="model-b").key
    catalog.add_reference("one", image_hash(1), {})
    catalog.add_reference("two", image_hash(1), {})
    catalog.link_package("one", fp_a.digest, shared_key)
    catalog.link_package("one", fp_b.digest, own_key)
    catalog.link_package("two", fp_a.digest, shared_key)
    assert catalog.get_reference("one").packages == {fp_a.digest: shared_key, fp_b.digest: own_key}
    removed, orphans = catalog.remove_reference("one")
    assert removed.ref_id == "one" and orphans == [own_key]
    removed, orphans = catalog.remove_reference("two")
    assert orphans == [shared_key]
    with pytest.raises(ReferenceNotFoundError):
        catalog.remove_reference("two")
    with pytest.raises(ReferenceNotFoundError):
        catalog.link_package("ghost", fp_a.digest, shared_key)


def test_image_bytes_are_kept_and_deleted_with_the_last_reference(catalog, tmp_path):
    data = b"\x89PNG original bytes"
    catalog.put_image(image_hash(1), data, "PNG")
    catalog.put_image(image_hash(1), b"a lossless re-save", "BMP")  # same pixels: first bytes kept
    assert catalog.get_image(image_hash(1)) == data and catalog.image_format(image_hash(1)) == "PNG"
    path = catalog.image_path(image_hash(1))
    assert path == tmp_path / "images" / image_hash(1)[:2] / image_hash(1)
    catalog.add_reference("a", image_hash(1), {}, namespace="ns1")
    catalog.add_reference("b", image_hash(1), {}, namespace="ns2")
    catalog.remove_reference("a", namespace="ns1")
    assert path.exists(), "still used by a reference in another namespace"
    catalog.remove_reference("b", namespace="ns2")
    assert not path.exists() and not catalog.has_image(image_hash(1))
    with pytest.raises(NotFoundError):
        catalog.get_image(image_hash(1))
    with pytest.raises(InvalidInputError):
        catalog.put_image(image_hash(2), b"", "PNG")


def test_damaged_image_bytes_are_reported(catalog):
    catalog.put_image(image_hash(3), b"some image bytes", "JPEG")
    path = catalog.image_path(image_hash(3))
    path.write_bytes(b"some image bytez")
    with pytest.raises(StoreError, match="checksum"):
        catalog.get_image(image_hash(3))


def test_counters_persist_across_reopen_and_processes(opener, tmp_path):
    root = tmp_path / "s"
    with opener(root) as store:
        assert store.catalog.counters() == {name: 0 for name in COUNTER_NAMES}
        store.catalog.bump(hits=2, encode_ms_saved=10.5)
        store.catalog.bump(misses=1)
    code = (
        "import sys; from refsight.store import open_store; "
        "s = open_store(sys.argv[1], catalog=sys.argv[2] or None, local_dir=sys.argv[3] or None); "
        "s.catalog.bump(hits=3); s.close()"
    )
    assert subprocess.run([sys.executable, "-c", code, *opener.args(root)]).returncode == 0
    with opener(root) as store:
        counters = store.catalog.counters()
        assert counters["hits"] == 5 and counters["misses"] == 1 and counters["encode_ms_saved"] == 10.5
        with pytest.raises(InvalidInputError):
            store.catalog.bump(**{"DROP TABLE": 1})
        with pytest.raises(InvalidInputError):
            store.catalog.bump(hits=float("inf"))


def test_change_journal_tracks_adds_metadata_changes_and_removals(catalog):
    assert catalog.revision() == 0
    assert catalog.changes_since(None) == (0, [], [])
    catalog.add_reference("a", image_hash(1), {"k": 1})
    catalog.add_reference("b", image_hash(2), {})
    r2 = catalog.revision()
    assert r2 == 2
    catalog.add_reference("a", image_hash(1), {"k": 1})  # same metadata: not a change
    assert catalog.revision() == r2
    catalog.add_reference("a", image_hash(1), {"k": 2})
    catalog.remove_reference("b")
    changes = catalog.changes_since(r2)
    assert changes.revision == 4
    assert [(row.ref_id, row.metadata) for row in changes.changed] == [("a", {"k": 2})]
    assert changes.removed == ["b"]
    # re-adding a removed id turns its tombstone back into a change
    catalog.add_reference("b", image_hash(3), {})
    later = catalog.changes_since(4)
    assert later.removed == [] and [(r.ref_id, r.image_sha256) for r in later.changed] == [("b", image_hash(3))]
    assert catalog.changes_since(catalog.revision()) == (5, [], [])
    # None lists the whole namespace, as changes
    assert sorted(r.ref_id for r in catalog.changes_since(None).changed) == ["a", "b"]


def test_change_journal_is_per_namespace(catalog):
    catalog.add_reference("x", image_hash(1), {}, namespace="tenant-a")
    assert catalog.revision(namespace="tenant-a") == 1
    assert catalog.revision() == 0 and catalog.changes_since(0) == (0, [], [])


def test_a_version_1_store_is_migrated_in_place(opener, tmp_path):
    root = tmp_path / "old"
    with opener(root) as store:
        store.catalog.add_reference("kept", image_hash(1), {"k": "v"})
    # make it look like a store written before the change journal existed
    opener.sql(root, [
        "ALTER TABLE packages DROP COLUMN raw_bytes",  # added by version 6
        "DROP TABLE remembered_packages",  # added by version 5
        "DROP TABLE reference_changes",
        "DROP INDEX packages_by_use",  # added by version 4
        "ALTER TABLE packages DROP COLUMN last_used",
        "ALTER TABLE packages DROP COLUMN scope",  # added by version 3
        "UPDATE meta SET value = '1' WHERE name = 'schema_version'",
    ])
    with opener(root) as store:
        assert store.catalog.get_reference("kept").metadata == {"k": "v"}
        assert store.catalog.revision() == 0
        store.catalog.add_reference("new", image_hash(2), {})
        assert [r.ref_id for r in store.catalog.changes_since(0).changed] == ["new"]
    assert opener.sql(root, ["SELECT value FROM meta WHERE name = 'schema_version'"])[0][0][0] == "6"


def test_a_newer_store_is_refused(opener, tmp_path):
    root = tmp_path / "newer"
    with opener(root) as store:
        store.catalog.add_reference("kept", image_hash(1), {})
    opener.sql(root, ["UPDATE meta SET value = '99' WHERE name = 'schema_version'"])
    with pytest.raises(StoreError, match="newer than this refsight"):
        opener(root)


def _downgraded(opener, root, version: int, statements: list[str]):
    """A store holding one package, made to look as a refsight of schema ``version`` wrote it."""
    package = make_package(1)
    with opener(root) as store:
        store.packages.put(package)
        written_before_the_codec(store, package.key)
    statements = ["ALTER TABLE packages DROP COLUMN raw_bytes", *statements]  # added by version 6
    opener.sql(root, [*statements, f"UPDATE meta SET value = '{version}' WHERE name = 'schema_version'"])
    return package


def test_a_version_2_store_keeps_its_packages_as_shared(opener, tmp_path):
    # a store written before isolation scopes existed: no scope column (nor version 4's last use)
    drops = ["DROP TABLE remembered_packages", "DROP INDEX packages_by_use", "ALTER TABLE packages DROP COLUMN last_used",
             "ALTER TABLE packages DROP COLUMN scope"]
    package = _downgraded(opener, tmp_path / "v2", 2, drops)
    with opener(tmp_path / "v2") as store:
        loaded = store.local.get(package.key)
        assert loaded is not None and loaded.scope is None and loaded.key == package.key
        assert store.local.record(package.key).scope is None


def test_a_version_3_store_gets_last_used_from_creation_time(opener, tmp_path):
    # a store written before the byte quota existed: no last_used column
    package = _downgraded(opener, tmp_path / "v3", 3, ["DROP TABLE remembered_packages", "DROP INDEX packages_by_use",
                                                       "ALTER TABLE packages DROP COLUMN last_used"])
    with opener(tmp_path / "v3") as store:
        [usage] = store.local.least_recently_used(10)
        assert usage.key == package.key and usage.last_used == package.created_at
        assert store.local.get(package.key) is not None


@pytest.mark.parametrize("version", ["abc", "", "4.0"])
def test_an_unreadable_schema_version_is_not_a_refsight_store(opener, tmp_path, version):
    root = tmp_path / "damaged"
    with opener(root) as store:
        store.catalog.add_reference("kept", image_hash(1), {})
    opener.sql(root, [("UPDATE meta SET value = ? WHERE name = 'schema_version'", (version,))])
    with pytest.raises(StoreError, match="not a refsight store: unreadable schema version") as info:
        opener(root)
    assert repr(version) in str(info.value)


def test_a_row_holding_text_that_is_not_unicode_never_takes_down_a_read(opener, tmp_path):
    """Issue 25 item 2, read side: lone surrogates stored as JSON escapes come back printable, and the row deletable."""
    import json

    root = tmp_path / "poisoned"
    with opener(root) as store:
        store.catalog.add_reference("poisoned", image_hash(1), {"k": "v"})
        store.catalog.add_reference("fine", image_hash(2), {"k": "v"})
        # What an intake without the text check stored: canonical JSON escapes the lone surrogates.
        opener.sql(root, [("UPDATE \"references\" SET metadata = ? WHERE ref_id = 'poisoned'", ('{"\\ud800":"a\\udfffb"}',))])
        for reference in (store.catalog.get_reference("poisoned"), store.catalog.list_references()[0]):
            assert reference.metadata == {"\ufffd": "a\ufffdb"}
            json.dumps(reference.to_dict(), ensure_ascii=False).encode("utf-8")  # a response can be written
        [row] = [r for r in store.catalog.changes_since(None).changed if r.ref_id == "poisoned"]
        assert row.metadata == {"\ufffd": "a\ufffdb"}
        removed, _ = store.catalog.remove_reference("poisoned")
        assert removed.ref_id == "poisoned" and [r.ref_id for r in store.catalog.list_references()] == ["fine"]
