"""The prefix-state store: keys, tiers, bounds, and damaged files never served."""

from __future__ import annotations

import os
import time

import pytest
import torch

from refsight.backends.prefix import PrefixState, prefix_key, reusable_prefix
from refsight.cache.prefix_states import PrefixStateCache
from refsight.store import open_store
from refsight.store.prefixes import PrefixStore
from refsight.vllm_connector import refsight_codec

MODEL = "f" * 64 + ":cpu"
PACKAGES = ["a" * 64, "b" * 64]


def _hf_state(tokens: int = 5, layers: int = 2) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(tokens)
    out = {}
    for layer in range(layers):
        out[f"key.{layer}"] = torch.randn(1, 2, tokens, 8, generator=g)
        out[f"value.{layer}"] = torch.randn(1, 2, tokens, 8, generator=g).to(torch.bfloat16)
    return out


def test_prefix_key_derivation_is_frozen_and_every_field_counts():
    key = prefix_key(MODEL, PACKAGES, [1, 2, 3], "hf-kv-1:qwen2_vl")
    # Frozen: a changed derivation would silently orphan every stored state (bump PREFIX_FORMAT_VERSION).
    assert key == prefix_key(MODEL, list(PACKAGES), (1, 2, 3), "hf-kv-1:qwen2_vl")
    assert key == "459616ba148f22a0717a5874d1cf86136c863cb5b0647cfcd6a5df25fdf76dc9"
    others = {
        prefix_key("e" * 64 + ":cpu", PACKAGES, [1, 2, 3], "hf-kv-1:qwen2_vl"),  # another model
        prefix_key(MODEL, PACKAGES[::-1], [1, 2, 3], "hf-kv-1:qwen2_vl"),  # references in another order
        prefix_key(MODEL, PACKAGES[:1], [1, 2, 3], "hf-kv-1:qwen2_vl"),  # fewer references
        prefix_key(MODEL, PACKAGES, [1, 2, 4], "hf-kv-1:qwen2_vl"),  # another prefix token
        prefix_key(MODEL, PACKAGES, [1, 2, 3, 0], "hf-kv-1:qwen2_vl"),  # a longer prefix
        prefix_key(MODEL, PACKAGES, [1, 2, 3], "hf-kv-2:qwen2_vl"),  # another template version
    }
    assert key not in others and len(others) == 6
    with pytest.raises(ValueError):
        prefix_key(MODEL, PACKAGES, [], "t")


def test_reusable_prefix_runs_through_the_last_reference_before_anything_fresh():
    ref, fresh = object(), object()
    is_ref = lambda s: s is ref  # noqa: E731
    assert reusable_prefix(["a", ref, "b", ref, "c", fresh, "d"], is_ref) == 4
    assert reusable_prefix(["a", fresh, ref], is_ref) == 0
    assert reusable_prefix(["text only"], is_ref) == 0


def test_states_round_trip_through_disk_hf_tensors_and_a_llamacpp_blob(tmp_path):
    store = PrefixStore(tmp_path)
    hf = _hf_state()
    key_hf, key_blob = prefix_key(MODEL, PACKAGES, [1], "t"), prefix_key(MODEL, PACKAGES, [2], "t")
    store.put(key_hf, hf, meta={"layers": 2}, tokens=5, build_ms=12.5)
    store.put(key_blob, {"state": b"\x00\x01llama state"}, meta={"n_tokens": 9}, tokens=9, build_ms=3.0)
    store.clear_memory()
    got = store.get(key_hf)
    assert got.tokens == 5 and got.build_ms == 12.5 and dict(got.meta) == {"layers": 2}
    for name, tensor in hf.items():
        assert got.tensors[name].dtype == tensor.dtype and torch.equal(got.tensors[name], tensor)
    blob = store.get(key_blob)
    assert blob.tensors["state"].dtype == torch.uint8 and bytes(blob.tensors["state"].numpy()) == b"\x00\x01llama state"
    assert store.stats()["prefixes"] == 2 and store.stats()["bytes"] == sum(
        p.stat().st_size for p in (tmp_path / "prefixes").glob("*/*.safetensors")
    )


def test_the_memory_tier_is_an_lru_bounded_by_bytes(tmp_path):
    one = sum(t.numel() * t.element_size() for t in _hf_state().values())
    store = PrefixStore(tmp_path, memory_bytes=2 * one)
    keys = [prefix_key(MODEL, PACKAGES, [i], "t") for i in range(3)]
    for key in keys[:2]:
        store.put(key, _hf_state(), meta={}, tokens=5, build_ms=1.0)
    assert store.get(keys[0]) is not None  # keys[0] is now the most recently used
    store.put(keys[2], _hf_state(), meta={}, tokens=5, build_ms=1.0)
    assert store.memory_used <= 2 * one
    assert keys[0] in store._memory and keys[2] in store._memory and keys[1] not in store._memory
    assert store.get(keys[1]) is not None  # still on disk


