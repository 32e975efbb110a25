"""Replicas as users run them: `refsight serve` processes sharing one PostgreSQL catalog and one blob directory.

Imported by name (unique on purpose) by the replica tests and ``benchmarks/serve_load.py --replicas``.
"""

from __future__ import annotations

import base64
import io
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Replica:
    """One ``refsight serve --store BLOBS --catalog URL --local-dir DIR`` process on a loopback port."""

    def __init__(self, name: str, blobs: Path, catalog: str, local: Path, *, model: str = "toy",
                 workers: int = 2, extra: tuple[str, ...] = ()) -> None:
        self.name = name
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = Path(local).with_suffix(".log")
        self.argv = [
            sys.executable, "-m", "refsight.cli", "--store", str(blobs), "--catalog", catalog,
            "--local-dir", str(local), "serve", "--port", str(self.port), "--model", model,
            "--workers", str(workers), "--attributes", "none", *extra,
        ]
        self.process: subprocess.Popen | None = None

    def start(self, timeout: float = 180) -> "Replica":
        env = {**os.environ, "REFSIGHT_API_KEYS": ""}
        self._log = open(self.log, "ab")
        self.process = subprocess.Popen(self.argv, stdout=self._log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + timeout
        while True:
            try:
                if httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            if self.process.poll() is not None:
                raise RuntimeError(f"replica {self.name} exited: {self.output()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"replica {self.name} did not come up: {self.output()}")
            time.sleep(0.2)

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-4000:] if self.log.exists() else ""

    def client(self, **options) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=options.pop("timeout", 120), **options)

    def stats(self) -> dict:
        return httpx.get(f"{self.url}/v1/stats", timeout=60).json()

    def kill(self) -> None:
        """SIGKILL: no cleanup of any kind runs."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(30)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if getattr(self, "_log", None) is not None:
            self._log.close()


def noise_png(seed: int, size: int = 32) -> bytes:
    """A distinct small image per seed (random pixels), as PNG bytes."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    image = Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


#: The compare rubric of the replica tests.
RUBRIC = "same colours\nsame texture"


def add_references(replica: Replica, count: int) -> list[int]:
    """Add ``r0`` ... ``r{count-1}`` (a noise image each) through ``replica``, four at a time: the statuses in order."""
    from concurrent.futures import ThreadPoolExecutor

    with replica.client() as client, ThreadPoolExecutor(4) as pool:
        return list(pool.map(
            lambda i: client.post("/v1/references", json={"image": b64(noise_png(i)), "id": f"r{i}"}).status_code,
            range(count),
        ))


def compare_all(replica: Replica, count: int, round_: int) -> list[int]:
    """Compares covering ``r0`` ... ``r{count-1}`` four at a time, with new candidates each round (so no memory tier
    holds them): the statuses."""
    statuses = []
    with replica.client() as client:
        for first in range(0, count, 4):
            body = {"candidate": b64(noise_png(1000 + 100 * round_ + first)), "criteria": RUBRIC,
                    "ref_ids": [f"r{first + j}" for j in range(4)]}
            statuses.append(client.post("/v1/compare", json=body).status_code)
    return statuses
