"""The store lifecycle on both catalogs (one suite, SQLite and PostgreSQL): the byte quota's LRU order
over buffered uses, pinned keys, prune with its links, and parse_bytes."""

from __future__ import annotations

import time

import pytest
from store_helpers import fingerprint, make_package

from refsight.errors import InvalidInputError
from refsight.store import parse_bytes


def _sizes(store) -> dict[str, int]:
    return {r.key: r.bytes for r in store.local.records()}


def test_the_quota_evicts_by_last_use_and_skips_pinned_and_protected_keys(opener, tmp_path):
    packages = [make_package(n) for n in range(5)]
    with opener(tmp_path / "s", memory_bytes=1 << 20) as store:
        for package in packages:
            store.packages.put(package)
            time.sleep(0.002)
        size = max(_sizes(store).values())
        # uses are buffered (no write on a read) and count once flushed: 0 is now the most recent
        store.usage.note(packages[0].key)
        store.max_package_bytes = 3 * size
        with store.pins.holding([packages[1].key]):  # a running request holds 1
            report = store.enforce_quota(protect=(packages[4].key,))
        assert report.evicted == [packages[2].key, packages[3].key]  # 1 pinned, 4 just written, 0 recent
        assert report.skipped_in_use == 1 and report.after <= 3 * size
        assert set(_sizes(store)) == {packages[0].key, packages[1].key, packages[4].key}
        assert not store.memory.contains(packages[2].key) and store.packages.get(packages[2].key) is None
        assert store.enforce_quota() is None  # under the quota: nothing to do, no write
        store.counters.flush()
        counters = store.catalog.counters()
        assert counters["quota_evictions"] == 2 and counters["quota_evicted_bytes"] == report.evicted_bytes


def test_under_shares_a_tenant_evicts_only_its_own_packages(opener, tmp_path):
    """Issue 60 group 6: with tenants' shares, a write of tenant b never evicts tenant a's packages, however old;
    b is held to its half of the quota from its own, least recently used first, and the tenants' shares add up to the
    quota (a package of no tenant goes first when the store is over it)."""
    import dataclasses

    def scoped(n: int, scope: str | None):
        return dataclasses.replace(make_package(n), scope=scope)

    with opener(tmp_path / "s", memory_bytes=1 << 20) as store:
        store.quota_shares = frozenset({"a", "b"})
        a_old = scoped(0, "a")
        store.packages.put(a_old)  # the oldest in the store
        size = store.local.total_bytes()
        store.max_package_bytes = 6 * size + size // 2  # 3.25 packages a tenant
        orphan = scoped(1, None)
        store.packages.put(orphan)  # shared (no tenant's): the quota's to take
        evicted = []
        for n in range(2, 9):  # b writes 7 packages, one at a time
            time.sleep(0.002)
            package = scoped(n, "b")
            store.packages.put(package)
            report = store.enforce_quota(protect=(package.key,), scope="b")
            evicted += report.evicted if report else []
        held = set(_sizes(store))
        assert a_old.key in held, "tenant b's writes evicted tenant a's package"
        assert store.local.total_bytes(scope="b") <= store.max_package_bytes // 2
        b_keys = [scoped(n, "b").key for n in range(2, 9)]
        assert evicted and evicted == b_keys[:len(evicted)]  # b's own, least recently used first
        assert held >= set(b_keys[len(evicted):])
        assert orphan.key in held  # the store stayed within the quota without it: b's share held b
        store.max_package_bytes = store.local.total_bytes() - 1  # over the quota as a whole: what no tenant owns goes
        report = store.enforce_quota()
        assert report.evicted == [orphan.key] and a_old.key in set(_sizes(store))


def test_one_quota_over_packages_and_the_vllm_connectors_encoder_outputs(opener, tmp_path):
    """Packages and vLLM's encoder outputs (refsight's connector, same store) go in one least-recently-used
    order, and the connector is told what the packages hold for its own checks."""
    from refsight.vllm_connector import refsight_ec_store as ec

    packages = [make_package(n) for n in range(3)]
    with opener(tmp_path / "s", memory_bytes=1 << 20) as store:
        outputs = ec.ECStore(store.root / ec.DIRNAME, "f" * 64)  # what the connector in vLLM opens
        uuids = ["refsight-" + f"{n:064x}" for n in range(2)]
        for n, package in enumerate(packages):  # package 0, output 0, package 1, output 1, package 2
            store.packages.put(package)
            time.sleep(0.002)
            if n < 2:
                data = bytes(4096)
                outputs.save(uuids[n], ec.serialize(data, "U8", [4096], uuid=uuids[n], fingerprint="f" * 64))
                time.sleep(0.002)
        packages_bytes = sum(_sizes(store).values())
        output_bytes = outputs.total_bytes()
        store.max_package_bytes = packages_bytes + output_bytes - 1  # one entry must go: the oldest, package 0
        report = store.enforce_quota()
        assert report.evicted == [packages[0].key] and report.encoder_outputs_evicted == 0
        store.max_package_bytes = store.local.total_bytes() + output_bytes - 1  # next oldest: output 0
        report = store.enforce_quota()
        assert report.evicted == [] and report.encoder_outputs_evicted == 1
        assert report.encoder_outputs_evicted_bytes == output_bytes // 2 and report.after <= store.max_package_bytes
        assert outputs.load(uuids[0]) is None and outputs.load(uuids[1]) is not None
        external = outputs._connection().execute("SELECT bytes FROM external").fetchall()
        assert external == [(store.local.total_bytes(),)]  # the connector's saves count the packages


def test_prune_removes_one_fingerprints_packages_and_links_only(opener, tmp_path):
    old = [make_package(n, model="old-vlm") for n in range(3)]
    new = [make_package(n, model="new-vlm") for n in range(3)]
    with opener(tmp_path / "s") as store:
        for n, (a, b) in enumerate(zip(old, new)):
            store.packages.put(a)
            store.packages.put(b)
            store.catalog.add_reference(f"r{n}", a.image_sha256, {"n": n})
            store.catalog.link_package(f"r{n}", a.fingerprint.digest, a.key)
            store.catalog.link_package(f"r{n}", b.fingerprint.digest, b.key)
        usage = {u.model_id: u for u in store.local.fingerprint_usage()}
        assert usage["old-vlm"].packages == 3 and usage["old-vlm"].fingerprint_digest == fingerprint("old-vlm").digest
        digest = fingerprint("old-vlm").digest
        dry = store.prune([digest], dry_run=True)
        assert dry.packages == 3 and sorted(dry.keys) == sorted(p.key for p in old) and len(_sizes(store)) == 6
        done = store.prune([digest])
        assert done.packages == 3 and done.links == 3 and set(_sizes(store)) == {p.key for p in new}
        for n in range(3):
            ref = store.catalog.get_reference(f"r{n}")
            assert ref.metadata == {"n": n} and ref.packages == {fingerprint("new-vlm").digest: new[n].key}


@pytest.mark.parametrize(
    "value, expected",
    [(1, 1), ("1", 1), ("500MB", 500 * 10**6), ("20GiB", 20 * 2**30), ("1.5 kib", 1536), ("2_000 B", 2000)],
)
def test_parse_bytes(value, expected):
    assert parse_bytes(value) == expected


@pytest.mark.parametrize("value", [0, -5, "lots", "12 parsecs", True, None, 1.5, ""])
def test_parse_bytes_refuses_with_the_setting_named(value):
    with pytest.raises(InvalidInputError, match="max_package_bytes"):
        parse_bytes(value)
