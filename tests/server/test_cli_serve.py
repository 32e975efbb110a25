"""``refsight serve`` as a user runs it: a real process on a loopback port."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import httpx


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_refsight_serve_with_a_keys_file(tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("cli-serve-key-000111=team\n")
    port = _free_port()
    env = {**os.environ, "REFSIGHT_API_KEYS": ""}
    process = subprocess.Popen(
        [sys.executable, "-m", "refsight.cli", "--store", str(tmp_path / "store"), "serve", "--port", str(port),
         "--model", "toy", "--workers", "1", "--keys", str(keys)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 90
        while True:
            try:
                health = httpx.get(f"{url}/healthz", timeout=2)
                break
            except httpx.TransportError:
                assert process.poll() is None, process.stdout.read()
                assert time.monotonic() < deadline, "refsight serve did not come up"
                time.sleep(0.2)
        assert health.json()["model"] == "toy"
        assert httpx.get(f"{url}/v1/references").status_code == 401
        ok = httpx.get(f"{url}/v1/references", headers={"Authorization": "Bearer cli-serve-key-000111"})
        assert ok.status_code == 200 and ok.json() == {"references": []}
    finally:
        process.send_signal(signal.SIGINT)
        output, _ = process.communicate(timeout=30)
    assert process.returncode == 0, output
    assert "cli-serve-key-000111" not in output
    assert "GET /v1/references" in output  # the access log shows paths, never headers
