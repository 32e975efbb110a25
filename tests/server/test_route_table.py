"""Every route of the app, from its own route table, held to what it may do (issue 60, groups 4, 8 and 9), on one
real ``refsight serve`` of the tiny GGUF (llama.cpp: a real tokenizer, chat template and image path).

:data:`ROUTES` lists each route once, with a request to it and two facts: whether it does model work (decodes an
image, tokenizes, runs the model), which must go through the work pool (chat's bound: its
workers, its queue, one decoded image per worker), and whether a request to it may wake a sleeping model. A route
added without an entry fails :func:`test_every_route_is_listed_and_wakes_as_listed`: a new route cannot escape.
With the pool full (one worker on a chat whose image URL the test's own host holds, and the queue behind it full of
chats), every model-work route answers 429 and every other one answers at once; released, each answers as listed (a
route that called model work outside the pool would be a 500: :func:`refsight.server.edge.limits.model_work`).
"""

from __future__ import annotations

import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
from hardening_helpers import ServeProcess
from live_server import b64, photo_png
from runtimes import require_module

pytestmark = pytest.mark.slow  # a real `refsight serve` of the tiny GGUF

GGUF = "tiny-qwen2-vl-gguf"
CHAT = {"model": GGUF, "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}
ANTHROPIC = {"model": GGUF, "messages": [{"role": "user", "content": "hi"}]}
OLLAMA = {"model": GGUF, "stream": False, "options": {"num_predict": 1}}
PNG = b64(photo_png())
RERANK = {"model": "conse", "query": "a cat", "documents": ["a cat", "a dog"]}

#: ``"METHOD PATH"`` of every route → (the request: method, path, JSON body; its status once the pool is free; model
#: work in the pool; wakes a sleeping model). The light routes answer the same while the pool is full.
ROUTES: dict[str, tuple[tuple[str, str, Any], int, bool, bool]] = {
    "GET /healthz": (("GET", "/healthz", None), 200, False, False),
    "GET /metrics": (("GET", "/metrics", None), 200, False, False),
    "GET /v1/stats": (("GET", "/v1/stats", None), 200, False, False),
    "POST /v1/references": (("POST", "/v1/references", {"image": PNG, "id": "table"}), 201, True, True),
    "GET /v1/references": (("GET", "/v1/references", None), 200, False, True),
    "GET /v1/references/{ref_id}": (("GET", "/v1/references/cat", None), 200, False, True),
    "GET /v1/references/{ref_id}/thumbnail": (("GET", "/v1/references/cat/thumbnail", None), 200, False, False),
    "GET /v1/references/{ref_id}/image": (("GET", "/v1/references/cat/image", None), 200, False, False),
    "DELETE /v1/references/{ref_id}": (("DELETE", "/v1/references/none", None), 404, False, True),
    "GET /v1/remembered": (("GET", "/v1/remembered", None), 200, False, True),
    "DELETE /v1/remembered": (("DELETE", "/v1/remembered", None), 200, False, True),
    # The candidate is decoded in the pool, then the empty rubric refused there (400).
    "POST /v1/compare": (("POST", "/v1/compare", {"candidate": PNG, "criteria": "", "ref_ids": ["cat"]}), 400, True,
                         True),
    "GET /v1/compare/progress/{token}": (("GET", "/v1/compare/progress/tok", None), 404, False, False),
    "POST /v1/search": (("POST", "/v1/search", {"text": ""}), 400, True, True),  # the library's rule, in the pool
    "GET /v1/health": (("GET", "/v1/health", None), 200, False, False),
    "GET /health": (("GET", "/health", None), 200, False, False),
    "GET /props": (("GET", "/props", None), 200, False, False),
    "GET /slots": (("GET", "/slots", None), 200, False, False),
    "GET /cors-proxy": (("GET", "/cors-proxy?url=http://127.0.0.1/", None), 403, False, False),  # never a proxy
    "POST /cors-proxy": (("POST", "/cors-proxy?url=http://127.0.0.1/", {}), 403, False, False),
    "POST /tokenize": (("POST", "/tokenize", {"content": "hi", "with_pieces": True}), 200, True, True),
    "POST /detokenize": (("POST", "/detokenize", {"tokens": [1, 2]}), 200, True, True),
    # A render takes no model worker: the renders' own bound (worker processes, a deadline: backends/templates).
    "POST /apply-template": (("POST", "/apply-template", {"messages": CHAT["messages"]}), 200, False, True),
    "POST /completions": (("POST", "/completions", {"prompt": "hi", "n_predict": 1}), 200, True, True),
    "POST /completion": (("POST", "/completion", {"prompt": "hi", "n_predict": 1, "stream": True}), 200, True, True),
    "POST /v1/completions": (("POST", "/v1/completions", {"prompt": "hi", "max_tokens": 1}), 200, True, True),
    "POST /api/chat": (("POST", "/api/chat", {**OLLAMA, "messages": CHAT["messages"]}), 200, True, True),
    "POST /api/generate": (("POST", "/api/generate", {**OLLAMA, "prompt": "hi"}), 200, True, True),
    "GET /api/tags": (("GET", "/api/tags", None), 200, False, False),
    "GET /api/ps": (("GET", "/api/ps", None), 200, False, False),
    "GET /api/version": (("GET", "/api/version", None), 200, False, False),
    "POST /api/show": (("POST", "/api/show", {"model": GGUF}), 200, False, False),
    "POST /api/pull": (("POST", "/api/pull", {"model": "x"}), 400, False, False),
    "POST /api/push": (("POST", "/api/push", {"model": "x"}), 400, False, False),
    "POST /api/create": (("POST", "/api/create", {"model": "x"}), 400, False, False),
    "DELETE /api/delete": (("DELETE", "/api/delete", {"model": "x"}), 400, False, False),
    "POST /api/copy": (("POST", "/api/copy", {"source": "x", "destination": "y"}), 400, False, False),
    "POST /api/blobs/{digest}": (("POST", "/api/blobs/sha256:00", None), 400, False, False),
    "POST /api/embeddings": (("POST", "/api/embeddings", {"model": "conse", "prompt": "hi"}), 200, True, True),
    "POST /api/embed": (("POST", "/api/embed", {"model": "conse", "input": "hi"}), 200, True, True),
    "POST /v1/embeddings": (("POST", "/v1/embeddings", {"input": "hi"}), 200, True, True),
    "POST /embeddings": (("POST", "/embeddings", {"content": "hi"}), 200, True, True),
    "POST /embedding": (("POST", "/embedding", {"content": "hi"}), 200, True, True),
    **{f"POST {path}": (("POST", path, RERANK), 200, True, True)
       for path in ("/v1/rerank", "/rerank", "/v2/rerank", "/reranking", "/v1/reranking")},
    **{f"POST {path}": (("POST", path, {"model": "conse", "text_1": "a", "text_2": "b"}), 200, True, True)
       for path in ("/score", "/v1/score")},
    "POST /v1/messages/count_tokens": (("POST", "/v1/messages/count_tokens", ANTHROPIC), 200, True, True),
    "POST /v1/messages": (("POST", "/v1/messages", {**ANTHROPIC, "max_tokens": 1, "stream": True}), 200, True, True),
    "POST /chat/completions": (("POST", "/chat/completions", {**CHAT, "stream": True}), 200, True, True),
    "POST /v1/chat/completions": (("POST", "/v1/chat/completions", {**CHAT, "verbose": True}), 200, True, True),
    "POST /chat/completions/input_tokens": (("POST", "/chat/completions/input_tokens", CHAT), 200, True, True),
    "POST /v1/chat/completions/input_tokens": (("POST", "/v1/chat/completions/input_tokens", CHAT), 200, True, True),
    "GET /models": (("GET", "/models", None), 200, False, False),
    "GET /v1/models": (("GET", "/v1/models", None), 200, False, False),
    "GET /v1/models/{model_id:path}": (("GET", f"/v1/models/{GGUF}", None), 200, False, False),
    "GET /": (("GET", "/", None), 200, False, False),
    "GET /favicon.ico": (("GET", "/favicon.ico", None), 200, False, False),
    "GET /openapi.json": (("GET", "/openapi.json", None), 200, False, False),
    "GET /docs": (("GET", "/docs", None), 200, False, False),
    "GET /docs/oauth2-redirect": (("GET", "/docs/oauth2-redirect", None), 200, False, False),
    "GET /redoc": (("GET", "/redoc", None), 200, False, False),
}


def _app_routes(tmp_path) -> dict[str, Any]:
    """``"METHOD PATH"`` → route, for every route of the app ``refsight serve`` builds (HEAD is GET's)."""
    from refsight.server import ServerConfig, create_app
    from refsight.server.edge.gate import flat_routes

    app = create_app(ServerConfig(store=tmp_path / "listing", model="toy", keys={}))
    return {f"{method} {route.path}": route for _, route in flat_routes(app.routes)
            for method in sorted(getattr(route, "methods", None) or ()) if method != "HEAD"}


def test_every_route_is_listed_and_wakes_as_listed(tmp_path):
    from refsight.server.edge.sleep import wakes

    routes = _app_routes(tmp_path)
    assert not routes.keys() - ROUTES.keys(), (
        f"routes not in ROUTES (add each with a request, and whether it does model work and wakes the model): "
        f"{sorted(routes.keys() - ROUTES.keys())}")
    assert not ROUTES.keys() - routes.keys(), f"ROUTES lists routes the app no longer has: {sorted(ROUTES.keys() - routes.keys())}"
    misjudged = {key: ROUTES[key][3] for key, route in routes.items() if wakes(route) != ROUTES[key][3]}
    assert not misjudged, f"these routes wake a sleeping model otherwise than listed: {misjudged}"


#: Service attributes that are no model work, each with why (every other public method is marked model_work).
LIGHT_SERVICE = {
    "open": "the load itself, at start (and wake: the sleep watch's)", "close": "lifecycle", "sleep": "lifecycle",
    "wake": "lifecycle", "stop_renders": "lifecycle", "is_sleeping": "a flag", "is_ready": "a flag",
    "model": "facts", "served_model": "facts", "model_names": "facts", "context_size": "facts",
    "sampling_defaults": "facts", "random_weights": "facts", "media_marker": "facts",
    "generation_support": "facts", "model_details": "facts",
    "references": "catalog", "reference_count": "catalog", "reference": "catalog", "remove": "catalog",
    "remembered": "catalog", "forget_remembered": "catalog", "reference_image": "the kept bytes, not decoded",
    "thumbnail": "its own bound: two renders at once, draft decoding (server/replies/thumbnails.py)",
    "render_chat": "its own bound: a render worker process, its deadline and memory (backends/templates)",
    "stats": "catalog", "global_stats": "catalog",
    "template_reads": "a search of the template's text", "embedder_name": "facts",
}


def test_every_service_method_is_model_work_or_listed_light():
    """The service is the routes' only door to the model: a new method must say which it is."""
    from refsight.server.edge.limits import is_model_work
    from refsight.server.service import Service

    public = {name for name in vars(Service) if not name.startswith("_")}
    unmarked = {name for name in public if not is_model_work(getattr(Service, name)) and name not in LIGHT_SERVICE}
    assert not unmarked, f"Service methods neither model_work nor listed light (with why): {sorted(unmarked)}"
    assert not LIGHT_SERVICE.keys() - public, sorted(LIGHT_SERVICE.keys() - public)
    assert {"decode", "tokenize", "detokenize", "token_piece", "count_text_tokens", "image_token_count",
            "chat"} <= {name for name in public if is_model_work(getattr(Service, name))}


class _HeldImage(BaseHTTPRequestHandler):
    """An image host that holds every request until the test releases it (the worker waits on its fetch)."""

    arrived = threading.Event()
    release = threading.Event()

    def do_GET(self) -> None:  # noqa: N802 -- http.server's name
        self.arrived.set()
        self.release.wait(30)
        data = photo_png()
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """One server for the module: one worker, a 2-second sleep, images by URL from loopback."""
    require_module("llama_cpp")
    from refsight.builtin_models.gguf import ensure_gguf

    ensure_gguf(GGUF)  # built before the server starts, so its start is only the load
    host = ThreadingHTTPServer(("127.0.0.1", 0), _HeldImage)
    threading.Thread(target=host.serve_forever, daemon=True).start()
    server = ServeProcess(tmp_path_factory.mktemp("table") / "store", "--workers", "1", "--sleep-idle-seconds", "2",
                          "--allowed-media-domains", "127.0.0.1", "--attributes", "none", model=GGUF).wait_ready(timeout=300)
    try:
        with httpx.Client(base_url=server.url, timeout=120) as c:
            assert c.post("/v1/references", json={"image": PNG, "id": "cat"}).status_code == 201
        yield server, host.server_address[1]
    finally:
        server.stop()
        _HeldImage.release.set()
        host.shutdown()


def _send(c: httpx.Client, probe: tuple[str, str, Any]) -> httpx.Response:
    method, path, body = probe
    return c.request(method, path, json=body) if body is not None else c.request(method, path)


#: ``refsight serve``'s queue (``ServerConfig.queue``): the requests that may wait for the worker.
QUEUE = 32


def _deferred(c: httpx.Client) -> int:
    """Requests waiting for a worker (llama-server's ``llamacpp:requests_deferred``)."""
    line = next(line for line in c.get("/metrics").text.splitlines() if line.startswith("llamacpp:requests_deferred"))
    return int(float(line.split()[-1]))


def test_model_work_waits_for_the_pool_and_nothing_else_does(served):
    server, image_port = served
    replies: list[int] = []
    chat = {**CHAT, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": f"http://127.0.0.1:{image_port}/held.png"}}]}]}

    def hold(path: str, body: dict[str, Any]) -> None:
        with httpx.Client(base_url=server.url, timeout=120) as c:
            replies.append(c.post(path, json=body).status_code)

    # The worker on the held chat, then the queue behind it (tokenizing: model work, quick once released).
    holders = [threading.Thread(target=hold, args=("/v1/chat/completions", chat))]
    holders += [threading.Thread(target=hold, args=("/tokenize", {"content": "hi"})) for _ in range(QUEUE)]
    holders[0].start()
    try:
        assert _HeldImage.arrived.wait(30), "the held chat never fetched its image"
        for holder in holders[1:]:
            holder.start()
        with httpx.Client(base_url=server.url, timeout=10) as c:
            deadline = time.monotonic() + 30
            while _deferred(c) < QUEUE:
                assert time.monotonic() < deadline, "the queue never filled"
                time.sleep(0.05)
            full = {key: _send(c, probe).status_code for key, (probe, _, _, _) in ROUTES.items()}
    finally:
        _HeldImage.release.set()
        for holder in holders:
            holder.join(120)
    assert replies == [200] * (1 + QUEUE), replies
    wrong = {key: code for key, code in full.items() if (code == 429) != ROUTES[key][2]}
    assert not wrong, f"with the pool full, model work must be 429 and nothing else: {wrong}"
    with httpx.Client(base_url=server.url, timeout=120) as c:
        free = {key: _send(c, probe) for key, (probe, _, pooled, _) in ROUTES.items() if pooled}
    wrong = {key: (reply.status_code, reply.text[:200]) for key, reply in free.items()
             if reply.status_code != ROUTES[key][1]}
    assert not wrong, f"model-work routes with the pool free: {wrong}"
    assert server.process.poll() is None, server.log


def _sleeping(c: httpx.Client) -> bool:
    return c.get("/props").json()["is_sleeping"]


def test_only_work_that_needs_the_model_wakes_it(served):
    server, _ = served
    quiet = {key: probe for key, (probe, _, _, wakes) in ROUTES.items() if not wakes}
    quiet.update({"404": ("GET", "/no-such-path", None), "405": ("GET", "/tokenize", None),
                  "404 POST": ("POST", "/v1/nothing", {"a": 1})})
    with httpx.Client(base_url=server.url, timeout=60) as c:
        deadline = time.monotonic() + 30
        while not _sleeping(c):
            assert time.monotonic() < deadline, "the model never slept"
            time.sleep(0.2)
        woke = [key for key, probe in quiet.items() if _send(c, probe).status_code and not _sleeping(c)]
        assert not woke, f"requests that need no model woke it: {woke}"
        assert c.get("/api/ps").json() == {"models": []}  # Ollama's models in memory: none while it sleeps
        assert _send(c, ROUTES["POST /tokenize"][0]).status_code == 200 and not _sleeping(c)


def _raw(port: int, headers: list[str], body: bytes = b'{"model":"x","max_tokens":1,"messages":[]}') -> tuple[int, bytes]:
    """A POST of ``body`` with exactly ``headers`` (repeats kept), over a socket of its own; the status and body."""
    head = "".join(f"{h}\r\n" for h in ["POST /v1/chat/completions HTTP/1.1", *headers, "Connection: close"])
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(head.encode() + b"\r\n" + body)
        reply = b""
        while chunk := s.recv(65536):
            reply += chunk
    status = int(reply.split(b" ", 2)[1])
    return status, reply.partition(b"\r\n\r\n")[2]


def test_a_header_the_edge_decides_by_is_refused_when_repeated(served):
    """Two ``Origin`` headers: the origin check read the last (``localhost``) while a browser had sent ``evil``;
    each header the edge reads is now refused when repeated, and a body framed two ways."""
    server, _ = served
    body = b'{"model":"x","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}'
    host, length = f"Host: 127.0.0.1:{server.port}", f"Content-Length: {len(body)}"
    json_type = "Content-Type: application/json"
    assert _raw(server.port, [host, json_type, length, "Origin: http://localhost"], body)[0] == 200
    assert _raw(server.port, [host, json_type, length, "Origin: http://evil.example"], body)[0] == 403
    for name, headers in {
        "origin": [host, json_type, length, "Origin: http://evil.example", "Origin: http://localhost"],
        "content-type": [host, "Content-Type: text/plain", json_type, length],
    }.items():
        status, text = _raw(server.port, headers, body)
        assert status == 400 and b"duplicate_header" in text and name.encode() in text, (name, status, text)
    chunked = f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"
    status, text = _raw(server.port, [host, json_type, length, "Transfer-Encoding: chunked"], chunked)
    assert status == 400 and b"framed two ways" in text, text
    # The HTTP parser's own: two Hosts, two lengths that differ (two equal ones are one, as RFC 9112 allows).
    assert _raw(server.port, ["Host: evil.example", host, json_type, length], body)[0] == 400
    assert _raw(server.port, [host, json_type, length, f"Content-Length: {len(body) + 1}"], body)[0] == 400
