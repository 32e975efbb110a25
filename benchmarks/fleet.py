"""A fleet without a shared disk: what a bucket store costs and saves, on a real S3 server (SeaweedFS).

One throwaway SeaweedFS, PostgreSQL and Redis on loopback (as the tests start them), one bucket:

- **join**: replica A adds ``--refs`` references (R = 4) at ``--model`` (default the real-shape
  ``shape-qwen2-vl-2b``: real layer sizes, random weights); replica B, a new store with an EMPTY
  local disk, fetches their packages from the bucket. ``join_speedup`` = A's encode time (the
  encoder alone) / B's fetch time, in the same run (the target: ≥ 5);
- **first cached answer**: a ``refsight serve`` replica started on the warm fleet with an empty
  ``--local-dir``; seconds from its start to the first answer that needed no encode (re-adding one
  of the fleet's references: linked, not encoded), and to ``/healthz`` for comparison;
- **tiers**: ``--packages`` packages of ``--tokens`` × 1,536 bf16 (1,369 tokens ≈ 4.2 MB, a
  Qwen2-VL image at ~1,000 px) read one by one from the bucket, from the local disk cache and from
  Redis: p50/p99 per package in ms and MB/s, one reader and 8 in parallel (``*_mb_s_x8``);
- **scale**: ``--objects`` small objects listed page by page (ms per 1,000 objects), the objects and
  bytes one reference costs, and what 1M references would cost (extrapolated in ``million``).

Prints ONE JSON line. Usage: ``python benchmarks/fleet.py [--model shape-qwen2-vl-2b] [--refs 4]
[--packages 24] [--tokens 1369] [--objects 2000] [--image-px 1000]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MB = 1e6


def _percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return round(statistics.median(ordered) * 1000, 2), round(p99 * 1000, 2)


def _read_figures(name: str, get, keys: list[str], sizes: dict[str, int]) -> dict[str, float]:
    """p50/p99 ms and MB/s of ``get`` over ``keys``, one reader, then 8 in parallel."""
    samples = []
    for key in keys:
        started = time.perf_counter()
        assert get(key) is not None, (name, key)
        samples.append(time.perf_counter() - started)
    total = sum(sizes[k] for k in keys)
    p50, p99 = _percentiles(samples)
    started = time.perf_counter()
    with ThreadPoolExecutor(8) as pool:
        assert all(found is not None for found in pool.map(get, keys))
    parallel = time.perf_counter() - started
    return {f"{name}_p50_ms": p50, f"{name}_p99_ms": p99, f"{name}_mb_s": round(total / sum(samples) / MB, 1),
            f"{name}_mb_s_x8": round(total / parallel / MB, 1)}


def _tiers(url: str, catalog: str, redis_url: str, tmp: Path, args) -> dict:
    """Per-package reads from the bucket, the local disk cache and Redis (the same packages)."""
    from store_load import make

    from refsight.store import open_store

    packages = [make(args.tokens, 1536, 10_000 + n) for n in range(args.packages)]
    keys = [p.key for p in packages]
    with open_store(url, catalog=catalog, local_dir=tmp / "writer", redis=redis_url) as writer:
        for package in packages:
            writer.packages.put(package)
    with open_store(url, catalog=catalog, local_dir=tmp / "reader", redis=redis_url, memory_bytes=0) as reader:
        sizes = {k: reader.local.record(k).bytes for k in keys}
        figures = _read_figures("bucket", reader.local.get, keys, sizes)
        for package in packages:
            reader.cache.put(package)
        figures |= _read_figures("local", reader.cache.get, keys, sizes)
        figures |= _read_figures("redis", reader.redis.get, keys, sizes)
    figures["package_mb"] = round(statistics.mean(sizes.values()) / MB, 2)
    return figures


def _join(url: str, catalog: str, tmp: Path, args, images: list[bytes]) -> dict:
    """R references encoded by replica A; the same packages fetched by a new replica B from the bucket."""
    from refsight import Engine

    with Engine(url, catalog=catalog, local_dir=tmp / "a", model=args.model) as a:
        results = [a.add(image, ref_id=f"r{i}") for i, image in enumerate(images)]
        assert not any(r.cached for r in results)
        digest = a.backend().fingerprint().digest
        keys = [a.store.catalog.get_reference(f"r{i}").packages[digest] for i in range(len(images))]
        encode_s = sum(a.store.local.get(k).encode_ms for k in keys) / 1000
        package_bytes = statistics.mean(a.store.local.record(k).bytes for k in keys)
    with Engine(url, catalog=catalog, local_dir=tmp / "b", model=args.model) as b:  # an empty local disk
        started = time.perf_counter()
        fetched = [b.store.packages.get(b.store.catalog.get_reference(f"r{i}").packages[digest]) for i in range(len(images))]
        fetch_s = time.perf_counter() - started
        assert all(p is not None for p in fetched) and b.store.packages.tier_stats()["bucket"]["hits"] == len(images)
    return {"refs": len(images), "encode_s": round(encode_s, 3), "bucket_fetch_s": round(fetch_s, 4),
            "join_speedup": round(encode_s / fetch_s, 1), "reference_package_bytes": int(package_bytes)}


def _first_answer(url: str, catalog: str, tmp: Path, args, image: bytes) -> dict:
    """Seconds from a new replica's start to /healthz, and to its first cached answer."""
    from replica_helpers import Replica, b64

    replica = Replica("joining", url, catalog, tmp / "joining", model=args.model, workers=1)
    started = time.perf_counter()
    try:
        replica.start(timeout=900)
        healthy = time.perf_counter() - started
        with replica.client() as client:
            answer = client.post("/v1/references", json={"image": b64(image), "id": "r0"})
        first = time.perf_counter() - started
        assert answer.status_code in (200, 201) and answer.json().get("cached") is True, answer.text[:300]
        assert replica.stats()["replica"]["misses"] == 0
    finally:
        replica.stop()
    return {"healthz_s": round(healthy, 2), "first_cached_answer_s": round(first, 2)}


