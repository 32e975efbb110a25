"""Fixtures that run the real app under uvicorn on 127.0.0.1 (a free port) in a thread.

Tests talk to it over real sockets with real clients (httpx, the openai SDK,
Chromium). The ``toy`` model keeps most of them instant; :func:`tiny` serves the real tiny random
Qwen2-VL (one fixture for every module: a module names its own settings in ``tiny_options``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterator

import httpx
import pytest

from live_server import LiveServer
from runtimes import require_module

from refsight.server import ServerConfig, create_app

#: The real model of :func:`tiny` (random weights, built once per session in the session's model cache).
TINY = "tiny-qwen2-vl"


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


@pytest.fixture(scope="module")
def tiny_options() -> dict:
    """The :class:`ServerConfig` fields a module's :func:`tiny` server takes (a module overrides this fixture)."""
    return {}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, model_cache, tiny_options) -> Iterator[LiveServer]:
    """A live server on the real tiny random Qwen2-VL (:data:`TINY`), no API keys unless ``tiny_options`` names some.

    One server per module, not per session: a module's requests add references and warm the package tiers that
    another module's counts must not see. Its model loads once per process all the same (the backend registry
    keeps it), so a second module's server costs a store and a socket, not a model load.
    """
    require_module("transformers")
    config = ServerConfig(**{"store": tmp_path_factory.mktemp("tiny"), "model": TINY, "keys": {}, **tiny_options})
    live = LiveServer(create_app(config)).start()
    yield live
    live.stop()
