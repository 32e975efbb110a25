"""The bucket store on a real S3 server (SeaweedFS, tests/services.py) and a real PostgreSQL catalog.

Two stores opened on one bucket and one catalog with NO directory in common stand for two replicas:
what one writes, the other reads from the bucket (then from its own disk cache), bit for bit. Every
object is checked as a file is: a flipped, truncated or foreign object is never served. Faults as the
Redis tier meets them: a stopped or hung object store costs one short timeout, then nothing, and the
tier comes back by itself; refused credentials or a missing bucket fail at open, naming the setting.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from runtimes import require_module
from store_helpers import make_package

from refsight.errors import CorruptPackageError, StoreConfigError, StoreUnavailableError
from refsight.store import open_store
from refsight.store.bucket import package_object

pytestmark = pytest.mark.slow  # starts real SeaweedFS and PostgreSQL servers

require_module("boto3", "pip install 'refsight[s3]'")
require_module("psycopg", "pip install 'refsight[postgres]'")

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def fleet(s3_server, postgres, tmp_path, monkeypatch):
    """``open(name, **options)``: a store on one fresh bucket and one catalog, in its own local directory."""
    for name, value in s3_server.env.items():
        monkeypatch.setenv(name, value)
    url = s3_server.bucket()
    opened = []

    def open_replica(name: str, **options):
        store = open_store(url, catalog=postgres, local_dir=tmp_path / name, **options)
        opened.append(store)
        return store

    open_replica.url = url
    open_replica.catalog = postgres
    yield open_replica
    for store in opened:
        store.close()


def _same(a, b) -> bool:
    return a.key == b.key and a.spec == b.spec and all(a.tensors[n].equal(b.tensors[n]) for n in a.tensors)


def test_what_one_replica_writes_another_reads_from_the_bucket_then_from_its_own_disk(fleet):
    a, b = fleet("a"), fleet("b", memory_bytes=0)
    package = make_package(1, tokens=4096, dims=1536)  # 12.6 MB: up in parts, down in parallel ranges
    a.packages.put(package)
    a.catalog.put_image("a" * 64, b"original bytes", "PNG")
    assert [t.name for t in b.packages.tiers] == ["memory", "local", "bucket"]
    assert _same(b.packages.get(package.key), package)  # from the bucket, then kept on b's disk
    assert _same(b.packages.get(package.key), package)  # from b's disk
    tiers = b.packages.tier_stats()
    assert (tiers["bucket"]["hits"], tiers["local"]["hits"]) == (1, 1) and tiers["bucket"]["reads"] == 1
    assert b.catalog.get_image("a" * 64) == b"original bytes"
    names = [e.name for e in a.bucket.listing("")]
    assert len(names) == 2 and names[1].startswith(f"packages/{package.key[:2]}/")
    assert not (Path(a.derived_root) / "packages").exists()  # nothing of the kind on a's disk: it is all in the bucket
    assert list(b.local.verify_all()) == [(package.key, None)]


@pytest.mark.parametrize("damage", ["flip", "truncate", "foreign"])
def test_a_damaged_or_foreign_object_is_never_served_and_a_damaged_cache_file_is_a_miss(fleet, damage):
    a, b = fleet("a"), fleet("b", memory_bytes=0)
    package, other = make_package(1, tokens=64), make_package(2, tokens=64)
    a.packages.put(package)
    a.packages.put(other)
    name = package_object(package.key, a.local.record(package.key).checksum)
    data = bytearray(a.bucket.get(name))
    if damage == "flip":
        data[-3] ^= 0x01
    elif damage == "truncate":
        data = data[: len(data) // 2]
    else:  # the bytes of another package under this one's name
        data = a.bucket.get(package_object(other.key, a.local.record(other.key).checksum))
    a.bucket.put(name, [data])
    with pytest.raises(CorruptPackageError):
        b.local.get(package.key)
    assert [problem is not None for _, problem in b.local.verify_all()] == sorted(
        [True, False], key=lambda bad: (package.key if bad else other.key))
    # A damaged file of the local disk cache is a miss, deleted: the next read goes to the bucket.
    b.packages.get(other.key)
    path = b.cache.path_for(other.key)
    path.write_bytes(path.read_bytes()[:-5])
    assert b.cache.get(other.key) is None and not path.exists() and b.cache.tier_info()["corrupt"] == 1
    assert _same(b.packages.get(other.key), other)


def test_two_replicas_writing_one_key_store_it_once_and_stay_readable(fleet):
    stores = [fleet(name) for name in ("a", "b", "c", "d")]
    copies = [make_package(7, tokens=256) for _ in stores]  # one key, bytes differing in created_at
    barrier = threading.Barrier(len(stores))

    def write(i: int) -> None:
        barrier.wait()
        stores[i].local.put(copies[i])

    threads = [threading.Thread(target=write, args=(i,)) for i in range(len(stores))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [e.name for e in stores[0].bucket.listing("packages/")] == [
        package_object(copies[0].key, stores[0].local.record(copies[0].key).checksum)]
    assert all(_same(store.local.get(copies[0].key), copies[0]) for store in stores)


def test_a_killed_upload_leaves_nothing_a_reader_takes_for_whole_and_gc_clears_it(fleet):
    a = fleet("a")
    package = make_package(3, tokens=4096, dims=1536)
    client = a.bucket._client
    # A replica killed mid-multipart-upload: parts sent, never completed.
    key = a.bucket.key(package_object(package.key, "0" * 32))
    upload = client.create_multipart_upload(Bucket=a.bucket.bucket, Key=key)["UploadId"]
    client.upload_part(Bucket=a.bucket.bucket, Key=key, UploadId=upload, PartNumber=1, Body=b"x" * (5 << 20))
    # ... and one killed after its upload, before its row: an object nobody indexes.
    a.bucket.put(package_object(package.key, "1" * 32), [b"never recorded"])
    assert [e.name for e in a.bucket.listing("packages/")] == [package_object(package.key, "1" * 32)]
    assert a.local.get(package.key) is None  # no row: nothing to serve
    a.bucket.list_page = 1  # the listing walked a page at a time
    counts = a.gc(grace_s=0)
    assert (counts["temp_files"], counts["orphan_package_files"]) == (1, 1)
    assert list(a.bucket.listing("")) == [] and client.list_multipart_uploads(Bucket=a.bucket.bucket).get("Uploads") in (None, [])


def test_quota_and_prune_remove_objects_from_the_bucket(fleet):
    a = fleet("a", max_package_bytes=10**9)
    packages = [make_package(n, tokens=64) for n in range(6)]
    for package in packages:
        a.packages.put(package)
    a.max_package_bytes = a.local.total_bytes() // 2
    report = a.enforce_quota()
    assert len(report.evicted) == 3 and len(list(a.bucket.listing("packages/"))) == 3
    digest = packages[0].fingerprint.digest
    pruned = a.prune([digest])
    assert pruned.packages == 3 and list(a.bucket.listing("packages/")) == []


def test_an_outage_costs_one_short_timeout_then_nothing_and_the_bucket_comes_back(fleet, s3_server):
    a, b = fleet("a"), fleet("b", memory_bytes=0)
    cached, remote = make_package(1, tokens=64), make_package(2, tokens=64)
    a.packages.put(cached)
    a.packages.put(remote)
    b.packages.get(cached.key)  # on b's disk from now on
    s3_server.stop()
    try:
        started = time.monotonic()
        assert _same(b.packages.get(cached.key), cached)  # never reaches the bucket
        with pytest.raises(StoreUnavailableError):
            b.packages.get(remote.key)  # the one failed call: a refused connection
        with pytest.raises(StoreUnavailableError):
            b.packages.get(remote.key)  # backing off: no call at all
        assert time.monotonic() - started < 3
        info = b.packages.tier_stats()["bucket"]
        assert info["available"] is False and info["skipped"] >= 1 and info["outages"] == 1
    finally:
        s3_server.start()
    deadline = time.monotonic() + 30
    while True:  # a probe rides on a request once the back-off has passed
        try:
            assert _same(b.packages.get(remote.key), remote)
            break
        except StoreUnavailableError:
            assert time.monotonic() < deadline, "the bucket did not come back"
            time.sleep(0.3)
    assert b.packages.tier_stats()["bucket"]["available"] is True


def test_a_hung_object_store_costs_each_request_at_most_one_timeout(fleet, s3_server):
    a = fleet("a", memory_bytes=0)
    package = make_package(1, tokens=64)
    a.packages.put(package)
    a.cache.delete(package.key)
    os.kill(s3_server._proc.pid, signal.SIGSTOP)
    try:
        times = []
        for _ in range(5):
            started = time.monotonic()
            with pytest.raises(StoreUnavailableError) as caught:
                a.packages.get(package.key)
            times.append(time.monotonic() - started)
    finally:
        os.kill(s3_server._proc.pid, signal.SIGCONT)
    info = a.packages.tier_stats()["bucket"]
    # Each read either waited for the store (one 2 s timeout, never two) or was skipped at once while backing off
    # (2 s at first: the reads right after the failure are skipped, however loaded the machine).
    assert max(times) < 2 * 2.0 and info["errors"] + info["skipped"] == 5 and info["skipped"] >= 1, (times, info)
    assert sum(t >= 2.0 for t in times) <= info["errors"] and 0 < caught.value.retry_after <= 30


def test_bad_credentials_or_a_missing_bucket_fail_at_open_naming_the_setting(fleet, monkeypatch, tmp_path):
    with pytest.raises(StoreConfigError, match="does not exist"):
        open_store("s3://no-such-bucket/x", catalog=fleet.catalog, local_dir=tmp_path / "x")
    with pytest.raises(StoreConfigError, match="--catalog"):
        open_store(fleet.url, local_dir=tmp_path / "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
    with pytest.raises(StoreConfigError, match="AWS_SECRET_ACCESS_KEY"):
        open_store(fleet.url, catalog=fleet.catalog, local_dir=tmp_path / "x")
    # The command line: one line naming the setting, exit code 2.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "refsight.cli", "stats", "--store", fleet.url, "--catalog",
                           fleet.catalog, "--local-dir", str(tmp_path / "y")], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "AWS_SECRET_ACCESS_KEY" in done.stderr


def test_the_local_disk_cache_keeps_to_its_byte_limit_least_recently_used_out(fleet):
    packages = [make_package(n, tokens=64) for n in range(4)]
    a = fleet("a")
    for package in packages:
        a.packages.put(package)
    # Each package's size in the cache, as stored (compressed: the four differ), read off a cache of its own.
    probe, sizes, held = fleet("probe", memory_bytes=0), {}, 0
    for package in packages:
        probe.packages.get(package.key)
        sizes[package.key], held = probe.cache.tier_info()["bytes_held"] - held, probe.cache.tier_info()["bytes_held"]
    limit = sizes[packages[2].key] + sizes[packages[0].key] + 10
    b = fleet("b", memory_bytes=0, local_cache_bytes=limit)
    for package in packages:
        b.packages.get(package.key)
    b.packages.get(packages[2].key)  # recently used: stays
    b.packages.get(packages[0].key)  # from the bucket again: evicts packages[3]
    assert sorted(b.cache.keys()) == sorted([packages[2].key, packages[0].key])
    assert b.cache.tier_info()["bytes_held"] <= limit


def test_prefix_states_and_vllm_encoder_outputs_are_shared_through_the_bucket(fleet):
    """The storage paths only (the vLLM connector's ECStore, without a vLLM server; the hybrid model's
    states end to end: tests/server/test_replicas_bucket.py)."""
    import torch

    from refsight.vllm_connector.refsight_ec_store import DIRNAME, ECStore, serialize

    a, b = fleet("a"), fleet("b")
    key = "ab" * 32
    state = {"k.0": torch.arange(24, dtype=torch.float32).reshape(2, 3, 4), "conv.1": torch.ones(3, dtype=torch.bfloat16)}
    a.prefixes.put(key, state, meta={"layers": ["linear", "full"]}, tokens=7, build_ms=5.0)
    found = b.prefixes.get(key)
    assert found is not None and found.tokens == 7 and all(torch.equal(found.tensors[n], state[n]) for n in state)
    assert b.prefixes.path_for(key).is_file()  # kept on b's disk too
    # A damaged object is a miss, deleted.
    c = fleet("c")
    a.bucket.put(f"prefixes/ab/{key}.safetensors", [b"not a state"])
    assert c.prefixes.get(key) is None and not a.bucket.exists(f"prefixes/ab/{key}.safetensors")

    uuid = "refsight-" + "cd" * 32
    blob = serialize(bytes(range(16)), "F32", [2, 2], uuid=uuid, fingerprint="f" * 64)
    one = ECStore(a.derived_root / DIRNAME, "f" * 64, shared=a.bucket)
    other = ECStore(b.derived_root / DIRNAME, "f" * 64, shared=b.bucket)
    assert one.save(uuid, blob) and other.load(uuid) == blob and other.path(uuid).is_file()
    assert ECStore(b.derived_root / "x", "g" * 64, shared=b.bucket).load(uuid) is None  # another model's: a miss
