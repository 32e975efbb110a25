"""The store side of the vLLM encoder-cache connector, on its own (no vLLM needed): files, checks, quota, counters.

``refsight_ec_store`` runs inside vLLM's environment, where refsight is not installed; these
tests exercise the very module through refsight's import path, on a real SQLite index and
real files.
"""

from __future__ import annotations

import hashlib
import sys

import pytest

from refsight.vllm_connector import refsight_ec_store as ec

FINGERPRINT = "f" * 64


def _uuid(n: int) -> str:
    return "refsight-" + hashlib.sha256(str(n).encode()).hexdigest()


def _blob(uuid: str, rows: int = 4, fingerprint: str = FINGERPRINT) -> bytes:
    data = bytes(range(256)) * (rows * 16 * 4 // 256)
    return ec.serialize(data, "F32", [rows, 16], uuid=uuid, fingerprint=fingerprint)


@pytest.fixture
def store(tmp_path):
    return ec.ECStore(tmp_path / ec.DIRNAME, FINGERPRINT)


def test_only_refsight_reference_uuids_are_eligible():
    assert ec.eligible(_uuid(1))
    for other in ("renderer0-mm-3-image-0", "a" * 64, "refsight-" + "A" * 64, "refsight-probe-1234", _uuid(1) + "0", ""):
        assert not ec.eligible(other), other


def test_a_saved_file_is_a_hit_and_loads_as_safetensors(store, tmp_path):
    import torch
    from safetensors.torch import load

    uuid = _uuid(1)
    assert store.load(uuid) is None  # a miss, counted
    assert store.save(uuid, _blob(uuid))
    assert not store.save(uuid, _blob(uuid))  # a whole file is there: kept, not rewritten
    blob = store.load(uuid)
    assert load(blob)["ec_cache"].shape == torch.Size([4, 16])
    assert not [p for p in store.root.rglob(".tmp-*")]
    store.flush()  # a hit's count waits in memory (reads do not write); the connector flushes per request
    assert ec.read_counters(tmp_path) == {"hits": 1, "misses": 1, "saves": 1, "corrupt": 0, "evictions": 0, "refused": 0, "bytes": len(blob)}


def test_ineligible_uuids_are_never_saved_nor_looked_up(store, tmp_path):
    counter_id = "renderer0-mm-3-image-0"  # what vLLM names an item without a uuid
    assert not store.save(counter_id, _blob(counter_id))
    assert store.load(counter_id) is None
    assert not list(store.root.rglob("*.safetensors"))
    store.flush()
    assert ec.read_counters(tmp_path)["misses"] == 0  # not even looked for


def test_a_file_is_kept_compressed_by_refsights_codec_and_read_back_bit_for_bit(store):
    """The same codec as refsight's packages (bf16 features shrink: their exponent planes repeat); a plain file, as
    written before the codec, reads as it did; a damaged container is a miss."""
    import torch

    from refsight.vllm_connector import refsight_codec

    uuid, old = _uuid(10), _uuid(11)
    features = torch.randn(256, 64, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    blob = ec.serialize(features.view(torch.uint8).numpy().tobytes(), "BF16", [256, 64], uuid=uuid, fingerprint=FINGERPRINT)
    assert store.save(uuid, blob)
    stored = store.path(uuid).read_bytes()
    assert stored.startswith(refsight_codec.MAGIC) and len(stored) < 0.8 * len(blob)
    assert store.load(uuid) == blob and ec.read_counters(store.root.parent)["bytes"] == len(stored)
    plain = ec.serialize(features.view(torch.uint8).numpy().tobytes(), "BF16", [256, 64], uuid=old, fingerprint=FINGERPRINT)
    store.path(old).parent.mkdir(parents=True, exist_ok=True)
    store.path(old).write_bytes(plain)
    assert store.load(old) == plain
    store.path(uuid).write_bytes(stored[:100] + bytes([stored[100] ^ 1]) + stored[101:])
    assert store.load(uuid) is None and store.path(uuid).with_name(store.path(uuid).name + ".bad").exists()


@pytest.mark.parametrize("damage", ["flip a data byte", "truncate", "empty", "garbage header", "other uuid", "other fingerprint"])
def test_a_damaged_or_foreign_file_is_a_miss_moved_aside_and_counted(store, tmp_path, damage):
    uuid = _uuid(2)
    store.save(uuid, _blob(uuid))
    path = store.path(uuid)
    raw = path.read_bytes()
    if damage == "flip a data byte":
        raw = raw[:-5] + bytes([raw[-5] ^ 0xFF]) + raw[-4:]
    elif damage == "truncate":
        raw = raw[: len(raw) - 7]
    elif damage == "empty":
        raw = b""
    elif damage == "garbage header":
        raw = (1 << 40).to_bytes(8, "little") + raw[8:]
    elif damage == "other uuid":
        raw = _blob(_uuid(3))
    else:
        raw = _blob(uuid, fingerprint="0" * 64)
    path.write_bytes(raw)
    assert store.load(uuid) is None
    assert not path.exists() and path.with_name(path.name + ".bad").exists()
    store.flush()
    counters = ec.read_counters(tmp_path)
    assert (counters["corrupt"], counters["hits"], counters["bytes"]) == (1, 0, 0)
    assert store.save(uuid, _blob(uuid)) and store.load(uuid) is not None  # re-encoded, saved again, served


def test_the_same_uuid_under_another_fingerprint_is_another_file(tmp_path):
    uuid = _uuid(4)
    one = ec.ECStore(tmp_path / ec.DIRNAME, FINGERPRINT)
    other = ec.ECStore(tmp_path / ec.DIRNAME, "0" * 64)
    one.save(uuid, _blob(uuid))
    assert other.path(uuid) != one.path(uuid) and other.load(uuid) is None


def test_the_quota_evicts_least_recently_used_files_never_the_one_just_written(tmp_path):
    size = len(_blob(_uuid(0)))
    store = ec.ECStore(tmp_path / ec.DIRNAME, FINGERPRINT, max_bytes=3 * size)
    for n in range(3):
        store.save(_uuid(n), _blob(_uuid(n)))
    assert store.load(_uuid(0)) is not None  # used again: now the most recent
    store.save(_uuid(3), _blob(_uuid(3)))
    assert store.total_bytes() <= 3 * size
    assert [store.load(_uuid(n)) is not None for n in range(4)] == [True, False, True, True]
    assert ec.read_counters(tmp_path)["evictions"] == 1
    tiny = ec.ECStore(tmp_path / "tiny", FINGERPRINT, max_bytes=1)
    assert tiny.save(_uuid(9), _blob(_uuid(9))) and tiny.load(_uuid(9)) is not None  # the newest always stays


def test_the_quota_counts_the_bytes_refsights_packages_hold(tmp_path):
    """One quota over the store: the packages' bytes refsight records leave less room for these files."""
    size = len(_blob(_uuid(0)))
    store = ec.ECStore(tmp_path / ec.DIRNAME, FINGERPRINT, max_bytes=3 * size)
    store.record_external_bytes("refsight-packages", 2 * size)
    store.save(_uuid(0), _blob(_uuid(0)))  # 1 file + 2 of packages: fits
    assert store.load(_uuid(0)) is not None
    store.save(_uuid(1), _blob(_uuid(1)))  # 2 files + 2 of packages: the older file goes
    assert [store.load(_uuid(n)) is not None for n in range(2)] == [False, True]
    store.record_external_bytes("refsight-packages", 0)  # the record is replaced, not added to
    store.save(_uuid(2), _blob(_uuid(2)))
    assert [store.load(_uuid(n)) is not None for n in range(3)] == [False, True, True]


def test_housekeeping_lists_least_recently_used_first_and_evicts_by_name(store, tmp_path):
    for n in range(3):
        store.save(_uuid(n), _blob(_uuid(n)))
    store.load(_uuid(0))  # used again: now the most recent
    store.flush()  # a use is written at the next flush (another process reads the index)
    housekeeping = ec.ECStore(tmp_path / ec.DIRNAME, "")
    oldest = housekeeping.least_recently_used(10)
    assert [name for name, _, _ in oldest] == [store.name(_uuid(n)) for n in (1, 2, 0)]
    assert housekeeping.least_recently_used(10, after=oldest[0][2:] + oldest[0][:1]) == oldest[1:]
    assert housekeeping.evict(store.name(_uuid(1))) and not housekeeping.evict(store.name(_uuid(1)))
    assert store.load(_uuid(1)) is None and not store.path(_uuid(1)).exists()
    assert ec.read_counters(tmp_path)["evictions"] == 1


def test_a_hit_writes_nothing_until_a_flush_or_the_interval(store, tmp_path, monkeypatch):
    uuid = _uuid(8)
    store.save(uuid, _blob(uuid))
    store.load(uuid)
    assert ec.read_counters(tmp_path)["hits"] == 0  # buffered
    monkeypatch.setattr(ec, "FLUSH_INTERVAL_S", 0.0)
    store.load(uuid)  # the interval has passed: this count writes both
    assert ec.read_counters(tmp_path)["hits"] == 2


def test_no_counters_without_a_connector(tmp_path):
    assert ec.read_counters(tmp_path) is None


def test_the_connector_folder_imports_nothing_of_refsight():
    """What goes on vLLM's PYTHONPATH must import with vLLM's dependencies alone."""
    import ast

    from refsight.vllm_connector import CONNECTOR_PATH

    allowed = {"vllm", "torch", "safetensors", "refsight_ec_store", "refsight_objects", "refsight_breaker",
               "refsight_codec", "boto3", "botocore", "xxhash", "zstandard", "numpy", "__future__"}
    for path in CONNECTOR_PATH.glob("refsight_*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            for name in names:
                top = name.split(".")[0]
                assert top in allowed or top in sys.stdlib_module_names, (path.name, name)


def test_a_file_carries_the_digest_of_the_pixels_it_was_encoded_from(store):
    uuid = _uuid(5)
    data = bytes(64)
    store.save(uuid, ec.serialize(data, "F32", [4, 4], uuid=uuid, fingerprint=FINGERPRINT, pixels="ab" * 32))
    assert ec.pixels_digest_of(store.load(uuid)) == "ab" * 32
    assert ec.pixels_digest_of(_blob(_uuid(6))) == ""


def test_the_connector_counters_reach_stats_and_metrics(tmp_path):
    """What a connector counted in a store is ``vllm_encoder_cache`` in ``Engine.stats()`` (so in
    ``refsight stats``) and ``refsight_vllm_encoder_cache_*`` on the server's ``/metrics``."""
    from refsight import Engine
    from refsight.server.edge.metrics import Metrics

    store = ec.ECStore(tmp_path / "store" / ec.DIRNAME, FINGERPRINT)
    uuid = _uuid(7)
    store.save(uuid, _blob(uuid))
    store.load(uuid)
    store.flush()
    with Engine(tmp_path / "store", model="tiny-qwen2-vl-vllm") as engine:
        stats = engine.stats().to_dict()
        assert stats["vllm_encoder_cache"] == {
            "hits": 1, "misses": 0, "saves": 1, "corrupt": 0, "evictions": 0, "refused": 0, "bytes": len(_blob(uuid)),
        }
        assert "vllm_encoder_cache" not in engine.stats(tenant_view=True, namespace="default").to_dict()
        text = Metrics(lambda: engine.stats().to_dict()).render().decode()
    assert "refsight_vllm_encoder_cache_hits_total 1.0" in text
    assert f"refsight_vllm_encoder_cache_bytes {float(len(_blob(uuid)))}" in text
