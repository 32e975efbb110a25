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
tier (``memory``, ``redis`` with ``--cache``, ``disk``: the shared blob directory, ``encode``),
summed over replicas. PostgreSQL: ``--catalog URL``, else a throwaway server from the distribution's
binaries (``tests/services.py``, as the tests start it); Redis: ``--cache URL``, or ``--cache auto``
for a throwaway one (256 MB, ``allkeys-lru``).
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


def _post(replica, path: str, body: dict, ok: int = 200) -> tuple[bool, float]:
    """One timed request to ``replica``: (status was ``ok``?, milliseconds); failures are printed, never raised."""
    import httpx

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


class _Services:
    """The PostgreSQL catalog and the optional Redis tier: given URLs, or throwaway servers (stopped on exit)."""

    def __init__(self, catalog: str | None, cache: str | None) -> None:
        self.catalog, self.cache, self._servers = catalog, cache, []
        sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "server")]

    def __enter__(self) -> "_Services":
        if self.catalog is None:
            from services import PostgresServer

            self._servers.append(PostgresServer())
            self.catalog = self._servers[-1].create_database("refsight")
        if self.cache == "auto":
            from services import RedisServer

            self._servers.append(RedisServer(maxmemory="256mb"))
            self.cache = self._servers[-1].url
        return self

    def __exit__(self, *exc: object) -> None:
        for server in self._servers:
            server.close()


def _add_phase(replicas, references: list[str], ref_ids: list[str]) -> tuple[int, float]:
    """R references through replica A, the first 8 through every other replica at once; (errors, seconds)."""
    a = replicas[0]
    jobs = [(a, i) for i in range(len(references))] + [(r, i) for r in replicas[1:] for i in range(min(8, len(references)))]
    jobs.sort(key=lambda job: job[1])
    started = time.perf_counter()
    with ThreadPoolExecutor(8) as pool:
        added = list(pool.map(lambda job: _post(job[0], "/v1/references",
                                                {"image": references[job[1]], "id": ref_ids[job[1]]}, 201), jobs))
    add_s = time.perf_counter() - started
    print(f"added {len(references)} references in {add_s:.1f} s", file=sys.stderr)
    return sum(not ok for ok, _ in added), add_s


def _proof_phase(b, references: list[str], ref_ids: list[str]) -> tuple[int, int]:
    """Replica B compares against every reference; (errors, encodes B made: must be 0)."""
    before = b.stats()["replica"]["misses"]
    group = 8
    proof = [(ref_ids[j], ref_ids[j + 1 : j + 1 + group] or ref_ids[:1]) for j in range(0, len(ref_ids), group)]
    with ThreadPoolExecutor(4) as pool:
        outcomes = list(pool.map(lambda p: _post(b, "/v1/compare", {
            "candidate": references[ref_ids.index(p[0])], "criteria": RUBRIC, "ref_ids": [p[0], *p[1]]}), proof))
    encodes = int(b.stats()["replica"]["misses"] - before)
    print(f"proof: replica b compared against {len(ref_ids)} references, {encodes} encodes", file=sys.stderr)
    return sum(not ok for ok, _ in outcomes), encodes


def _load_phase(args, replicas, candidates: list[str], ref_ids: list[str]) -> tuple[list[tuple[bool, float]], float]:
    """Clients split over the replicas, each candidate sent to one replica only; (outcomes, seconds)."""

    def job(i: int) -> tuple[bool, float]:
        replica = replicas[(i % args.clients) * len(replicas) // args.clients]
        r = replicas.index(replica)
        if args.search_every and i % args.search_every == args.search_every - 1:
            return _post(replica, "/v1/search", {"text": QUERIES[i % len(QUERIES)], "k": 2})
        mine = [c for c in range(len(candidates)) if c % len(replicas) == r] or [0]
        pair = [ref_ids[i % len(ref_ids)], ref_ids[(i + 1) % len(ref_ids)]]
        return _post(replica, "/v1/compare", {"candidate": candidates[mine[i % len(mine)]], "criteria": RUBRIC,
                                              "ref_ids": pair})

    started = time.perf_counter()
    with ThreadPoolExecutor(args.clients) as pool:
        load = list(pool.map(job, range(args.requests)))
    return load, time.perf_counter() - started


def _start_replicas(args, work: Path, services: _Services) -> list:
    from replica_helpers import Replica

    extra = ("--redis", services.cache) if services.cache else ()
    replicas = [Replica(chr(ord("a") + n), work / "blobs", services.catalog, work / f"local-{n}",
                        model=args.model, workers=args.workers, extra=extra) for n in range(args.replicas)]
    try:
        with ThreadPoolExecutor(len(replicas)) as pool:
            list(pool.map(lambda r: r.start(timeout=600), replicas))
    except BaseException:
        for replica in replicas:
            replica.stop()
        raise
    return replicas


def _tier_share(stats: list[dict], cached: bool) -> dict[str, float]:
    """The share of package lookups each tier served, summed over replicas (an encode is a miss everywhere)."""
    tiers = {name: sum(s.get(f"{name}_hits", 0) for s in stats) for name in ("memory", "redis", "disk")}
    tiers = {name: n for name, n in tiers.items() if cached or name != "redis"}
    tiers["encode"] = int(sum(s["misses"] for s in stats))
    lookups = sum(tiers.values()) or 1
    return {name: round(n / lookups, 4) for name, n in tiers.items()}


def run(args) -> int:
    """Run the replicas benchmark for ``serve_load.py``'s parsed ``args``; prints one JSON line."""
    work = Path(args.store or tempfile.mkdtemp(prefix="refsight-replicas-"))
    total = args.references + args.candidates
    images = [_variant_b64(i, args.size) for i in range(total)]
    references, candidates = images[: args.references], images[args.references :]
    ref_ids = [f"ref{i}" for i in range(args.references)]
    with _Services(args.catalog, getattr(args, "cache", None)) as services:
        print(f"replicas: {args.replicas}, catalog {services.catalog}, blobs {work / 'blobs'}; {total} images",
              file=sys.stderr)
        replicas = _start_replicas(args, work, services)
        try:
            add_errors, add_s = _add_phase(replicas, references, ref_ids)
            proof_errors, proof_b_encodes = _proof_phase(replicas[1], references, ref_ids)
            load, elapsed = _load_phase(args, replicas, candidates, ref_ids)
            stats = [r.stats()["replica"] for r in replicas]
        finally:
            for replica in replicas:
                replica.stop()
    latencies = [ms for _, ms in load]
    figures = {
        "replicas": args.replicas,
        "references": args.references,
        "requests": len(load),
        "errors": add_errors + proof_errors + sum(not ok for ok, _ in load),
        "rps": round(len(load) / elapsed, 3),
        "p50_ms": round(statistics.median(latencies), 1),
        "p99_ms": round(_percentile(latencies, 0.99), 1),
        "encodes": int(sum(s["misses"] for s in stats)),
        "distinct_images": len(set(images)),
        "encodes_per_replica": [int(s["misses"]) for s in stats],
        "proof_b_encodes": proof_b_encodes,
        "tier_share": _tier_share(stats, bool(services.cache)),
        "add_s": round(add_s, 2),
        "clients": args.clients,
        "model": args.model,
        "cache": "redis" if services.cache else None,
    }
    print(json.dumps(figures), flush=True)
    ok = figures["errors"] == 0 and figures["encodes"] == figures["distinct_images"] and proof_b_encodes == 0
    return 0 if ok else 1
