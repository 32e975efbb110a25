"""A fleet without a shared disk: three ``refsight serve`` replicas with NO directory in common (each its own
``--local-dir``) on one PostgreSQL, one Redis and one bucket (SeaweedFS; tests/services.py).

References added through one replica are served cached by the others (from Redis, or with Redis
emptied from the bucket); every replica restarted, nothing is encoded again; the object store stopped
mid-run, no request fails. The replicas run without a memory tier (``[store] memory_bytes = 0`` in
each one's own config file), so every reference lookup reaches a shared tier or the local disk.
A hybrid model's reference-prefix state goes through the bucket too (two stores, in process).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from runtimes import require_module
from replica_helpers import Replica, b64, noise_png

redis = require_module("redis", "pip install 'refsight[redis]'")
require_module("psycopg", "pip install 'refsight[postgres]'")
require_module("boto3", "pip install 'refsight[s3]'")

RUBRIC = "same colours\nsame texture"
N = 8


def _compare_all(replica: Replica, round_: int) -> list[int]:
    """Two compares covering every reference once; new candidates each round (memory holds none)."""
    statuses = []
    with replica.client() as client:
        for first in range(0, N, 4):
            body = {"candidate": b64(noise_png(1000 + 100 * round_ + first)), "criteria": RUBRIC,
                    "ref_ids": [f"r{first + j}" for j in range(4)]}
            statuses.append(client.post("/v1/compare", json=body).status_code)
    return statuses


def _replicas(tmp_path, url: str, catalog: str, redis_url: str) -> list[Replica]:
    replicas = []
    for name in ("a", "b", "c"):
        own = tmp_path / name  # everything of this replica, and nothing of the others
        own.mkdir()
        (own / "refsight.toml").write_text("[store]\nmemory_bytes = 0\n")
        replicas.append(Replica(name, url, catalog, own / "local", extra=(
            "--redis", redis_url, "--config", str(own / "refsight.toml"))))
    return replicas


def _restart(replicas: list[Replica]) -> None:
    for replica in replicas:
        replica.stop()
    with ThreadPoolExecutor(len(replicas)) as pool:
        list(pool.map(lambda r: r.start(), replicas))


@pytest.mark.slow
def test_three_replicas_with_no_directory_in_common_share_one_bucket(
    tmp_path, monkeypatch, postgres_server, redis_server, s3_server,
):
    for name, value in s3_server.env.items():
        monkeypatch.setenv(name, value)  # the replicas' environment: how every S3 tool is configured
    url, catalog = s3_server.bucket(), postgres_server.create_database()
    replicas = _replicas(tmp_path, url, catalog, redis_server.url)
    keys = redis.Redis.from_url(redis_server.url)
    try:
        with ThreadPoolExecutor(3) as pool:
            a, b, c = pool.map(lambda r: r.start(), replicas)
        with a.client() as client, ThreadPoolExecutor(4) as pool:
            statuses = list(pool.map(
                lambda i: client.post("/v1/references", json={"image": b64(noise_png(i)), "id": f"r{i}"}).status_code,
                range(N)))
        assert statuses == [201] * N

        # B reads every reference from Redis, C (Redis emptied) from the bucket: not one encoded again
        assert _compare_all(b, 0) == [200, 200]
        assert b.stats()["replica"]["misses"] == 2 and b.stats()["tiers"]["redis"]["hits"] == N  # candidates only
        keys.flushall()
        assert _compare_all(c, 0) == [200, 200]
        stats = c.stats()
        assert stats["replica"]["misses"] == 2 and stats["tiers"]["bucket"]["hits"] == N

        # Every replica restarted: each serves every reference cached (its own disk, Redis or the bucket)
        _restart(replicas)
        for round_, replica in enumerate(replicas, start=1):
            assert _compare_all(replica, round_) == [200, 200]
            assert replica.stats()["replica"]["misses"] == 2, replica.name

        # The object store stopped mid-run: no request fails
        s3_server.stop()
        try:
            for round_, replica in enumerate(replicas, start=10):
                assert _compare_all(replica, round_) == [200, 200], replica.output()
                assert replica.stats()["replica"]["misses"] == 4, replica.name
        finally:
            s3_server.start()
    finally:
        for replica in replicas:
            replica.stop()
        postgres_server.drop_database(catalog)


@pytest.mark.slow
def test_a_hybrid_models_reference_state_is_shared_through_the_bucket(tmp_path, monkeypatch, load, postgres, s3_server):
    """Qwen3.5's hybrid state (Gated DeltaNet convolution and recurrent states, attention KV) built by one
    replica's store is read by another's from the bucket, and answers exactly as the fresh path."""
    from refsight.inputs.images import load_image
    from refsight.judge.prompts import reference_prefix
    from refsight.cache.prefix_states import PrefixStateCache
    from refsight.requests import GenerationRequest
    from refsight.samples import load_sample
    from refsight.store import open_store

    for name, value in s3_server.env.items():
        monkeypatch.setenv(name, value)
    url = s3_server.bucket()
    backend = load("tiny-qwen3.5")
    photos = [load_image(load_sample(n, size), name=n) for n, size in (("chelsea", (96, 72)), ("coffee", (88, 64)),
                                                                        ("rocket", (64, 96)))]
    *refs, candidate = backend.encode(photos)

    def request(rubric: str, cache) -> GenerationRequest:
        prefix = reference_prefix(refs)
        return GenerationRequest([*prefix, "Candidate:", candidate, "\n", rubric], max_new_tokens=4,
                                 prefix_segments=len(prefix), prefix_cache=cache)

    with open_store(url, catalog=postgres, local_dir=tmp_path / "a") as a, \
            open_store(url, catalog=postgres, local_dir=tmp_path / "b") as b:
        backend.generate([request("Same colours?", PrefixStateCache(a))])
        assert [e.name.split("/")[0] for e in a.bucket.listing("prefixes/")] == ["prefixes"]
        shared = backend.generate([request("Same texture?", PrefixStateCache(b))])[0]
        fresh = backend.generate([request("Same texture?", None)])[0]
        counters = b.counters.totals()  # this replica's own (the catalog's are the fleet's)
    assert shared.prefix_tokens_reused > 0 and shared.token_ids == fresh.token_ids
    assert counters.get("prefix_hits") == 1 and not counters.get("prefix_misses")
