"""benchmarks/fleet.py (the toy model, small packages) and benchmarks/object_clients.py end to end at a tiny size, on
real SeaweedFS, PostgreSQL and Redis servers."""

from __future__ import annotations

import pytest
from benchmark_runner import assert_keys, run_benchmark
from runtimes import require_module

pytestmark = pytest.mark.slow  # starts servers and a refsight serve replica

require_module("boto3", "pip install 'refsight[s3]'")
require_module("psycopg", "pip install 'refsight[postgres]'")
require_module("redis", "pip install 'refsight[redis]'")


def test_fleet_prints_its_figures():
    figures = run_benchmark("fleet.py", "--model", "toy", "--refs", "2", "--packages", "4", "--tokens", "8",
                            "--objects", "30", "--image-px", "32")
    tiers = [f"{tier}_{figure}" for tier in ("bucket", "local", "redis")
             for figure in ("p50_ms", "p99_ms", "mb_s", "mb_s_x8")]
    assert_keys(figures, "join_speedup", "encode_s", "bucket_fetch_s", "healthz_s", "first_cached_answer_s",
                "listing_ms_per_1000", "million", "bytes_per_reference", "bucket_get_per_s_x8", *tiers)
    assert figures["refs"] == 2 and figures["listed_objects"] == 30
    assert figures["first_cached_answer_s"] >= figures["healthz_s"] > 0
    assert set(figures["million"]) == {"objects", "bytes", "listing_s", "list_requests"}


def test_object_clients_prints_its_figures():
    figures = run_benchmark("object_clients.py", "--mb", "1", "--repeats", "1")
    assert figures["mb"] == [1] and set(figures) >= {"boto3", "obstore", "httpx_sigv4"}
    assert_keys(figures["boto3"], "put_mb_s_1mb", "get_mb_s_1mb", "rss_mb", "import_ms", "async", "multipart")
    # The others are measured where installed (obstore is no dependency): a figure or the reason there is none.
    assert all("get_mb_s_1mb" in figures[c] or "error" in figures[c] for c in ("obstore", "httpx_sigv4"))
