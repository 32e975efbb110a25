"""Property-based fuzzing of the live API from its own OpenAPI schema (schemathesis): never a 5xx.

Bounded for CI: a few dozen examples per operation, the instant ``toy`` model. Every
error response must also be the documented JSON error body with a stable code.
"""

from __future__ import annotations

import re

import pytest
import schemathesis
from fastapi.routing import APIRoute
from hypothesis import HealthCheck, settings
from live_server import LiveServer, b64, photo_png

from refsight.server import ServerConfig, create_app
from refsight.server.edge.gate import flat_routes

# The schema does not depend on the store or keys; building the app opens nothing (that
# happens at startup), so the schema is read at collection time and the server per module.
_APP = create_app(ServerConfig(store="/nonexistent", model="toy", keys={}))
_OPENAPI = _APP.openapi()
schema = schemathesis.openapi.from_dict(_OPENAPI)

#: Routes deliberately outside the OpenAPI schema, so outside the fuzzer, and who covers them.
_ALIAS = "llama-server's path without /v1: the same handler, fuzzed under /v1 (tests/server/test_hostile.py attacks it)"
NOT_FUZZED = {
    ("GET", "/"): "the HTML page (no JSON schema): tests/server/test_hostile.py and test_page.py",
    ("GET", "/favicon.ico"): "the page's icon (no JSON schema): tests/server/test_hostile.py and test_page_layout.py",
    ("GET", "/models"): _ALIAS,
    ("POST", "/chat/completions"): _ALIAS,
    ("POST", "/chat/completions/input_tokens"): _ALIAS,
    ("POST", "/completions"): "llama-server's alias of /completion: the same handler, fuzzed as /completion",
    ("POST", "/embedding"): "llama-server's older name of /embeddings: the same handler, fuzzed as /embeddings",
    ("POST", "/rerank"): "an alias of /v1/rerank (Jina's, vLLM's): the same handler, fuzzed as /v1/rerank",
    ("POST", "/v2/rerank"): "Cohere v2's path of /v1/rerank: the same handler, fuzzed as /v1/rerank",
    ("POST", "/reranking"): "llama-server's name of /v1/rerank: the same handler, fuzzed as /v1/rerank",
    ("POST", "/v1/reranking"): "llama-server's name of /v1/rerank: the same handler, fuzzed as /v1/rerank",
    ("POST", "/v1/score"): "vLLM's older path of /score: the same handler, fuzzed as /score",
    ("GET", "/cors-proxy"): "always 403, reading nothing of the request: tests/server/test_route_table.py",
    ("POST", "/cors-proxy"): "always 403, reading nothing of the request: tests/server/test_route_table.py",
}


def test_the_fuzzer_covers_every_route():
    """A new route is fuzzed by default: every API route is an operation of the schema fuzzed below."""
    operations = {(method.upper(), path) for path, item in _OPENAPI["paths"].items() for method in item}
    routes = {
        # The schema writes {model_id:path} as {model_id}.
        (method, re.sub(r":\w+}", "}", getattr(matcher, "path", route.path)))
        for matcher, route in flat_routes(_APP.routes)
        if isinstance(route, APIRoute)
        for method in route.methods - {"HEAD"}
    }
    assert routes - operations == set(NOT_FUZZED), routes - operations
    assert len(operations) >= 12


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    server = LiveServer(create_app(ServerConfig(store=tmp_path_factory.mktemp("fuzz-store"), model="toy", keys={}))).start()
    with server.client() as c:  # something to find, so id lookups sometimes hit
        c.post("/v1/references", json={"image": b64(photo_png()), "id": "cat", "metadata": {"species": "cat"}})
        # Load the embedders now, so no fuzzed request pays a one-time model load against its timeout.
        assert c.post("/v1/search", json={"text": "a cat", "k": 1}, timeout=300).status_code == 200
    yield server
    server.stop()


@schema.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_no_server_errors(case, live):
    response = case.call(base_url=live.url, timeout=120)
    assert response.status_code < 500, (case.method, case.path, response.status_code, response.text[:500])
    if response.status_code >= 400:
        body = response.json()
        if case.path.startswith("/api/"):  # Ollama's shape: {"error": "message"}, refsight's stable code beside it
            assert isinstance(body["error"], str) and isinstance(body["code"], str), body
            return
        assert isinstance(body["error"]["code"], str) and isinstance(body["error"]["message"], str), body
