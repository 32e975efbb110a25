"""Helpers of the hostile-input tests (imported by name: unique on purpose).

- :func:`run_bounded`: the real ``refsight`` CLI in a subprocess, with a wall-clock
  bound and its peak memory (``ru_maxrss`` from ``wait4``) reported.
- :class:`ServeProcess`: ``refsight serve`` as a user runs it, with its log captured
  and its peak memory readable while it runs (``VmHWM``).
- :func:`store_snapshot`: everything a store holds (rows and files), to assert that
  a refused request wrote nothing.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

SRC = str(Path(__file__).resolve().parents[1] / "src")


def cli_env(**extra: str) -> dict[str, str]:
    """The environment of a CLI subprocess: this tree's sources first, no inherited keys (either variable)."""
    env = {**os.environ, "REFSIGHT_API_KEYS": "", "REFSIGHT_API_KEY": "",
           "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.update(extra)
    return env


@dataclass
class Bounded:
    """A finished subprocess: exit code, output, wall time and peak resident memory."""

    returncode: int
    stdout: str
    stderr: str
    seconds: float
    max_rss_mb: float


def run_bounded(argv: list[str], *, timeout: float = 60.0, stdin: int | None = subprocess.DEVNULL) -> Bounded:
    """Run ``python -m refsight.cli ARGV``; kill it past ``timeout`` (the result then says so)."""
    start = time.monotonic()
    process = subprocess.Popen(
        [sys.executable, "-m", "refsight.cli", *argv],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=stdin, text=True, env=cli_env(),
    )
    out: dict[str, str] = {}
    readers = [
        threading.Thread(target=lambda name=name, stream=stream: out.__setitem__(name, stream.read()), daemon=True)
        for name, stream in (("stdout", process.stdout), ("stderr", process.stderr))
    ]
    for reader in readers:
        reader.start()
    killer = threading.Timer(timeout, process.kill)
    killer.start()
    # Peak memory is read from the child's own VmHWM: ru_maxrss would also count the pages
    # it shared with this (possibly large) test process between fork and exec.
    peak = [0.0]
    done = threading.Event()
    poller = threading.Thread(target=_poll_hwm, args=(process.pid, peak, done), daemon=True)
    poller.start()
    try:
        _, status, _ = os.wait4(process.pid, 0)
    finally:
        done.set()
        killer.cancel()
    poller.join(timeout=5)
    process.returncode = os.waitstatus_to_exitcode(status)
    for reader in readers:
        reader.join(timeout=10)
    seconds = time.monotonic() - start
    return Bounded(process.returncode, out.get("stdout", ""), out.get("stderr", ""), seconds, peak[0])


def _vm_hwm_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None  # exited (a zombie has no memory figures)


def _poll_hwm(pid: int, peak: list[float], done: threading.Event) -> None:
    # VmHWM only grows within one program image, so the last reading is at most one interval old.
    while not done.is_set():
        value = _vm_hwm_mb(pid)
        if value is not None:
            peak[0] = max(peak[0], value)
        done.wait(0.01)


def free_port() -> int:
    """A free loopback port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServeProcess:
    """``refsight serve`` in a subprocess; its stderr+stdout are collected in :attr:`log`."""

    def __init__(
        self, store: Path | None, *extra: str, keys: Path | None = None, model: str = "toy", command: list[str] | None = None
    ) -> None:
        """``command``: a ``refsight serve ...`` line's words as a user types them (``store`` and ``model`` unused),
        run with a free ``--port`` added."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        argv = [sys.executable, "-m", "refsight.cli", "--store", str(store), "serve", "--port", str(self.port),
                "--model", model, "--workers", "1", *extra]
        if command is not None:
            argv = [sys.executable, "-m", "refsight.cli", *command[1:], "--port", str(self.port), *extra]
        if keys is not None:
            argv += ["--keys", str(keys)]
        self.process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=cli_env())
        self._lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self._lines.append(line)

    @property
    def log(self) -> str:
        """Everything the server printed so far."""
        return "".join(self._lines)

    def wait_ready(self, timeout: float = 90.0) -> ServeProcess:
        deadline = time.monotonic() + timeout
        while True:
            try:
                httpx.get(f"{self.url}/healthz", timeout=2)
                return self
            except httpx.TransportError:
                assert self.process.poll() is None, self.log
                assert time.monotonic() < deadline, f"refsight serve did not come up:\n{self.log}"
                time.sleep(0.2)

    def peak_rss_mb(self) -> float:
        """The server's peak resident memory so far (VmHWM of its program image)."""
        value = _vm_hwm_mb(self.process.pid)
        assert value is not None, "the server is not running"
        return value

    def rss_mb(self) -> float:
        """The server's resident memory now (VmRSS)."""
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise AssertionError("no VmRSS")

    def reset_peak(self) -> float:
        """Start a new peak (``clear_refs`` 5 sets VmHWM to the RSS now); returns that RSS, in MB."""
        Path(f"/proc/{self.process.pid}/clear_refs").write_text("5")
        return self.rss_mb()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._reader.join(timeout=5)

    def kill(self) -> None:
        """SIGKILL: no cleanup of any kind runs."""
        self.process.kill()
        self.process.wait()
        self._reader.join(timeout=5)


class SmallDisk:
    """A tiny tmpfs at :attr:`path` that :meth:`fill` fills to the last byte and :meth:`free` empties again."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._filler = path / "filler"

    def fill(self) -> None:
        with open(self._filler, "ab", buffering=0) as f:
            chunk = b"\0" * 65536
            while True:
                try:
                    f.write(chunk)
                except OSError as e:
                    if e.errno != errno.ENOSPC:
                        raise
                    if len(chunk) == 1:
                        return
                    chunk = chunk[: len(chunk) // 2]  # fill the last partial block too

    def free(self) -> None:
        self._filler.unlink(missing_ok=True)


@contextlib.contextmanager
def small_tmpfs(path: Path, size: str) -> Iterator[SmallDisk]:
    """A real, tiny file system (``mount -t tmpfs -o size=SIZE``); skips the test where mounting is not allowed."""
    import pytest

    path.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True, text=True, check=False)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.strip()}); a real full disk is needed")
    try:
        yield SmallDisk(path)
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)


def store_snapshot(root: Path) -> dict:
    """Every row of the store's tables and every file under it (names and sizes)."""
    snapshot: dict = {"files": {}}
    if not root.exists():
        return snapshot
    for path in sorted(root.rglob("*")):
        if path.is_file() and not path.name.startswith("refsight.db") and path.name != ".temp-sweep":
            snapshot["files"][str(path.relative_to(root))] = path.stat().st_size
    database = root / "refsight.db"
    if database.exists():
        conn = sqlite3.connect(f"file:{database}?mode=ro", uri=True)
        try:
            for table in ("packages", "references", "reference_packages", "images"):
                snapshot[table] = sorted(map(tuple, conn.execute(f'SELECT * FROM "{table}"').fetchall()))
        finally:
            conn.close()
    return snapshot
