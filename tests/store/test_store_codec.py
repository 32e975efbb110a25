"""The store's codec: exact round trips, the raw form, entries written before it, and hostile or damaged input."""

from __future__ import annotations

import json

import pytest
import torch
import xxhash
import zstandard
from store_helpers import make_package, written_before_the_codec

from refsight.backends.prefix import prefix_key
from refsight.store import _packed, _safetensors, open_store
from refsight.store.prefixes import PrefixStore
from refsight.vllm_connector import refsight_codec


def _stored(tensors: dict, metadata: dict | None = None) -> bytes:
    stored = _safetensors.compress_file(_safetensors.prepare(tensors), metadata or {"k": "v"})
    data = b"".join(bytes(chunk) for chunk in stored.chunks)
    assert len(data) == stored.stored_bytes
    return data


def _tensors() -> dict:
    g = torch.Generator().manual_seed(0)
    smooth = torch.linspace(-3, 3, 4096).reshape(64, 64)  # features whose exponents repeat: they compress
    return {
        "f32": smooth + torch.randn(64, 64, generator=g) * 1e-3,
        "bf16": smooth.to(torch.bfloat16),
        "f16": smooth.to(torch.float16),
        "i64": torch.arange(300, dtype=torch.int64),
        "bool": torch.rand(999, generator=g) > 0.5,
        "empty": torch.empty(0, 3),
        "blob": torch.frombuffer(bytearray(torch.randn(8000, generator=g).to(torch.float16).view(torch.uint8).numpy()),
                                 dtype=torch.uint8),
    }


def test_every_dtype_round_trips_bit_for_bit_through_zstd_frames():
    tensors = _tensors()
    stored = _stored(tensors)
    assert stored.startswith(refsight_codec.MAGIC)
    table = refsight_codec.frames(memoryview(stored))
    assert {(method, plane) for method, plane, *_ in table} >= {("zstd", 4), ("zstd", 2)}  # byte planes, compressed
    raw = refsight_codec.decompress(memoryview(stored))
    assert bytes(raw) == b"".join(bytes(c) for c in _safetensors.encode(_safetensors.prepare(tensors), {"k": "v"}))
    decoded, meta = _safetensors.decode(raw)
    assert meta == {"k": "v"} and decoded.keys() == tensors.keys()
    for name, tensor in tensors.items():
        assert decoded[name].dtype == tensor.dtype and torch.equal(decoded[name], tensor)


def test_bytes_that_do_not_shrink_are_stored_as_the_plain_file():
    noise = torch.frombuffer(bytearray(torch.randint(0, 256, (1 << 16,), dtype=torch.uint8).numpy()), dtype=torch.uint8)
    stored = _stored({"noise": noise})
    assert not stored.startswith(refsight_codec.MAGIC) and refsight_codec.frames(memoryview(stored)) == []
    assert refsight_codec.raw_size(stored[:16], len(stored)) == len(stored)
    raw = memoryview(stored)
    assert refsight_codec.decompress(raw) is raw  # the plain file is its own raw form: read as before the codec


def _container(frames: list[list], body: bytes, raw_bytes: int, raw_xxh3: str = "0" * 32) -> bytes:
    # A container as an attacker (or a bug) could write it: every check of the layout passes, the checksum too.
    head = json.dumps({"raw_xxh3": raw_xxh3, "frames": frames}).encode()
    rest = len(head).to_bytes(4, "little") + head + body
    return refsight_codec.MAGIC + raw_bytes.to_bytes(8, "little") + xxhash.xxh3_128_digest(rest) + rest


def test_a_decompression_bomb_is_refused_before_anything_is_allocated():
    bomb = zstandard.ZstdCompressor().compress(bytes(1 << 24))  # 16 MiB of zeros in a few hundred bytes
    claims = {
        "its true size": [["zstd", 1, 1 << 24, len(bomb)]],  # more than MAX_RATIO raw bytes per stored byte
        "a small size": [["zstd", 1, 1000, len(bomb)]],  # the frame itself declares 16 MiB
    }
    for frames in claims.values():
        with pytest.raises(refsight_codec.CodecError):
            refsight_codec.decompress(memoryview(_container(frames, bomb, frames[0][2])))
    # A header claiming a terabyte that no frame accounts for.
    with pytest.raises(refsight_codec.CodecError, match="add up"):
        refsight_codec.decompress(memoryview(_container([["raw", 1, 4, 4]], b"abcd", 1 << 40)))
    # A frame without a declared size.
    quiet = zstandard.ZstdCompressor(write_content_size=False).compress(b"x" * 4000)
    with pytest.raises(refsight_codec.CodecError, match="declares"):
        refsight_codec.decompress(memoryview(_container([["zstd", 1, 4000, len(quiet)]], quiet, 4000)))


def test_a_well_formed_container_with_other_bytes_than_its_checksum_is_refused():
    packed = zstandard.ZstdCompressor().compress(b"y" * 4000)
    with pytest.raises(refsight_codec.CodecError, match="raw checksum"):
        refsight_codec.decompress(memoryview(_container([["zstd", 1, 4000, len(packed)]], packed, 4000)))
    for frames in ([["lzma", 1, 4, 4]], [["zstd", 3, 4000, len(packed)]], [["raw", 1, 5, 4]], [[1, 2]]):
        with pytest.raises(refsight_codec.CodecError):
            refsight_codec.decompress(memoryview(_container(frames, b"abcd" if frames[0][0] != "zstd" else packed, 4)))


