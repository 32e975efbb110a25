"""``refsight serve`` as a user runs it: a real process on a loopback port."""

from __future__ import annotations

import httpx
from hardening_helpers import ServeProcess


def test_refsight_serve_with_a_keys_file(tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("cli-serve-key-000111=team\n")
    server = ServeProcess(tmp_path / "store", keys=keys).wait_ready()
    try:
        assert httpx.get(f"{server.url}/healthz", timeout=10).json()["model"] == "toy"
        assert httpx.get(f"{server.url}/v1/references", timeout=10).status_code == 401
        ok = httpx.get(f"{server.url}/v1/references", headers={"Authorization": "Bearer cli-serve-key-000111"}, timeout=10)
        assert ok.status_code == 200 and ok.json() == {"references": []}
    finally:
        server.stop()
    assert server.process.returncode == 0, server.log
    assert "cli-serve-key-000111" not in server.log
    assert "GET /v1/references" in server.log  # the access log shows paths, never headers