def test_the_disk_tier_is_bounded_least_recently_used_first(tmp_path):
    store = PrefixStore(tmp_path, memory_bytes=0)
    keys = [prefix_key(MODEL, PACKAGES, [i], "t") for i in range(3)]
    store.put(keys[0], _hf_state(), meta={}, tokens=5, build_ms=1.0)
    size = store.path_for(keys[0]).stat().st_size
    store.disk_bytes = 2 * size + size // 2  # room for two files, not three (compressed sizes differ by a few bytes)
    store.put(keys[1], _hf_state(), meta={}, tokens=5, build_ms=1.0)
    past = time.time() - 100
    os.utime(store.path_for(keys[0]), (past, past))
    os.utime(store.path_for(keys[1]), (past - 10, past - 10))
    assert store.get(keys[1]) is not None  # a hit makes it recent again
    store.put(keys[2], _hf_state(), meta={}, tokens=5, build_ms=1.0)
    assert [store.path_for(k).exists() for k in keys] == [False, True, True]


@pytest.mark.parametrize("damage", ["flip-data", "flip-header", "truncate", "empty", "other-key"])
def test_a_damaged_file_is_detected_deleted_counted_and_never_served(tmp_path, damage):
    with open_store(tmp_path / "store") as store:
        cache = PrefixStateCache(store)
        key, other = prefix_key(MODEL, PACKAGES, [1], "t"), prefix_key(MODEL, PACKAGES, [2], "t")
        cache.put(key, PrefixState(_hf_state(), {"layers": 2}, 5, 10.0))
        cache.put(other, PrefixState(_hf_state(7), {"layers": 2}, 7, 10.0))
        path = store.prefixes.path_for(key)
        data = bytearray(path.read_bytes())
        if damage == "flip-data":
            data[-5] ^= 0x01
        elif damage == "flip-header":  # inside the JSON header text, under a sound codec layer
            raw = bytearray(refsight_codec.decompress(memoryview(bytes(data))))
            at = raw.index(b'tokens\\":5') + len(b'tokens\\":')
            raw[at] = ord("6")
            data = bytearray(b"".join(bytes(c) for c in refsight_codec.compress([(raw, 1)]).chunks))
        elif damage == "truncate":
            data = data[: len(data) // 2]
        elif damage == "empty":
            data = bytearray()
        else:
            data = bytearray(store.prefixes.path_for(other).read_bytes())
        path.write_bytes(bytes(data))
        store.prefixes.clear_memory()
        assert cache.get(key) is None
        assert not path.exists()
        store.counters.flush()
        counts = store.catalog.counters()
        assert counts["prefix_corrupt"] == 1 and counts["prefix_misses"] == 1
        assert cache.get(other) is not None  # the other state is untouched


def test_stats_and_gc_know_the_prefix_tier(tmp_path):
    with open_store(tmp_path / "store") as store:
        cache = PrefixStateCache(store)
        key = prefix_key(MODEL, PACKAGES, [1], "t")
        assert cache.get(key) is None
        cache.put(key, PrefixState(_hf_state(), {}, 5, 40.0))
        assert cache.get(key) is not None
        stale = store.prefixes.path_for(key).parent / ".tmp-killed.partial"
        stale.write_bytes(b"half a state")
        os.utime(stale, (0, 0))
        assert store.gc()["temp_files"] == 1 and not stale.exists()
    import refsight

    with refsight.Engine(tmp_path / "store") as engine:
        stats = engine.stats()
        assert (stats.prefix_hits, stats.prefix_misses, stats.prefix_ms_saved) == (1, 1, 40.0)
        assert stats.prefix_bytes == store.prefixes.stats()["bytes"] > 0
        tenant = engine.stats(tenant_view=True)
        assert tenant.prefix_hits is None and tenant.prefix_bytes is None


def test_prefix_states_of_isolated_tenants_never_meet(tmp_path):
    """Issue 25 item 6: prefix states are scoped through their keys (the package keys are salted per tenant).

    Tenant A's state over an image both tenants hold is, for tenant B, a miss: B builds its own, with
    its own timing, and neither is ever served the other's.
    """
    from store_helpers import fingerprint, image_hash

    from refsight.package import package_key

    shared_image, fp = image_hash(7), fingerprint()
    keys = {tenant: prefix_key(MODEL, [package_key(shared_image, fp, tenant)], [1, 2, 3], "hf-kv-1:qwen2_vl")
            for tenant in ("tenant-a", "tenant-b")}
    assert keys["tenant-a"] != keys["tenant-b"]
    assert prefix_key(MODEL, [package_key(shared_image, fp, None)], [1, 2, 3], "hf-kv-1:qwen2_vl") not in keys.values()
    with open_store(tmp_path / "store") as store:
        store.prefixes.put(keys["tenant-a"], _hf_state(), meta={"tenant": "a"}, tokens=3, build_ms=9.0)
        assert store.prefixes.get(keys["tenant-b"]) is None and not store.prefixes.contains(keys["tenant-b"])
        assert store.prefixes.get(keys["tenant-a"]).meta == {"tenant": "a"}
