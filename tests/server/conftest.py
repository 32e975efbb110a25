"""Fixtures that run the real app under uvicorn on 127.0.0.1 (a free port) in a thread.

Tests talk to it over real sockets with real clients (httpx, the openai SDK,
Chromium). The ``toy`` model keeps most of them instant.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterator

import httpx
import pytest

from live_server import LiveServer
from refsight.server import ServerConfig, create_app


@pytest.fixture
def make_server(tmp_path: Path) -> Iterator[Callable[..., LiveServer]]:
    """Factory: ``make_server(model="toy", keys={...}, workers=1, ...)`` starts a live server."""
    servers: list[LiveServer] = []

    def start(**overrides) -> LiveServer:
        overrides.setdefault("model", "toy")
        overrides.setdefault("store", tmp_path / f"store{len(servers)}")
        overrides.setdefault("keys", {})
        live = LiveServer(create_app(ServerConfig(**overrides))).start()
        servers.append(live)
        return live

    yield start
    for live in servers:
        live.stop()


@pytest.fixture
def server(make_server) -> LiveServer:
    """A live server on the toy model, no API keys (loopback)."""
    return make_server()


@pytest.fixture
def client(server: LiveServer) -> Iterator[httpx.Client]:
    """An httpx client of :func:`server`."""
    with server.client() as c:
        yield c
