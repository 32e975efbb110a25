"""The engine on memory → Redis → disk → encode (a real Redis): a corrupt disk blob is never served
and is re-encoded from the kept image; a quota eviction reaches every tier."""

from __future__ import annotations

import pytest
from runtimes import require_module

from refsight import Engine

redis = require_module("redis", "pip install 'refsight[redis]'")


@pytest.fixture
def photo(tmp_path, real_photo):
    def save(name: str):
        path = tmp_path / f"{name}.png"
        real_photo(name).save(path)
        return path

    return save


def _corrupt(path) -> None:
    data = bytearray(path.read_bytes())
    data[-5] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("redis_copy", ["evicted", "corrupt"])
def test_a_corrupt_disk_blob_is_never_served_and_re_encoded_from_the_kept_image(tmp_path, photo, redis_server, redis_copy):
    store = tmp_path / "store"
    with Engine(store, model="toy", redis=redis_server.url, memory_bytes=0) as engine:
        added = engine.add(photo("chelsea"), attributes=[])
        expected = engine.reference_package(engine.reference(added.ref_id)).package.tensors["features"].clone()
    client = redis.Redis.from_url(redis_server.url)
    if redis_copy == "evicted":  # Redis dropped it (maxmemory): the disk copy is all there is
        client.flushall()
    else:  # the Redis value is damaged too
        name = client.keys("refsight:pkg:*")[0]
        client.set(name, client.get(name)[:-3] + b"xyz")
    _corrupt(next((store / "packages").rglob(f"{added.package_key}*")))
    with Engine(store, model="toy", redis=redis_server.url, memory_bytes=0) as engine:
        found = engine.reference_package(engine.reference(added.ref_id))
        assert found.cached is False and found.package.tensors["features"].equal(expected)
        assert engine.verify().ok  # the disk copy was replaced by the re-encoded package
        refilled = engine.store.redis.get(added.package_key)
        assert refilled is not None and refilled.tensors["features"].equal(expected)
        tiers = engine.stats().tiers
        assert tiers["redis"]["corrupt"] == (1 if redis_copy == "corrupt" else 0)
        assert tiers["disk"]["hits"] == 0 and engine.stats().misses == 2  # the add, and this one re-encode


def test_a_quota_eviction_drops_every_tier_and_the_next_use_re_encodes(tmp_path, photo, redis_server):
    with Engine(tmp_path / "store", model="toy", redis=redis_server.url, max_package_bytes=1) as engine:
        first = engine.add(photo("chelsea"), attributes=[])
        engine.add(photo("coffee"), attributes=[])
        assert not engine.store.local.contains(first.package_key)
        assert not engine.store.memory.contains(first.package_key)
        assert not engine.store.redis.contains(first.package_key)
        assert engine.reference_package(engine.reference(first.ref_id)).cached is False
