"""The Redis tier behind a live server (real Redis, real HTTP): stopped mid-run, no request fails;
back, it refills; each tier's figures in ``/v1/stats`` and ``/metrics``; ``refsight serve --redis``."""

from __future__ import annotations

import math
import re
import time

import httpx
from hardening_helpers import ServeProcess
from live_server import b64, photo_png
from runtimes import require_module

require_module("redis", "pip install 'refsight[redis]'")

RUBRIC = "striped fur\npointed ears"
NAMES = ("chelsea", "coffee", "rocket")


def _metric(text: str, name: str, tier: str) -> float:
    match = re.search(rf'^{name}{{tier="{tier}"}} ([0-9.e+-]+)$', text, re.M)
    assert match, f"{name}{{tier={tier!r}}} not in /metrics"
    return float(match.group(1))


COMPARES = [0]


def _compare(client: httpx.Client) -> httpx.Response:
    COMPARES[0] += 1
    return client.post("/v1/compare", json={
        "candidate": b64(photo_png("chelsea", flip=True)), "criteria": RUBRIC, "ref_ids": list(NAMES), "force_vlm": True,
    })


def test_redis_stopped_mid_run_no_request_fails_and_back_it_refills(make_server, redis_server):
    # No memory tier: every reference is read from Redis or disk (and each candidate encoded anew)
    server = make_server(redis=redis_server.url, memory_bytes=0, ingest_attributes=())
    COMPARES[0] = 0
    with server.client() as client:
        for name in NAMES:
            assert client.post("/v1/references", json={"image": b64(photo_png(name)), "id": name}).status_code == 201
        for _ in range(3):
            assert _compare(client).status_code == 200
        metrics = client.get("/metrics").text
        assert _metric(metrics, "refsight_tier_hits_total", "redis") >= 9
        assert _metric(metrics, "refsight_tier_available", "redis") == 1

        redis_server.stop()
        began = time.monotonic()
        statuses = [_compare(client).status_code for _ in range(10)]
        elapsed = time.monotonic() - began
        assert statuses == [200] * 10  # served from disk
        down = client.get("/v1/stats").json()["tiers"]
        assert down["redis"]["available"] is False and down["redis"]["outages"] == 1
        # Backed off, not retried per call: one probe per back-off, which doubles from 0.5 s, so the
        # errors grow with the log of the time the compares took (a loaded machine takes longer).
        probes = 1 + math.floor(math.log2(1 + elapsed / 0.5))
        assert down["redis"]["errors"] <= probes + 1 and down["redis"]["skipped"] > 0, (down["redis"], elapsed)
        assert down["disk"]["hits"] >= 30
        metrics = client.get("/metrics").text
        assert _metric(metrics, "refsight_tier_available", "redis") == 0
        assert _metric(metrics, "refsight_tier_errors_total", "redis") >= 1

        redis_server.start()
        # The next probe is at most one back-off away, and the back-off (doubling, each one at least the
        # sum of those before it) is at most the time Redis has been down: a loaded machine waits longer.
        deadline = time.monotonic() + 15 + (time.monotonic() - began)
        while client.get("/v1/stats").json()["tiers"]["redis"]["available"] is False:
            assert _compare(client).status_code == 200  # a probe rides on a real request
            assert time.monotonic() < deadline, "the Redis tier did not come back"
            time.sleep(0.2)
        assert _compare(client).status_code == 200  # refills Redis from disk
        hits = client.get("/v1/stats").json()["tiers"]["redis"]["hits"]
        assert _compare(client).status_code == 200
        assert client.get("/v1/stats").json()["tiers"]["redis"]["hits"] == hits + len(NAMES)
        stats = client.get("/v1/stats").json()
        assert stats["misses"] == len(NAMES) + COMPARES[0]  # no reference encoded again, whatever Redis did


def test_refsight_serve_takes_cache_and_quota_flags(tmp_path, redis_server):
    server = ServeProcess(tmp_path / "store", "--attributes", "none", "--redis", redis_server.url,
                          "--max-package-bytes", "64MiB").wait_ready()
    try:
        added = httpx.post(f"{server.url}/v1/references", json={"image": b64(photo_png("coffee")), "id": "coffee"},
                           timeout=30)
        assert added.status_code == 201
        stats = httpx.get(f"{server.url}/v1/stats", timeout=10).json()
        assert stats["max_package_bytes"] == 64 * 1024 * 1024
        assert list(stats["tiers"]) == ["memory", "redis", "disk"] and stats["tiers"]["redis"]["writes"] == 1
    finally:
        server.stop()
    assert server.process.returncode == 0, server.log
