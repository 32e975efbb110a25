"""A fleet without a shared disk: three ``refsight serve`` replicas with NO directory in common (each its own
``--local-dir``) on one PostgreSQL, one Redis and one bucket (SeaweedFS; tests/services.py).

References added through one replica are served cached by the others (from Redis, or with Redis
emptied from the bucket); every replica restarted, nothing is encoded again. The object store hung
(SIGSTOP) under one replica and down under another, request by request: what a replica holds (its
disk, Redis) answers, images sent inline are encoded and answered (a remembered one too), compares
and searches answer; what needs the bucket (an add, a reference only the bucket holds) is a 503
``store_unavailable`` naming the bucket, with the bucket's back-off as Retry-After; no request loses
more than one short timeout; back, the bucket serves again by itself. The replicas run without a
memory tier (``[store] memory_bytes = 0`` in each one's own config file), so every reference lookup
reaches a shared tier or the local disk, and remember every inline image (``remember_images = "all"``).
A hybrid model's reference-prefix state goes through the bucket too (two stores, in process).
"""

from __future__ import annotations

import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from live_server import assert_error, data_url
from runtimes import require_module
from replica_helpers import Replica, add_references, b64, compare_all, noise_png

redis = require_module("redis", "pip install 'refsight[redis]'")
require_module("psycopg", "pip install 'refsight[postgres]'")
require_module("boto3", "pip install 'refsight[s3]'")

N = 8
#: The bucket's read timeout (ObjectStore's default): the most an outage may cost one request.
TIMEOUT_S = 2.0


def _replicas(tmp_path, url: str, catalog: str, redis_url: str) -> list[Replica]:
    replicas = []
    for name in ("a", "b", "c"):
        own = tmp_path / name  # everything of this replica, and nothing of the others
        own.mkdir()
        (own / "refsight.toml").write_text('[store]\nmemory_bytes = 0\nremember_images = "all"\n')
        replicas.append(Replica(name, url, catalog, own / "local", extra=(
            "--redis", redis_url, "--config", str(own / "refsight.toml"))))
    return replicas


def _restart(replicas: list[Replica]) -> None:
    for replica in replicas:
        replica.stop()
    with ThreadPoolExecutor(len(replicas)) as pool:
        list(pool.map(lambda r: r.start(), replicas))


def _chat(replica: Replica, image_url: str) -> httpx.Response:
    content = [{"type": "text", "text": "Describe."}, {"type": "image_url", "image_url": {"url": image_url}}]
    with replica.client() as client:
        return client.post("/v1/chat/completions", json={"model": "toy", "max_tokens": 2,
                                                          "messages": [{"role": "user", "content": content}]})


def _add(replica: Replica, i: int) -> httpx.Response:
    with replica.client() as client:
        return client.post("/v1/references", json={"image": b64(noise_png(i)), "id": f"r{i}"})


def _search(replica: Replica) -> httpx.Response:
    with replica.client() as client:
        return client.post("/v1/search", json={"text": "a pattern", "k": 3})


def _unavailable(response: httpx.Response, url: str) -> None:
    """A 503 store_unavailable that names the bucket, with the bucket's back-off as Retry-After."""
    error = assert_error(response, 503, "store_unavailable")
    assert url in error["message"] and 1 <= int(response.headers["Retry-After"]) <= 30, (error, response.headers)


def _answers_through_an_outage(replica: Replica, remembered: bytes, url: str, round_: int) -> None:
    """Request by request, with the bucket away: each answered as decided, none losing more than one timeout."""
    timed = []

    def timed_call(call):
        started = time.monotonic()
        response = call()
        timed.append(time.monotonic() - started)
        return response

    def answered(call) -> None:
        response = timed_call(call)
        assert response.status_code == 200, (replica.name, response.text, replica.output())

    # An image sent inline, new: its durable write fails (a HEAD first: the reads' timeout), it is answered
    answered(lambda: _chat(replica, data_url(noise_png(600 + round_))))
    answered(lambda: _chat(replica, "refsight://ref/r0"))  # on this replica's disk
    # Remembered by another replica, only in the bucket: encoded again and answered, never a 503
    answered(lambda: _chat(replica, data_url(remembered)))
    assert timed_call(lambda: compare_all(replica, N, round_)) == [200, 200]
    answered(lambda: _search(replica))
    _unavailable(timed_call(lambda: _add(replica, N + 1 + round_)), url)  # its durable write cannot happen
    _unavailable(timed_call(lambda: _chat(replica, f"refsight://ref/r{N}")), url)  # only the bucket holds it
    assert max(timed) < 2 * TIMEOUT_S, timed  # one timeout at most (two would be 2 * TIMEOUT_S)


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
        assert add_references(a, N) == [201] * N

        # B reads every reference from Redis, C (Redis emptied) from the bucket: not one encoded again
        assert compare_all(b, N, 0) == [200, 200]
        assert b.stats()["replica"]["misses"] == 2 and b.stats()["tiers"]["redis"]["hits"] == N  # candidates only
        keys.flushall()
        assert compare_all(c, N, 0) == [200, 200]
        stats = c.stats()
        assert stats["replica"]["misses"] == 2 and stats["tiers"]["bucket"]["hits"] == N

        # Every replica restarted: each serves every reference cached (its own disk, Redis or the bucket)
        _restart(replicas)
        for round_, replica in enumerate(replicas, start=1):
            assert compare_all(replica, N, round_) == [200, 200]
            assert replica.stats()["replica"]["misses"] == 2, replica.name

        # A remembers an image sent inline and adds one reference more. B and C read the N references from the bucket
        # onto their own disks (a Redis hit is no disk write) and index the new one for search (from its kept image);
        # Redis emptied: they hold the N on their disks alone, and the bucket alone holds the new package and image.
        # Then the object store hangs under B, and is down under C.
        remembered = noise_png(500)
        assert _chat(a, data_url(remembered)).status_code == 200 and _add(a, N).status_code == 201
        keys.flushall()
        assert compare_all(b, N, 4) == compare_all(c, N, 5) == [200, 200]
        assert _search(b).status_code == _search(c).status_code == 200
        keys.flushall()
        weed = s3_server._proc.pid
        os.kill(weed, signal.SIGSTOP)  # accepts connections, answers nothing
        try:
            _answers_through_an_outage(b, remembered, url, 10)
        finally:
            os.kill(weed, signal.SIGCONT)
        s3_server.stop()
        try:
            _answers_through_an_outage(c, remembered, url, 11)
        finally:
            s3_server.start()
        deadline = time.monotonic() + 30
        while (response := _chat(c, f"refsight://ref/r{N}")).status_code != 200:  # a probe rides on a request
            assert response.status_code == 503 and time.monotonic() < deadline, response.text
            time.sleep(0.5)
        assert c.stats()["tiers"]["bucket"]["available"] is True
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
