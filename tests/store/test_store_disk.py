"""DiskPackageStore: exact round trips, checks on read, verify, gc, and the on-disk format.

Each test runs with the index in SQLite (embedded) and in PostgreSQL (shared blob directory).
"""

from __future__ import annotations

import json

import pytest
import safetensors.torch
import torch
from store_helpers import image_hash, make_package, run_threads

from refsight.errors import CorruptPackageError, InvalidInputError
from refsight.package import VisualPackage
from refsight.store import DiskPackageStore
from refsight.vllm_connector import refsight_codec


@pytest.fixture
def open_local(opener):
    """``open_local(root)``: the package store of a store at ``root`` (either kind); ``.sql`` runs raw SQL."""
    stores = []

    def open_one(root):
        store = opener(root)
        stores.append(store)
        assert isinstance(store.local, DiskPackageStore)
        return store.local

    open_one.sql = opener.sql
    yield open_one
    for store in stores:
        store.close()


def assert_same_package(a: VisualPackage, b: VisualPackage) -> None:
    assert set(a.tensors) == set(b.tensors)
    for name in a.tensors:
        x, y = a.tensors[name], b.tensors[name]
        assert x.dtype == y.dtype and x.shape == y.shape, name
        # Bit-exact: compare the raw bytes, not values (bf16 must not pass through float32).
        assert torch.equal(x.reshape(-1).view(torch.uint8), y.reshape(-1).view(torch.uint8)), name
    assert a.metadata == b.metadata
    assert a.fingerprint == b.fingerprint
    assert a.image_sha256 == b.image_sha256
    assert a.created_at == b.created_at and a.encode_ms == b.encode_ms
    assert a.key == b.key


def test_round_trip_is_bit_exact_for_bf16_int64_bool_and_metadata(open_local, tmp_path):
    store = open_local(tmp_path)
    package = make_package(1)
    package.tensors["scalar"] = torch.tensor(3.25, dtype=torch.float64)
    package.tensors["empty"] = torch.empty(0, 7, dtype=torch.float16)
    # bf16 values that float16 or a lossy path would change
    package.tensors["features"][0, :4] = torch.tensor([1e-30, 3e38, -0.0, 1.00390625], dtype=torch.bfloat16)
    size = store.put(package)
    assert size == store.path_for(package.key).stat().st_size
    loaded = store.get(package.key)
    assert_same_package(package, loaded)
    store.close()
    # and again from a fresh process-level handle
    reopened = open_local(tmp_path)
    assert_same_package(package, reopened.get(package.key))
    reopened.close()


def test_files_are_compressed_safetensors_with_the_header_as_metadata(open_local, tmp_path):
    store = open_local(tmp_path)
    package = make_package(2)
    store.put(package)
    path = store.path_for(package.key)
    assert path.parent.parent.name == package.key[:2] and path.parent.name == package.key[2:4]
    stored = path.read_bytes()
    assert stored.startswith(refsight_codec.MAGIC)  # bf16 features and a JSON header: the codec saves enough to keep
    record = store.record(package.key)
    assert record.bytes == len(stored) < record.raw_bytes
    # Decompressed, the file is plain safetensors: what refsight wrote before its codec.
    path = tmp_path / "raw.safetensors"
    path.write_bytes(refsight_codec.decompress(memoryview(stored)))
    assert path.stat().st_size == record.raw_bytes
    loaded = safetensors.torch.load_file(path)
    for name, tensor in package.tensors.items():
        assert torch.equal(loaded[name], tensor)
    with safetensors.safe_open(path, "pt") as f:
        header = json.loads(f.metadata()["refsight.header"])
    assert header["image_sha256"] == package.image_sha256
    assert header["spec"] == package.spec


def test_put_is_idempotent_and_keeps_the_first_file(open_local, tmp_path):
    store = open_local(tmp_path)
    package = make_package(3)
    store.put(package)
    first = store.record(package.key)
    again = make_package(3)
    again.created_at += 100  # same key, different bytes: must not replace the stored file
    assert store.put(again) == first.bytes
    assert store.record(package.key) == first
    assert store.get(package.key).created_at == package.created_at
    assert list(store.keys()) == [package.key]


def test_missing_key_is_none_and_delete_removes_row_and_file(open_local, tmp_path):
    store = open_local(tmp_path)
    package = make_package(4)
    assert store.get(package.key) is None and not store.contains(package.key)
    store.put(package)
    assert store.contains(package.key)
    assert store.delete(package.key)
    assert not store.path_for(package.key).exists()
    assert store.get(package.key) is None
    assert not store.delete(package.key)


@pytest.mark.parametrize("offset", [3, -1, "header"])
def test_a_flipped_byte_is_caught_by_get_and_verify_all(open_local, tmp_path, offset):
    store = open_local(tmp_path)
    good, bad = make_package(5), make_package(6)
    store.put(good)
    store.put(bad)
    path = store.path_for(bad.key)
    data = bytearray(path.read_bytes())
    index = 20 if offset == "header" else offset
    data[index] ^= 0x01
    path.write_bytes(data)
    for read in (store.get, store.check):
        with pytest.raises(CorruptPackageError) as info:
            read(bad.key)
        assert info.value.key == bad.key and "checksum" in info.value.reason
    results = dict(store.verify_all())
    assert results[good.key] is None
    assert "checksum" in results[bad.key]
    assert store.get(good.key) is not None


