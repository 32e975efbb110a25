"""`serve_load.py --replicas N`: N `refsight serve` processes on one PostgreSQL catalog and one blob directory.

What it does, in phases (each replica counts its own encodes: ``/v1/stats`` → ``replica.misses``):

1. **add**: R references added through replica A (8 client threads); the first 8 are also
   posted to every other replica *at the same moment* (same id, same image), so the encode
   lease is exercised: each image must still be encoded once in the whole deployment.
2. **proof**: replica B compares against every reference (the candidate is itself a stored
   reference image): ``proof_b_encodes`` must be 0: what A encoded, B never encodes.
3. **load**: C clients split evenly over the replicas send compares (a candidate against two
   references) and searches. Candidate packages stay in the memory of the replica that
   compared them (policy 2: candidates leave nothing in the store), so each candidate image
   is sent to one replica only, as a load balancer with affinity would.

Figures: ``errors`` (must be 0), ``encodes`` (sum over replicas) against ``distinct_images``
(R + candidates), p50/p99 of the load phase, and the share of package lookups served by each
tier (``memory``, ``disk``: the shared blob directory, ``encode``), summed over replicas.
PostgreSQL: ``--catalog URL``, else a throwaway server from the distribution's binaries
(``tests/services.py``, as the tests start it).
"""

from __future__ import annotations

import io
import json
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PHOTOS = ("chelsea", "coffee", "astronaut", "rocket", "horse", "china")
RUBRIC = "striped fur\npointed ears\nsame colour pattern"
QUERIES = ("a cat", "a cup of coffee", "a rocket", "a person")


def _variant_b64(i: int, size: int) -> str:
    """Distinct images from the bundled photos: photo i % 6, flipped and rotated by i // 6."""
    import base64

    from PIL import Image

    from refsight.samples import load_sample

    image = load_sample(PHOTOS[i % len(PHOTOS)]).resize((size, size))
    if (i // len(PHOTOS)) % 2:
        image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    image = image.rotate(i // (2 * len(PHOTOS)) * 7)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def run(args) -> int:
    """Run the replicas benchmark for ``serve_load.py``'s parsed ``args``; prints one JSON line."""
    sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "server")]
    import httpx
    from replica_helpers import Replica

    work = Path(args.store or tempfile.mkdtemp(prefix="refsight-replicas-"))
    server = None
    catalog = args.catalog
    if catalog is None:
        from services import PostgresServer

        server = PostgresServer()
        catalog = server.create_database("refsight")
    total = args.references + args.candidates
    print(f"replicas: {args.replicas}, catalog {catalog}, blobs {work / 'blobs'}; preparing {total} images",
          file=sys.stderr)
    images = [_variant_b64(i, args.size) for i in range(total)]
    references, candidates = images[: args.references], images[args.references :]
    ref_ids = [f"ref{i}" for i in range(args.references)]
    replicas = []
    try:
        for n in range(args.replicas):
            replicas.append(Replica(chr(ord("a") + n), work / "blobs", catalog, work / f"local-{n}",
                                    model=args.model, workers=args.workers))
        with ThreadPoolExecutor(len(replicas)) as pool:
            list(pool.map(lambda r: r.start(timeout=600), replicas))
        a, b = replicas[0], replicas[1]
        errors = 0

        def post(replica, path: str, body: dict, ok: int = 200) -> tuple[bool, float]:
            started = time.perf_counter()
            try:
                response = httpx.post(f"{replica.url}{path}", json=body, timeout=600)
                good = response.status_code == ok
                if not good:
                    print(f"error: {replica.name} {path} -> {response.status_code} {response.text[:200]}", file=sys.stderr)
            except httpx.HTTPError as e:
                good = False
                print(f"error: {replica.name} {path} -> {e!r}", file=sys.stderr)
            return good, (time.perf_counter() - started) * 1000

        # 1. add (the first 8 through every replica at once)
        jobs = [(a, i) for i in range(args.references)] + [(r, i) for r in replicas[1:] for i in range(min(8, args.references))]
        jobs.sort(key=lambda job: job[1])
        started = time.perf_counter()
        with ThreadPoolExecutor(8) as pool:
            added = list(pool.map(lambda job: post(job[0], "/v1/references",
                                                   {"image": references[job[1]], "id": ref_ids[job[1]]}, 201), jobs))
        add_s = time.perf_counter() - started
        errors += sum(not ok for ok, _ in added)
        print(f"added {args.references} references in {add_s:.1f} s", file=sys.stderr)

        # 2. proof: B compares against every reference, without encoding
        b_before = b.stats()["replica"]["misses"]
        group = 8
        proof = [(ref_ids[j], ref_ids[j + 1 : j + 1 + group] or ref_ids[:1]) for j in range(0, args.references, group)]
        with ThreadPoolExecutor(4) as pool:
            outcomes = list(pool.map(lambda p: post(b, "/v1/compare", {
                "candidate": references[ref_ids.index(p[0])], "criteria": RUBRIC, "ref_ids": [p[0], *p[1]]}), proof))
        errors += sum(not ok for ok, _ in outcomes)
        proof_b_encodes = int(b.stats()["replica"]["misses"] - b_before)
        print(f"proof: replica b compared against {args.references} references, {proof_b_encodes} encodes",
              file=sys.stderr)

        # 3. load: clients split over the replicas; each candidate goes to one replica
        def job(i: int) -> tuple[bool, float]:
            client = i % args.clients
            replica = replicas[client * len(replicas) // args.clients]
            r = replicas.index(replica)
            if args.search_every and i % args.search_every == args.search_every - 1:
                return post(replica, "/v1/search", {"text": QUERIES[i % len(QUERIES)], "k": 2})
            mine = [c for c in range(len(candidates)) if c % len(replicas) == r] or [0]
            candidate = candidates[mine[i % len(mine)]]
            pair = [ref_ids[i % args.references], ref_ids[(i + 1) % args.references]]
            return post(replica, "/v1/compare", {"candidate": candidate, "criteria": RUBRIC, "ref_ids": pair})

        started = time.perf_counter()
        with ThreadPoolExecutor(args.clients) as pool:
            load = list(pool.map(job, range(args.requests)))
        elapsed = time.perf_counter() - started
        errors += sum(not ok for ok, _ in load)
        stats = [r.stats()["replica"] for r in replicas]
    finally:
        for replica in replicas:
            replica.stop()
        if server is not None:
            server.close()
    latencies = [ms for _, ms in load]
    encodes = int(sum(s["misses"] for s in stats))
    tiers = {"memory": sum(s.get("memory_hits", 0) for s in stats), "disk": sum(s.get("disk_hits", 0) for s in stats),
             "encode": encodes}
    lookups = sum(tiers.values()) or 1
    figures = {
        "replicas": args.replicas,
        "references": args.references,
        "requests": len(load),
        "errors": errors,
        "rps": round(len(load) / elapsed, 3),
        "p50_ms": round(statistics.median(latencies), 1),
        "p99_ms": round(_percentile(latencies, 0.99), 1),
        "encodes": encodes,
        "distinct_images": len(set(images)),
        "encodes_per_replica": [int(s["misses"]) for s in stats],
        "proof_b_encodes": proof_b_encodes,
        "tier_share": {name: round(n / lookups, 4) for name, n in tiers.items()},
        "add_s": round(add_s, 2),
        "clients": args.clients,
        "model": args.model,
    }
    print(json.dumps(figures), flush=True)
    ok = errors == 0 and encodes == figures["distinct_images"] and proof_b_encodes == 0
    return 0 if ok else 1