def test_every_damaged_byte_and_every_truncation_is_caught():
    stored = _stored(_tensors())
    for at in range(0, len(stored), max(1, len(stored) // 97)):
        damaged = bytearray(stored)
        damaged[at] ^= 0x40
        if at < len(refsight_codec.MAGIC):
            continue  # no longer a container: the plain-file reader (safetensors' checks) judges it
        with pytest.raises(refsight_codec.CodecError):
            refsight_codec.decompress(memoryview(damaged))
    for cut in (len(refsight_codec.MAGIC) + 3, 40, len(stored) // 2, len(stored) - 1):
        with pytest.raises(refsight_codec.CodecError):
            refsight_codec.decompress(memoryview(stored[:cut]))
    with pytest.raises(refsight_codec.CodecError, match="recorded"):
        refsight_codec.decompress(memoryview(stored), expected=123)


def test_entries_written_before_the_codec_still_read_in_every_tier(tmp_path):
    """A package file and row, a prefix state file and a Redis value exactly as refsight wrote them before its codec."""
    package = make_package(5, tokens=64)
    with open_store(tmp_path / "store") as store:
        store.packages.put(package)
        old = written_before_the_codec(store, package.key)
        assert not old.startswith(refsight_codec.MAGIC) and _safetensors.describe(memoryview(old)).metadata
        store.memory.clear()
        loaded = store.packages.get(package.key)
        assert store.local.verify(package.key) is None and store.local.check(package.key).nbytes == package.nbytes
        stats = store.local.stats()
        assert stats["bytes"] == stats["raw_bytes"] == len(old)
    for name, tensor in package.tensors.items():
        assert torch.equal(loaded.tensors[name], tensor)
    # The Redis value layout: magic, xxh3-128 of the body, the plain file as the body.
    value = _packed.MAGIC + xxhash.xxh3_128_digest(old) + old
    assert torch.equal(_packed.unpack(package.key, value).tensors["features"], package.tensors["features"])
    assert _packed.raw_size(value) == len(old)
    # A prefix state file: the plain safetensors file (the new writer's raw form, byte for byte).
    states, key = PrefixStore(tmp_path / "derived"), prefix_key("m" * 64, ["a" * 64], [1, 2], "t")
    state = {"key.0": torch.linspace(0, 1, 4096).reshape(1, 2, 64, 32), "state": b"\x00\x01llama" * 999}
    states.put(key, state, meta={"layers": 1}, tokens=2, build_ms=3.0)
    path = states.path_for(key)
    path.write_bytes(bytes(refsight_codec.decompress(memoryview(path.read_bytes()))))
    states.clear_memory()
    got = states.get(key)
    assert got is not None and torch.equal(got.tensors["key.0"], state["key.0"])
    assert bytes(got.tensors["state"].numpy()) == state["state"]
    assert states.stats()["raw_bytes"] == states.stats()["bytes"] == path.stat().st_size


def test_a_package_whose_raw_size_disagrees_with_its_row_is_corrupt(tmp_path):
    package = make_package(6, tokens=64)
    with open_store(tmp_path / "store") as store:
        store.packages.put(package)
        path = store.local.path_for(package.key)
        stored = path.read_bytes()
        assert stored.startswith(refsight_codec.MAGIC)
        record = store.local.record(package.key)
        assert record.bytes == len(stored) < record.raw_bytes
        # A file whose raw size disagrees with its row: refused before decompression (the row bounds it).
        with store.local._db.write() as conn:
            conn.execute("UPDATE packages SET raw_bytes = ? WHERE key = ?", (record.raw_bytes * 1000, package.key))
        assert "recorded" in store.local.verify(package.key)
        with store.local._db.write() as conn:
            conn.execute("UPDATE packages SET raw_bytes = ? WHERE key = ?", (record.raw_bytes, package.key))
        assert store.local.verify(package.key) is None
        stats = store.local.stats()
        assert (stats["bytes"], stats["raw_bytes"]) == (record.bytes, record.raw_bytes)


def test_stats_show_the_bytes_before_and_after_compression(tmp_path):
    from refsight.cli.maintenance import format_stats, on_disk

    with open_store(tmp_path / "store") as store:
        for n in range(3):
            store.packages.put(make_package(n, tokens=64))
        local = store.local.stats()
        key = prefix_key("m" * 64, ["a" * 64], [1], "t")
        store.prefixes.put(key, {"key.0": torch.linspace(0, 1, 8192).reshape(1, 2, 64, 64)}, meta={}, tokens=1, build_ms=1.0)
        prefixes = store.prefixes.stats()
    assert local["raw_bytes"] > local["bytes"] > 0 and prefixes["raw_bytes"] > prefixes["bytes"] > 0
    from refsight import Engine

    with Engine(tmp_path / "store", model="toy") as engine:
        stats = engine.stats().to_dict()
    assert (stats["bytes"], stats["raw_bytes"]) == (local["bytes"], local["raw_bytes"])
    assert (stats["prefix_bytes"], stats["prefix_raw_bytes"]) == (prefixes["bytes"], prefixes["raw_bytes"])
    text = format_stats(stats)
    assert on_disk(local["bytes"], local["raw_bytes"]) in text and "before compression" in text
    assert on_disk(100, 100) == "100 B on disk" and on_disk(100, 250) == "100 B on disk, 250 B before compression (2.50x)"
