"""Replicas sharing one store: `refsight serve` processes, one PostgreSQL catalog, one blob directory.

Real processes on loopback ports, a real PostgreSQL server (tests/services.py). Encodes are
counted by each replica itself (``/v1/stats`` → ``replica.misses``: every package the
encoder produced in that process).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from runtimes import require_module
from live_server import assert_error, data_url
from replica_helpers import Replica, b64, noise_png

from refsight.store import open_store

RUBRIC = "same colours\nsame texture"


@pytest.fixture
def deployment(tmp_path, postgres_server):
    """``start(name, model=...)`` starts a replica on the shared catalog and blob directory."""
    require_module("psycopg", "pip install 'refsight[postgres]'")
    url = postgres_server.create_database()
    replicas: list[Replica] = []

    def start(name: str, *, model: str = "toy", catalog: str | None = None) -> Replica:
        replica = Replica(name, tmp_path / "blobs", catalog or url, tmp_path / f"local-{name}", model=model)
        replicas.append(replica)
        return replica.start()

    start.url = url
    start.blobs = tmp_path / "blobs"
    yield start
    for replica in replicas:
        replica.stop()
    postgres_server.drop_database(url)


def _add(replica: Replica, i: int) -> int:
    with replica.client() as client:
        return client.post("/v1/references", json={"image": b64(noise_png(i)), "id": f"r{i}"}).status_code


def _assert_no_database_in(blobs) -> None:
    found = [p.name for p in blobs.rglob("*") if p.suffix in (".db", ".sqlite", ".sqlite3", ".db-wal")]
    assert found == [], f"the shared blob directory holds databases: {found}"


@pytest.mark.slow
def test_what_one_replica_encoded_the_other_never_encodes(deployment):
    a = deployment("a", model="tiny-qwen2-vl")
    b = deployment("b", model="tiny-qwen2-vl")
    # 1. Both replicas add the same new images at the same moment: each is encoded once in all.
    with ThreadPoolExecutor(8) as pool:
        statuses = list(pool.map(lambda job: _add(*job), [(r, i) for i in range(4) for r in (a, b)]))
    assert statuses == [201] * 8
    # 2. More references, through replica A only.
    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(lambda i: _add(a, i), range(4, 12))) == [201] * 8
    encoded = a.stats()["replica"]["misses"] + b.stats()["replica"]["misses"]
    assert encoded == 12, "one encode per distinct image across both replicas"
    before = b.stats()["replica"]["misses"]
    # 3. Replica B sees every reference and compares against them without encoding anything.
    with b.client() as client:
        assert len(client.get("/v1/references").json()["references"]) == 12
        for i in range(3):
            body = {"candidate": b64(noise_png(i)), "criteria": RUBRIC, "ref_ids": [f"r{j}" for j in range(4 * i, 4 * i + 4)]}
            response = client.post("/v1/compare", json=body)
            assert response.status_code == 200, response.text
            assert len(response.json()["results"]) == 4
    stats = b.stats()
    assert stats["replica"]["misses"] == before, "replica B encoded something replica A had encoded"
    assert stats["replica"]["hits"] > 0 and stats["references"] == 12 and stats["packages"] == 12
    # 4. B's own retrieval index follows the catalog's change journal: a removal through A shows in B.
    with b.client() as client:
        found = client.post("/v1/search", json={"text": "a pattern", "k": 12}).json()["results"]
        assert sorted(hit["ref_id"] for hit in found) == sorted(f"r{i}" for i in range(12))
        with a.client() as other:
            assert other.delete("/v1/references/r11").status_code == 200
        found = client.post("/v1/search", json={"text": "a pattern", "k": 12}).json()["results"]
        assert sorted(hit["ref_id"] for hit in found) == sorted(f"r{i}" for i in range(11))
    _assert_no_database_in(deployment.blobs)


def test_postgres_stopped_answers_503_fast_and_comes_back_without_a_restart(tmp_path, private_postgres):
    url = private_postgres.create_database()
    replica = Replica("a", tmp_path / "blobs", url, tmp_path / "local-a").start()
    try:
        with replica.client() as client:
            for i in range(3):
                assert _add(replica, i) == 201
            # A compared image: its package is now in this replica's memory.
            candidate = noise_png(100)
            body = {"candidate": b64(candidate), "criteria": RUBRIC, "ref_ids": ["r0", "r1"]}
            assert client.post("/v1/compare", json=body).status_code == 200
            chat = {"model": "toy", "messages": [{"role": "user", "content": [
                {"type": "text", "text": "describe"}, {"type": "image_url", "image_url": {"url": data_url(candidate)}}]}]}
            assert client.post("/v1/chat/completions", json=chat).status_code == 200

            private_postgres.stop()
            for method, path, payload in (
                ("POST", "/v1/references", {"image": b64(noise_png(3)), "id": "r3"}),
                ("GET", "/v1/references", None),
                ("POST", "/v1/compare", body),
            ):
                started = time.monotonic()
                response = client.request(method, path, json=payload)
                elapsed = time.monotonic() - started
                error = assert_error(response, 503, "store_unavailable")
                assert "catalog" in error["message"] and elapsed < 10, (path, elapsed, error)
            # What this replica already holds still serves: a chat about the loaded image.
            response = client.post("/v1/chat/completions", json=chat)
            assert response.status_code == 200, response.text

            private_postgres.start()
            assert _add(replica, 3) == 201  # the same process: no restart needed
            ids = [r["ref_id"] for r in client.get("/v1/references").json()["references"]]
            assert ids == ["r0", "r1", "r2", "r3"]
            assert client.post("/v1/compare", json=body).status_code == 200
    finally:
        replica.stop()


def test_a_replica_killed_in_the_middle_of_100_adds_loses_nothing(tmp_path, deployment):
    a = deployment("a")
    b = deployment("b")
    done: list[int] = []
    lock = threading.Lock()

    def add(i: int) -> None:
        try:
            if _add(a, i) == 201:
                with lock:
                    done.append(i)
        except Exception:  # noqa: BLE001 - the replica is killed under these requests
            pass

    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(add, i) for i in range(100)]
        deadline = time.monotonic() + 120
        while len(done) < 30 and time.monotonic() < deadline:
            time.sleep(0.01)
        a.kill()
        for future in futures:
            future.result()
    assert 30 <= len(done) < 100, len(done)
    # The other replica finishes the work: what A committed is there, the rest is added now.
    with ThreadPoolExecutor(4) as pool:
        assert set(pool.map(lambda i: _add(b, i), range(100))) == {201}
    with b.client() as client:
        refs = client.get("/v1/references").json()["references"]
    assert sorted(r["ref_id"] for r in refs) == sorted(f"r{i}" for i in range(100))
    assert all(r["packages"] for r in refs), "every reference has its package"
    # verify (another process, as an operator runs it): no torn package, no reference without its image.
    from refsight.cli import main

    assert main(["--store", str(deployment.blobs), "--catalog", deployment.url, "--local-dir",
                 str(tmp_path / "local-verify"), "verify", "--model", "toy", "--json"]) == 0
    with open_store(deployment.blobs, catalog=deployment.url, local_dir=tmp_path / "local-check") as store:
        problems = [problem for _, problem in store.local.verify_all() if problem]
        assert problems == []
        for ref in store.catalog.list_references():
            assert store.catalog.get_image(ref.image_sha256)
    _assert_no_database_in(deployment.blobs)
