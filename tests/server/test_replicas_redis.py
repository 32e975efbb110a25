"""Two replicas on one PostgreSQL, one blob directory and ONE Redis: what A encoded, B reads from
Redis (no encode); Redis stopped mid-run, B keeps serving from the blob directory; back, it refills.

Real ``refsight serve`` processes, a real PostgreSQL and a real Redis (tests/services.py). The
replicas run without a memory tier (``[store] memory_bytes = 0`` in the shared directory's
``refsight.toml``), so every reference lookup reaches Redis or the blobs.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from runtimes import require_module
from replica_helpers import Replica, add_references, compare_all

redis = require_module("redis", "pip install 'refsight[redis]'")
require_module("psycopg", "pip install 'refsight[postgres]'")

N = 12


@pytest.mark.slow
def test_two_replicas_share_one_redis_and_survive_its_outage(tmp_path, postgres_server, redis_server):
    url = postgres_server.create_database()
    blobs = tmp_path / "blobs"
    blobs.mkdir()
    (blobs / "refsight.toml").write_text("[store]\nmemory_bytes = 0\n")
    replicas = [
        Replica(name, blobs, url, tmp_path / f"local-{name}", extra=("--redis", redis_server.url)) for name in ("a", "b")
    ]
    keys = redis.Redis.from_url(redis_server.url)
    try:
        with ThreadPoolExecutor(2) as pool:
            a, b = pool.map(lambda r: r.start(), replicas)
        assert add_references(a, N) == [201] * N and len(keys.keys("refsight:pkg:*")) == N

        # B compares against every reference: not one encoded again, every one read from Redis
        assert compare_all(b, N, 0) == [200] * 3
        stats = b.stats()
        assert stats["replica"]["misses"] == 3  # the three candidates (compared images) only
        assert stats["tiers"]["redis"]["hits"] == N and stats["tiers"]["disk"]["hits"] == 0

        # Redis stops mid-run: B serves every request from the shared blob directory
        redis_server.stop()
        assert compare_all(b, N, 1) == [200] * 3
        stats = b.stats()
        assert stats["tiers"]["redis"]["available"] is False and stats["tiers"]["disk"]["hits"] == N
        assert stats["replica"]["misses"] == 6  # still no reference encoded

        # Redis back, empty: B finds it again (a probe rides on a request) and refills it from the blobs
        redis_server.start()
        deadline = time.monotonic() + 30
        round_ = 2
        while not b.stats()["tiers"]["redis"]["available"]:
            assert compare_all(b, N, round_) == [200] * 3
            assert time.monotonic() < deadline, "the Redis tier did not come back"
            round_ += 1
            time.sleep(0.3)
        assert compare_all(b, N, round_) == [200] * 3
        assert len(keys.keys("refsight:pkg:*")) == N  # the references (candidates never go to Redis)
        hits = b.stats()["tiers"]["redis"]["hits"]
        assert compare_all(b, N, round_ + 1) == [200] * 3
        stats = b.stats()
        assert stats["tiers"]["redis"]["hits"] == hits + N
        assert stats["replica"]["misses"] == 3 * (round_ + 2)  # candidates only, all along
        assert a.stats()["replica"]["misses"] == N
    finally:
        for replica in replicas:
            replica.stop()
        postgres_server.drop_database(url)
