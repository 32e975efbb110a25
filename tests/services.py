"""Real PostgreSQL and Redis servers for the tests: throwaway data directories, loopback ports.

`.ci/services` installs the distribution's packages; these helpers start private servers from
those binaries (never the system's own instances), and stop them and delete their data at the
end. A test that needs one and finds no binary skips, saying which, or fails in strict mode
(``CI=true``: see ``runtimes.py``). ``$REFSIGHT_PG_BIN`` and ``$REFSIGHT_REDIS_SERVER`` point at
other binaries.

Fixtures (imported by ``tests/conftest.py``):

- ``postgres_server``: one PostgreSQL server for the session;
- ``postgres``: a fresh, empty database on it for one test (its URL), dropped afterwards;
- ``private_postgres``: a server of the test's own, which the test may stop and start (faults);
- ``redis_server``: a Redis server of the test's own (``.url``, ``.stop()``, ``.start()``).
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
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
]

PG_BIN = Path(os.environ.get("REFSIGHT_PG_BIN", "/usr/lib/postgresql/15/bin"))
REDIS_SERVER = os.environ.get("REFSIGHT_REDIS_SERVER") or shutil.which("redis-server") or "/usr/bin/redis-server"
#: How the tests' PostgreSQL client is installed (the postgres extra).
PSYCOPG_INSTALL = "pip install 'refsight[postgres]'"


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
