"""What each package tier costs per lookup: memory, Redis (loopback), disk; and a quota eviction pass.

Writes ``--packages`` packages of a realistic size (``--tokens`` × 1,536 dims bf16: 1,369 tokens ≈ 4 MB,
the merged features of a Qwen2-VL image at ~1,000×1,000 px) into a store with a Redis tier on a
throwaway ``redis-server`` (the distribution's binary, as the tests start it), then measures medians
over every package, each tier alone answering (warm page cache, Redis on loopback):

- ``memory_ms``: a memory-tier hit through the tiered store;
- ``redis_ms``: a Redis hit (memory tier empty): GET, checksum, header checks, tensors;
- ``disk_ms``: a disk hit (Redis emptied, not refilled: the tier is taken out of the order);
- ``redis_vs_disk``: redis / disk, measured in the same run (below 1: Redis is the faster tier here;
  its point is sharing across replicas and machines, not beating a warm local page cache);
- ``down_ms``: a lookup while Redis is stopped (after the one timed-out call: backing off, so disk
  speed); ``down_vs_disk`` near 1 means an outage costs nothing per request;
- ``quota_pass_ms``: one quota pass evicting half the packages (LRU order, every tier).

Prints ONE JSON line. Usage: ``python benchmarks/store_tiers.py [--packages 24] [--tokens 1369]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _median_ms(get, keys) -> float:
    samples = []
    for key in keys:
        start = time.perf_counter()
        package = get(key)
        samples.append(time.perf_counter() - start)
        assert package is not None
    return round(statistics.median(samples) * 1000, 3)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--packages", type=int, default=24)
    parser.add_argument("--tokens", type=int, default=1369)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT / "benchmarks"))
    sys.path.insert(0, str(ROOT / "tests"))
    import redis
    from services import RedisServer
    from store_load import make

    from refsight.store import open_store

    server = RedisServer(maxmemory="1gb")
    try:
        with tempfile.TemporaryDirectory() as tmp, open_store(tmp, memory_bytes=1 << 34, redis=server.url) as store:
            packages = [make(args.tokens, 1536, n) for n in range(args.packages)]
            for package in packages:
                store.packages.put(package)
            keys = [p.key for p in packages]
            _median_ms(store.local.get, keys)  # warm the page cache
            memory_ms = _median_ms(store.packages.get, keys)
            store.memory.clear()
            redis_ms = _median_ms(store.redis.get, keys)
            disk_ms = _median_ms(store.local.get, keys)
            redis.Redis.from_url(server.url).flushall()
            server.stop()
            store.packages.get(keys[0])  # the one timed-out call; the tier backs off from here
            store.memory.clear()
            store.memory.max_bytes = 0
            down_ms = _median_ms(store.packages.get, keys)
            size = store.local.total_bytes()
            start = time.perf_counter()
            report = store_quota(store, size // 2)
            quota_ms = round((time.perf_counter() - start) * 1000, 3)
            figures = {
                "packages": args.packages,
                "package_mb": round(packages[0].nbytes / 1e6, 2),
                "memory_ms": memory_ms,
                "redis_ms": redis_ms,
                "disk_ms": disk_ms,
                "redis_vs_disk": round(redis_ms / disk_ms, 3),
                "down_ms": down_ms,
                "down_vs_disk": round(down_ms / disk_ms, 3),
                "quota_evicted": len(report.evicted),
                "quota_pass_ms": quota_ms,
                "redis_errors": store.redis.tier_info()["errors"],
            }
    finally:
        server.close()
    print(json.dumps(figures), flush=True)
    return 0


def store_quota(store, max_bytes: int):
    """One quota pass down to ``max_bytes``."""
    store.max_package_bytes = max_bytes
    return store.enforce_quota()


if __name__ == "__main__":
    sys.exit(main())
