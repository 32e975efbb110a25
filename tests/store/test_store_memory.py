"""MemoryPackageStore: bounded by bytes, LRU, eviction callback, same object on a hit."""

from __future__ import annotations

import time

import pytest
from store_helpers import make_package, run_threads

from refsight.errors import InvalidInputError
from refsight.store import MemoryPackageStore


def test_hit_returns_the_same_object_quickly():
    store = MemoryPackageStore(1 << 20)
    package = make_package(0)
    store.put(package)
    key = package.key
    assert store.get(key) is package
    timings = []
    for _ in range(1000):
        start = time.perf_counter()
        store.get(key)
        timings.append(time.perf_counter() - start)
    median_us = sorted(timings)[len(timings) // 2] * 1e6
    assert median_us < 50, f"memory hit took {median_us:.1f} µs"


def test_never_above_budget_and_evicts_least_recently_used_first():
    packages = [make_package(n) for n in range(6)]
    size = packages[0].nbytes
    assert all(p.nbytes == size for p in packages)
    evicted = []
    store = MemoryPackageStore(3 * size + size // 2, on_evict=lambda key, pkg: evicted.append(key))
    for p in packages[:3]:
        store.put(p)
    store.get(packages[0].key)  # 0 is now the most recent; 1 is the least
    store.put(packages[3])
    assert evicted == [packages[1].key]
    assert store.nbytes <= store.max_bytes
    store.put(packages[4])
    store.put(packages[5])
    assert evicted == [packages[1].key, packages[2].key, packages[0].key]
    assert list(store.keys()) == [p.key for p in packages[3:]]
    assert store.nbytes == 3 * size <= store.max_bytes


def test_a_package_bigger_than_the_budget_is_not_kept_and_evicts_nothing():
    small = make_package(0)
    big = make_package(1, tokens=256)
    evicted = []
    store = MemoryPackageStore(big.nbytes - 1, on_evict=lambda key, pkg: evicted.append(key))
    store.put(small)
    assert store.put(big) == big.nbytes
    assert store.get(big.key) is None and store.get(small.key) is small
    assert evicted == []


def test_delete_and_replace_keep_the_byte_count_right():
    store = MemoryPackageStore(1 << 20)
    a, b = make_package(0), make_package(1)
    store.put(a)
    store.put(b)
    store.put(a)  # same key again: counted once
    assert store.nbytes == a.nbytes + b.nbytes and len(store) == 2
    assert store.delete(a.key) and not store.delete(a.key)
    assert store.nbytes == b.nbytes and not store.contains(a.key)


def test_threads_never_push_it_over_budget():
    packages = [make_package(n) for n in range(20)]
    store = MemoryPackageStore(5 * packages[0].nbytes)
    over = []

    def work(offset):
        for i in range(300):
            p = packages[(i * 7 + offset) % len(packages)]
            store.put(p)
            got = store.get(p.key)
            assert got is None or got is p
            if store.nbytes > store.max_bytes:
                over.append(store.nbytes)

    assert run_threads(work) == []
    assert over == []
    assert store.nbytes == sum(p.nbytes for p in packages if store.contains(p.key))


@pytest.mark.parametrize("budget", [-1, 1.5, "10", True])
def test_bad_budget_is_refused(budget):
    with pytest.raises(InvalidInputError):
        MemoryPackageStore(budget)
