"""The Redis tier against a real Redis server (tests/services.py): tier order, checksummed values,
maxmemory LRU eviction, and outages (stopped, hung) that never fail a read.

The tier order is process memory → Redis → disk; these tests run with a memory tier of 0 bytes so
that every read reaches Redis.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
from runtimes import require_module
from store_helpers import make_package

from refsight.errors import InvalidInputError, StoreError
from refsight.store import open_store
from refsight.store.redis_tier import KEY_PREFIX, RedisPackageStore

pytestmark = pytest.mark.slow  # starts and stops real Redis servers

redis = require_module("redis", "pip install 'refsight[redis]'")

from services import RedisServer  # noqa: E402


def _client(server) -> "redis.Redis":
    return redis.Redis.from_url(server.url)


def _same(a, b) -> bool:
    return a.key == b.key and a.spec == b.spec and all(a.tensors[n].equal(b.tensors[n]) for n in a.tensors)


def test_tier_order_memory_then_redis_then_disk_with_counts(tmp_path, redis_server):
    package = make_package(1)
    with open_store(tmp_path / "s", memory_bytes=1 << 20, redis=redis_server.url) as store:
        assert [t.name for t in store.packages.tiers] == ["memory", "redis", "disk"]
        store.packages.put(package)  # disk, then Redis, then memory
        assert _client(redis_server).exists(KEY_PREFIX + package.key) == 1
        assert store.packages.get(package.key) is not None  # memory
        store.memory.clear()
        assert _same(store.packages.get(package.key), package)  # Redis, promoted to memory
        store.memory.clear()
        _client(redis_server).flushall()
        assert _same(store.packages.get(package.key), package)  # disk, promoted to Redis and memory
        assert _client(redis_server).exists(KEY_PREFIX + package.key) == 1
        tiers = store.packages.tier_stats()
    assert (tiers["memory"]["hits"], tiers["redis"]["hits"], tiers["disk"]["hits"]) == (1, 1, 1)
    assert (tiers["memory"]["misses"], tiers["redis"]["misses"], tiers["disk"]["misses"]) == (2, 1, 0)
    assert tiers["redis"]["bytes"] == package.nbytes and tiers["redis"]["available"] is True
    assert tiers["redis"]["version"].split(".")[0] >= "7" and tiers["redis"]["writes"] == 2


@pytest.mark.parametrize("damage", ["flip", "truncate", "other_key", "garbage"])
def test_a_corrupt_value_is_a_miss_deleted_and_refilled_from_disk(tmp_path, redis_server, damage):
    package, other = make_package(1), make_package(2)
    client = _client(redis_server)
    with open_store(tmp_path / "s", memory_bytes=0, redis=redis_server.url) as store:
        store.packages.put(package)
        store.packages.put(other)
        name = KEY_PREFIX + package.key
        value = bytearray(client.get(name))
        if damage == "flip":
            value[-7] ^= 0x10  # one bit in the tensor bytes
        elif damage == "truncate":
            value = value[: len(value) // 2]
        elif damage == "other_key":
            value = bytearray(client.get(KEY_PREFIX + other.key))  # a good value, under the wrong key
        else:
            value = bytearray(b"not a package")
        client.set(name, bytes(value))
        loaded = store.packages.get(package.key)
        assert _same(loaded, package)  # served from disk, never the bad value
        tiers = store.packages.tier_stats()
        assert tiers["redis"]["corrupt"] == 1 and tiers["redis"]["hits"] == 0 and tiers["disk"]["hits"] == 1
        # deleted, then refilled with a good value by the disk hit's promotion
        assert _same(store.redis.get(package.key), package)


def test_maxmemory_lru_evictions_are_misses_served_from_disk(tmp_path):
    server = RedisServer(maxmemory="2mb")  # allkeys-lru; ~1 MB is Redis's own
    try:
        # 40 packages of ~130 KB: far more than Redis may keep
        packages = [make_package(n, tokens=1024, dims=64) for n in range(40)]
        with open_store(tmp_path / "s", memory_bytes=0, redis=server.url) as store:
            for package in packages:
                store.packages.put(package)
            held = _client(server).dbsize()
            assert 0 < held < len(packages)
            for package in packages:
                assert _same(store.packages.get(package.key), package)
            tiers = store.packages.tier_stats()
        assert tiers["redis"]["misses"] >= len(packages) - held and tiers["disk"]["hits"] == tiers["redis"]["misses"]
        assert tiers["redis"]["maxmemory_policy"] == "allkeys-lru" and tiers["redis"]["errors"] == 0
    finally:
        server.close()


def test_redis_stopped_mid_run_fails_no_read_backs_off_and_refills_when_back(tmp_path, redis_server):
    packages = [make_package(n) for n in range(8)]
    failures: list[BaseException] = []
    served = [0]
    stop = threading.Event()
    with open_store(tmp_path / "s", memory_bytes=0, redis=redis_server.url) as store:
        for package in packages:
            store.packages.put(package)

        def reader() -> None:
            while not stop.is_set():
                for package in packages:
                    try:
                        assert _same(store.packages.get(package.key), package)
                        served[0] += 1
                    except BaseException as exc:  # noqa: BLE001 - any failure is the test's failure
                        failures.append(exc)

        threads = [threading.Thread(target=reader) for _ in range(3)]
        for t in threads:
            t.start()
        try:  # the readers stop before the store closes, whatever fails: a failure is reported, not raced
            time.sleep(0.3)
            redis_server.stop()
            time.sleep(1.5)  # ~3 back-off rounds
            down = store.redis.tier_info()
            # At least one outage: Redis may answer once more while it shuts down (a probe that succeeds
            # between two failures), which counts two (CI, stop 60: errors 3, skipped 5024, outages 2).
            assert down["available"] is False and down["outages"] >= 1, down
            # a back-off, not one failed call per read: most reads never touched the network
            assert down["skipped"] > 10 * down["errors"], down
            redis_server.start()
            deadline = time.monotonic() + 10
            while not store.redis.available and time.monotonic() < deadline:
                time.sleep(0.1)
            time.sleep(0.3)
        finally:
            stop.set()
            for t in threads:
                t.join()
        assert not failures, failures[:3]
        assert store.redis.available
        # Redis came back empty (no persistence): reads refilled it, and then hit it
        assert _client(redis_server).dbsize() == len(packages)
        hits_before = store.packages.tier_stats()["redis"]["hits"]
        for package in packages:
            store.packages.get(package.key)
        assert store.packages.tier_stats()["redis"]["hits"] == hits_before + len(packages)
    assert served[0] > 0


def test_a_hung_redis_costs_one_short_timeout_then_nothing(tmp_path, redis_server):
    package = make_package(1)
    with open_store(tmp_path / "s", memory_bytes=0, redis=redis_server.url) as store:
        store.packages.put(package)
        os.kill(redis_server._proc.pid, signal.SIGSTOP)  # accepts nothing, answers nothing
        try:
            start = time.perf_counter()
            assert _same(store.packages.get(package.key), package)
            first = time.perf_counter() - start
            for _ in range(20):
                assert _same(store.packages.get(package.key), package)
        finally:
            os.kill(redis_server._proc.pid, signal.SIGCONT)
        assert first < 2.0  # one socket timeout (0.25 s), not the client's default 5 s with retries
        info = store.redis.tier_info()
        assert info["errors"] == 1 and info["skipped"] >= 20  # the next reads never waited on Redis


def test_an_unreachable_redis_at_open_is_an_outage_and_a_bad_url_an_error(tmp_path, redis_server):
    port = redis_server.port
    redis_server.stop()
    package = make_package(1)
    with open_store(tmp_path / "s", memory_bytes=0, redis=f"redis://127.0.0.1:{port}/0") as store:
        assert store.redis.available is False
        store.packages.put(package)
        assert _same(store.packages.get(package.key), package)
    with pytest.raises(InvalidInputError, match="Redis URL"):
        open_store(tmp_path / "t", redis="http://127.0.0.1:6379")
    with pytest.raises(InvalidInputError, match="Redis URL"):
        RedisPackageStore("127.0.0.1:6379")


def test_the_redis_password_never_shows(tmp_path, redis_server):
    tier = RedisPackageStore(f"redis://user:s3cret@127.0.0.1:{redis_server.port}/0")
    try:
        assert "s3cret" not in tier.url and "s3cret" not in repr(tier.tier_info())
    finally:
        tier.close()


class _OldRedis:
    """A loopback socket that answers like a Redis 6 server (no Redis 6 runs here): PING, INFO, CONFIG."""

    def __init__(self, version: str = "6.2.14") -> None:
        import socket

        self.version = version
        self._server = socket.socket()
        self._server.bind(("127.0.0.1", 0))
        self._server.listen()
        self.port = self._server.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._session, args=(conn,), daemon=True).start()

    def _session(self, conn) -> None:
        reader = conn.makefile("rb")
        with conn:
            while True:
                line = reader.readline()
                if not line:
                    return
                words = []
                for _ in range(int(line[1:])):
                    size = int(reader.readline()[1:])
                    words.append(reader.read(size + 2)[:-2].decode().upper())
                if words[0] == "HELLO":  # the client's handshake (RESP3 map)
                    proto = words[1] if len(words) > 1 else "3"
                    conn.sendall(f"%3\r\n$6\r\nserver\r\n$5\r\nredis\r\n$7\r\nversion\r\n${len(self.version)}\r\n"
                                 f"{self.version}\r\n$5\r\nproto\r\n:{proto}\r\n".encode())
                elif words[0] == "INFO":
                    text = f"# Server\r\nredis_version:{self.version}\r\n"
                    conn.sendall(f"${len(text)}\r\n{text}\r\n".encode())
                elif words[0] == "PING":
                    conn.sendall(b"+PONG\r\n")
                elif words[0] == "CONFIG":
                    conn.sendall(b"%1\r\n$16\r\nmaxmemory-policy\r\n$11\r\nallkeys-lru\r\n")
                else:
                    conn.sendall(b"+OK\r\n")

    def close(self) -> None:
        self._server.close()


def test_a_redis_older_than_7_is_refused_at_open_naming_the_version(tmp_path):
    old = _OldRedis()
    try:
        with pytest.raises(StoreError, match=r"Redis 6\.2\.14; refsight needs Redis >= 7"):
            open_store(tmp_path / "s", redis=f"redis://127.0.0.1:{old.port}/0")
    finally:
        old.close()