def _scale(url: str, tmp: Path, args, per_reference: dict) -> dict:
    """Listing speed over ``--objects`` objects, and what 1M references would cost."""
    from refsight.vllm_connector.refsight_objects import ObjectStore

    objects = ObjectStore(url.rstrip("/") + "/scale")
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda n: objects.put(f"packages/{n:08d}", [b"x"]), range(args.objects)))
    started = time.perf_counter()
    listed = sum(1 for _ in objects.listing("packages/"))
    listing_s = time.perf_counter() - started
    objects.close()
    assert listed == args.objects
    per_1000_ms = listing_s / listed * 1000 * 1000
    count = per_reference["objects_per_reference"] * 1_000_000
    return {
        "listed_objects": listed, "listing_ms_per_1000": round(per_1000_ms, 1),
        "million": {
            "objects": count,
            "bytes": int(per_reference["bytes_per_reference"] * 1_000_000),
            "listing_s": round(per_1000_ms * count / 1000 / 1000, 1),
            "list_requests": -(-count // 1000),
        },
    }


def _services():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    sys.path.insert(0, str(ROOT / "tests"))
    sys.path.insert(0, str(ROOT / "tests" / "server"))
    from services import PostgresServer, RedisServer, S3Server

    return S3Server(), PostgresServer(), RedisServer(maxmemory="2gb")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="shape-qwen2-vl-2b")
    parser.add_argument("--refs", type=int, default=4)
    parser.add_argument("--packages", type=int, default=24)
    parser.add_argument("--tokens", type=int, default=1369)
    parser.add_argument("--objects", type=int, default=2000)
    parser.add_argument("--image-px", type=int, default=1000)
    args = parser.parse_args(argv)
    s3, postgres, redis = _services()
    try:
        os.environ.update(s3.env)
        from replica_helpers import noise_png

        images = [noise_png(i, args.image_px) for i in range(args.refs)]
        url, catalog = s3.bucket(), postgres.create_database()
        with tempfile.TemporaryDirectory(prefix="refsight-fleet-") as tmp:
            figures = {"model": args.model, "cpu_count": os.cpu_count()}
            figures |= _join(url, catalog, Path(tmp), args, images)
            figures |= _first_answer(url, catalog, Path(tmp), args, images[0])
            figures |= _tiers(url, catalog, redis.url, Path(tmp), args)
            per_reference = {"objects_per_reference": 2,  # its package and its kept image
                             "bytes_per_reference": figures["reference_package_bytes"] + statistics.mean(map(len, images))}
            figures |= per_reference | _scale(url, Path(tmp), args, per_reference)
            figures["bucket_get_per_s_x8"] = round(figures["bucket_mb_s_x8"] * MB / (figures["package_mb"] * MB), 1)
    finally:
        for server in (s3, postgres, redis):
            server.close()
    print(json.dumps(figures), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