def test_missing_and_truncated_files_are_corrupt_not_absent(open_local, tmp_path):
    store = open_local(tmp_path)
    gone, short = make_package(7), make_package(8)
    store.put(gone)
    store.put(short)
    store.path_for(gone.key).unlink()
    path = store.path_for(short.key)
    path.write_bytes(path.read_bytes()[:-10])
    for read in (store.get, store.check):
        with pytest.raises(CorruptPackageError, match="missing"):
            read(gone.key)
        with pytest.raises(CorruptPackageError, match="bytes"):
            read(short.key)
    assert {k: p is not None for k, p in store.verify_all()} == {gone.key: True, short.key: True}


def _row_with_another_spec(store, sql, root) -> tuple[str, str]:
    package = make_package(9)
    store.put(package)
    spec = package.spec
    spec["features"]["shape"] = [1, 1]
    sql(root, [("UPDATE packages SET spec_json = ? WHERE key = ?", (json.dumps(spec), package.key))])
    return package.key, "shapes"


def _file_of_another_package(store, sql, root) -> tuple[str, str]:
    a, b = make_package(10), make_package(11)
    store.put(a)
    store.put(b)
    # Swap file and checksum of b into a's place: checksum passes, identity does not.
    store.path_for(a.key).write_bytes(store.path_for(b.key).read_bytes())
    row_b = store.record(b.key)
    sql(root, [("UPDATE packages SET checksum = ?, bytes = ? WHERE key = ?", (row_b.checksum, row_b.bytes, a.key))])
    return a.key, "another package"


@pytest.mark.parametrize("damage", [_row_with_another_spec, _file_of_another_package])
def test_an_index_row_that_disagrees_with_its_file_is_corrupt(open_local, tmp_path, damage):
    store = open_local(tmp_path)
    key, reason = damage(store, open_local.sql, tmp_path)
    for read in (store.get, store.check):
        with pytest.raises(CorruptPackageError, match=reason):
            read(key)


def test_check_reads_what_get_checks_without_building_tensors(open_local, tmp_path):
    """A cached add's read: the record and the tensors' size, every check of get() passed."""
    store = open_local(tmp_path)
    package = make_package(12)
    assert store.check(package.key) is None
    store.put(package)
    found = store.check(package.key)
    assert found.key == package.key and found.record == store.record(package.key)
    assert found.nbytes == package.nbytes == store.get(package.key).nbytes


def test_gc_removes_orphan_files_and_stale_temps_but_keeps_indexed_ones(open_local, tmp_path):
    store = open_local(tmp_path)
    kept, orphan = make_package(12), make_package(13)
    store.put(kept)
    store.put(orphan)
    # Make an orphan: a file without its row (what a kill between rename and insert leaves).
    open_local.sql(tmp_path, [("DELETE FROM packages WHERE key = ?", (orphan.key,))])
    temp = store.path_for(kept.key).parent / ".tmp-abandoned.partial"
    temp.write_bytes(b"half a package")
    assert list(store.keys()) == [kept.key] and store.get(orphan.key) is None
    assert store.gc() == {"orphans": 1, "temps": 0}  # a young temp may belong to a live writer
    assert store.gc(temp_age_s=0) == {"orphans": 0, "temps": 1}
    assert not store.path_for(orphan.key).exists() and not temp.exists()
    assert store.get(kept.key) is not None


def test_bad_keys_and_unstorable_packages_are_refused(open_local, tmp_path):
    store = open_local(tmp_path)
    for key in ["../../etc/passwd", "ABC", "a" * 63, 5]:
        with pytest.raises(InvalidInputError):
            store.get(key)
    package = make_package(14)
    package.tensors["bad"] = [1, 2, 3]
    with pytest.raises(InvalidInputError, match="not a torch.Tensor"):
        store.put(package)
    package = make_package(15)
    package.metadata["nan"] = float("nan")
    with pytest.raises(InvalidInputError, match="cannot be stored"):
        store.put(package)
    assert list(store.keys()) == []
    assert not any(p.is_file() for p in (tmp_path / "packages").rglob("*")), "a refused put left a file behind"


def test_stats_and_records(open_local, tmp_path):
    store = open_local(tmp_path)
    packages = [make_package(n) for n in range(3)]
    sizes = [store.put(p) for p in packages]
    raw = sum(store.record(p.key).raw_bytes for p in packages)
    assert store.stats() == {"packages": 3, "bytes": sum(sizes), "raw_bytes": raw} and raw > sum(sizes)
    record = store.record(packages[0].key)
    assert record.image_sha256 == image_hash(0)
    assert record.fingerprint == packages[0].fingerprint
    assert record.spec == packages[0].spec
    assert len(record.checksum) == 32


def test_threads_share_one_store(open_local, tmp_path):
    store = open_local(tmp_path)
    packages = [make_package(n) for n in range(8)]

    def work(offset):
        for i in range(16):
            p = packages[(i + offset) % len(packages)]
            store.put(p)
            loaded = store.get(p.key)
            assert loaded is not None and loaded.key == p.key

    assert run_threads(work) == []
    assert sorted(store.keys()) == sorted(p.key for p in packages)
    assert all(problem is None for _, problem in store.verify_all())
    store.close()


def test_repair_is_delete_then_put(open_local, tmp_path):
    store = open_local(tmp_path)
    package = make_package(20)
    store.put(package)
    store.path_for(package.key).write_bytes(b"garbage")
    assert store.put(package) == store.record(package.key).bytes  # idempotent: does not repair
    assert store.verify(package.key) is not None
    store.delete(package.key)
    store.put(package)
    assert store.verify(package.key) is None
    assert_same_package(package, store.get(package.key))
