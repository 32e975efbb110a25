"""The store benchmarks run end to end at a tiny size (store_tiers on a real, throwaway Redis server)."""

from __future__ import annotations

import pytest
from benchmark_runner import assert_keys, run_benchmark

pytestmark = pytest.mark.slow  # runs benchmark scripts

LOAD_FIGURES = ("package_mb", "raw_read_ms", "disk_load_ms", "memory_load_ms", "disk_ratio", "checksum_ms")


def test_store_load_prints_its_figures():
    figures = run_benchmark("store_load.py", "--sizes", "tiny", "--entries", "40", "--repeats", "3")
    assert_keys(figures, *LOAD_FIGURES, "index_lookup_us", "entries", "sizes", "cpu_count")
    assert set(figures["sizes"]) == {"tiny"} and figures["entries"] == 40
    assert all(figures[key] > 0 for key in LOAD_FIGURES)


def test_store_tiers_prints_its_figures():
    figures = run_benchmark("store_tiers.py", "--packages", "4", "--tokens", "8")
    assert_keys(figures, "memory_ms", "redis_ms", "disk_ms", "redis_vs_disk", "down_ms", "down_vs_disk",
                "quota_evicted", "quota_pass_ms", "redis_errors")
    assert figures["packages"] == 4 and figures["quota_evicted"] >= 1
