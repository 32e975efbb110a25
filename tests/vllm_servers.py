"""The vLLM venv and real vLLM servers, for every test marked ``vllm`` (imported by ``tests/conftest.py``).

Everything goes through refsight's own commands, as a user would run them:
``refsight vllm-env --json`` builds (or reuses) the venv; ``refsight vllm-serve
MODEL --json`` starts a server and prints its URL; SIGTERM stops it. When the venv
cannot be built (no network, unsupported platform) every test that needs it is skipped
with the reason, and fails in strict mode (``CI=true``: ``tests/runtimes.py``).

Servers are the slow part (about half a minute each on two CPU cores), so a session
pool starts each (model, image limit) once and keeps at most ``MAX_LIVE`` alive,
stopping the least recently used when another is needed; test files and family
parameters are ordered so that each server starts once, and the benchmark smoke tests
(``tests/benchmarks``, collected after ``tests/backends/vllm``) reuse the server those
tests leave running. A test that knows which server comes next asks for it early
(:meth:`ServerPool.prefetch`): a start is one busy core for half a minute, so it runs on the
second core while the test works with the server it has.

Fixtures: ``vllm_python`` (the venv's interpreter) and ``vllm_servers`` (the pool).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import OrderedDict
from pathlib import Path

import pytest
from runtimes import require_runtime

#: Servers alive at once (one in use, the others starting or kept): about 2.5 GB each, 1 GiB of it KV cache.
MAX_LIVE = 3
START_TIMEOUT_S = 900


def _refsight(*args: str) -> list[str]:
    return [sys.executable, "-m", "refsight.cli", *args]


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    """The vLLM venv's python, from ``refsight vllm-env --json``; skips (strict mode: fails) when it cannot be built."""
    proc = subprocess.run(_refsight("vllm-env", "--json"), capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        require_runtime("the vLLM environment", f"refsight vllm-env failed: {(proc.stderr or proc.stdout)[-800:]}")
    return Path(json.loads(proc.stdout.strip().splitlines()[-1])["python"])


class Server:
    """One ``refsight vllm-serve`` process and the URL it printed (``store``: with refsight's encoder-cache connector;
    a bucket's ``s3://`` URL with ``local_dir``, the server's own folder).

    Constructing it launches the command; :meth:`ready` waits for the URL (at once for a server in use)."""

    def __init__(self, model: str, image_limit: int, log_dir: Path, store: Path | str | None = None,
                 vllm_args: tuple[str, ...] = (), local_dir: Path | None = None) -> None:
        self.model, self.image_limit, self.store = model, image_limit, store
        self.log = log_dir / f"vllm-{model}-{image_limit}-{time.monotonic_ns()}.log"
        self.began = time.monotonic()
        self.url: str | None = None
        self.pid: int | None = None
        extra = [] if store is None else ["--store", str(store)]
        extra += ["--local-dir", str(local_dir)] if local_dir is not None else []
        extra += ["--vllm-args", " ".join(vllm_args)] if vllm_args else []
        with open(self.log, "w") as log:
            self.process = subprocess.Popen(
                _refsight("vllm-serve", model, "--image-limit", str(image_limit), "--json", *extra),
                stdout=subprocess.PIPE, stderr=log, text=True,
            )

    def ready(self) -> "Server":
        """This server once it answers: the first call blocks until ``vllm-serve`` prints its URL (or fails)."""
        if self.url is not None:
            return self
        line = self.process.stdout.readline()
        if not line:
            self.process.wait(30)
            raise RuntimeError(f"vllm-serve {self.model} failed ({self.process.returncode}): {self.log.read_text()[-3000:]}")
        info = json.loads(line)
        self.url, self.pid = info["url"], info["pid"]
        self.start_s = time.monotonic() - self.began
        return self

    def stop(self) -> None:
        """SIGTERM to ``vllm-serve``; it must exit 0 and take the whole vLLM process group with it
        (one still starting, never asked for, stops its vLLM group itself: ``start_server``'s ``cancel``)."""
        self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(120)
        if self.pid is None and code == -signal.SIGTERM:
            return  # signalled before it set its handlers, so before it started vLLM
        assert code == 0, f"vllm-serve exited {code}: {self.log.read_text()[-2000:]}"
        if self.pid is None:
            line = self.process.stdout.read()  # it may have answered just before the signal
            if not line.strip():
                return
            self.pid = json.loads(line.splitlines()[0])["pid"]
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                os.killpg(self.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.5)
        raise AssertionError(f"vLLM processes of group {self.pid} outlived vllm-serve")


class ServerPool:
    """Starts servers on demand, at most ``MAX_LIVE`` at once (least recently used goes first)."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.live: OrderedDict[tuple, Server] = OrderedDict()
        self.started: list[tuple[str, int, float, float]] = []
        self.prefetched: set[tuple] = set()  # started early, not asked for yet: the last to make room
        #: How many servers a test may :meth:`prefetch` beside the one it uses.
        self.ahead = MAX_LIVE - 1

    def get(self, model: str, image_limit: int = 8, store: Path | str | None = None, replica: int = 0,
            vllm_args: tuple[str, ...] = (), local_dir: Path | None = None) -> Server:
        """The live server of these settings, started if need be (``replica`` tells apart two of the same;
        ``vllm_args``: extra vLLM flags, e.g. its caches off; ``local_dir``: its own folder beside a bucket store)."""
        key = (model, image_limit, store, replica, vllm_args, local_dir)
        server = self._launch(key)
        self.live.move_to_end(key)
        self.prefetched.discard(key)
        if server.url is None:
            asked = time.monotonic()
            try:
                server.ready()
            except RuntimeError:
                del self.live[key]  # it exited: nothing left to stop
                raise
            self.started.append((model, image_limit, round(server.start_s, 1), round(time.monotonic() - asked, 1)))
        return server

    def prefetch(self, model: str, image_limit: int = 8, store: Path | str | None = None, replica: int = 0,
                 vllm_args: tuple[str, ...] = (), local_dir: Path | None = None) -> None:
        """Start the server :meth:`get` will be asked for next, without waiting for it; the least recently
        used other server makes room, so call it once the servers in use were got."""
        key = (model, image_limit, store, replica, vllm_args, local_dir)
        if key not in self.live:
            self._launch(key)
            self.prefetched.add(key)

    def _launch(self, key: tuple) -> Server:
        if key in self.live:
            return self.live[key]
        while len(self.live) >= MAX_LIVE:
            # The least recently used server goes; one prefetched and not yet asked for only when all are.
            oldest = next((k for k in self.live if k not in self.prefetched), next(iter(self.live)))
            self.prefetched.discard(oldest)
            self.live.pop(oldest).stop()
        model, image_limit, store, _, vllm_args, local_dir = key
        self.live[key] = Server(model, image_limit, self.log_dir, store, vllm_args, local_dir)
        return self.live[key]

    def stop(self, server: Server) -> None:
        """Stop one server now (a test that restarts it gets a new one from :meth:`get`)."""
        for key, live in list(self.live.items()):
            if live is server:
                del self.live[key]
                server.stop()

    def close(self) -> None:
        while self.live:
            self.live.popitem(last=False)[1].stop()


@pytest.fixture(scope="session")
def vllm_servers(vllm_python, tmp_path_factory):
    """``vllm_servers.get(model, image_limit=8, store=None)`` -> a running :class:`Server` (session pool)."""
    pool = ServerPool(tmp_path_factory.mktemp("vllm-logs"))
    yield pool
    pool.close()
    print(f"\nvLLM servers started (model, image limit, seconds to answer, seconds a test waited): {pool.started}")

