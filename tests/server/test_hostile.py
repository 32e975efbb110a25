"""Hostile input against EVERY route of the app: new endpoints join by default.

The routes are enumerated from ``app.routes`` at collection time, so an endpoint
added later is attacked here without anyone writing a test for it. Each case is sent
to each route and method of a live server with API keys:

- JSON nested 1000 deep, a ``where`` of 2000 keys, control characters in every string
  and in the path, with valid credentials;
- a body over the limit with no key; ``Basic`` auth; a bearer token and ``X-API-Key``
  that disagree; a repeated ``Authorization`` header;
- text that is not valid Unicode (a lone surrogate, sent as the JSON escape ``\\ud800``) in
  every text field of :data:`TEXT_FIELDS`, a table of (route, body, field): 400 naming the
  field, nothing stored. A new route or field joins by adding a row.

Never a 5xx; every 4xx is the documented JSON error body; and where the answer is
known for every route (deep JSON: 400, missing or ambiguous credentials: 401 on a
route that needs a key), it is asserted exactly.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import quote

import httpx
import pytest
from fastapi.routing import APIRoute
from live_server import LiveServer, b64, photo_png

from refsight.server import ServerConfig, create_app
from refsight.server.edge.gate import OPERATOR, PUBLIC, flat_routes, route_guard

TENANT_KEY, OTHER_KEY, OPERATOR_KEY = "hostile-tenant-0001", "hostile-other-0002", "hostile-operator-03"
KEYS = {TENANT_KEY: "team", OTHER_KEY: "other", OPERATOR_KEY: "@operator"}
MAX_BODY = 1 << 20

_APP = create_app(ServerConfig(store="/nonexistent", model="toy", keys=KEYS))


def _endpoints() -> list[tuple[str, str, str]]:
    """(method, path template, guard) of every API route, HEAD aside."""
    found = []
    for matcher, route in flat_routes(_APP.routes):
        if isinstance(route, APIRoute):
            for method in sorted(route.methods - {"HEAD"}):
                found.append((method, getattr(matcher, "path", route.path), route_guard(route)))
    return found


ENDPOINTS = _endpoints()


def _path(template: str, value: str = "cat") -> str:
    path = template
    while "{" in path:
        start, end = path.index("{"), path.index("}")
        path = path[:start] + quote(value, safe="") + path[end + 1:]
    return path


def _credentials(guard: str) -> dict[str, str]:
    if guard == PUBLIC:
        return {}
    return {"Authorization": f"Bearer {OPERATOR_KEY if guard == OPERATOR else TENANT_KEY}"}


def _json_error(response: httpx.Response) -> dict:
    assert response.status_code < 500, (response.request.method, response.request.url, response.status_code, response.text[:300])
    if response.status_code >= 400:
        assert response.headers["content-type"].startswith("application/json"), response.headers
        body = response.json()
        if isinstance(body["error"], str):  # Ollama's routes: {"error": "message"}, the stable code beside it
            assert set(body) == {"error", "code"} and response.request.url.path.startswith("/api/"), body
            body = {"error": {"code": body["code"], "message": body["error"]}}
        if body.get("type") == "error":  # Anthropic's routes: {"type": "error", "error": {"type", "message", ...}}
            assert response.request.url.path.startswith("/v1/messages"), body
            body = {"error": body["error"]}
        assert set(body) == {"error"} and isinstance(body["error"]["code"], str), body
        assert isinstance(body["error"]["message"], str) and "Traceback" not in body["error"]["message"]
        return body["error"]
    return {}


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    app = create_app(ServerConfig(store=tmp_path_factory.mktemp("hostile-store"), model="toy", keys=KEYS,
                                  max_body_bytes=MAX_BODY))
    server = LiveServer(app).start()
    with server.client(TENANT_KEY) as c:
        assert c.post("/v1/references", json={"image": b64(photo_png()), "id": "cat"}).status_code == 201
    yield server
    server.stop()


def _send(live: LiveServer, method: str, path: str, *, content: bytes | None = None, headers=None) -> httpx.Response:
    with httpx.Client(base_url=live.url, timeout=120) as client:
        return client.request(method, path, content=content, headers=headers)


def test_the_suite_sees_every_route():
    paths = {path for _, path, _ in ENDPOINTS}
    assert {"/v1/references", "/v1/references/{ref_id}", "/v1/compare", "/v1/search",
            "/v1/chat/completions", "/v1/stats", "/healthz", "/metrics", "/"} <= paths
    assert {guard for _, _, guard in ENDPOINTS} == {"tenant", "operator", "public"}


@pytest.mark.parametrize(("method", "template", "guard"), ENDPOINTS, ids=[f"{m} {p}" for m, p, _ in ENDPOINTS])
def test_deep_json_is_400_on_every_route(live, method, template, guard):
    body = ("[" * 1000 + "]" * 1000).encode()
    response = _send(live, method, _path(template), content=body,
                     headers={**_credentials(guard), "content-type": "application/json"})
    assert _json_error(response)["code"] == "invalid_input" and response.status_code == 400


@pytest.mark.parametrize(("method", "template", "guard"), ENDPOINTS, ids=[f"{m} {p}" for m, p, _ in ENDPOINTS])
def test_huge_where_and_control_characters_never_crash(live, method, template, guard):
    where = json.dumps({"text": "cat", "where": {f"k{i}": i for i in range(2000)}}).encode()
    response = _send(live, method, _path(template), content=where,
                     headers={**_credentials(guard), "content-type": "application/json"})
    error = _json_error(response)
    if (method, template) == ("POST", "/v1/search"):
        assert response.status_code == 400 and "over the limit of 32" in error["message"]

    evil = "\x1b[31m\x00\r\u202e"
    strings = {"text": evil, "image": evil, "id": evil, "criteria": evil, "candidate": evil, "model": evil,
               "messages": [{"role": "user", "content": evil}], "metadata": {evil: evil}}
    _json_error(_send(live, method, _path(template), content=json.dumps(strings).encode(),
                      headers={**_credentials(guard), "content-type": "application/json"}))
    if "{" in template:
        error = _json_error(_send(live, method, _path(template, evil), headers=_credentials(guard)))
        # A model id is no reference id: an unknown one is simply not served; a progress token is its own input.
        # Ollama's blob upload is refused whatever the digest.
        expected = {"{model_id": "model_not_found", "{token": "invalid_input", "{digest": "unsupported"}
        assert error["code"] == next((code for part, code in expected.items() if part in template),
                                     "invalid_reference_id"), error


@pytest.mark.parametrize(("method", "template", "guard"), ENDPOINTS, ids=[f"{m} {p}" for m, p, _ in ENDPOINTS])
def test_bad_credentials_are_401_before_the_body_on_every_guarded_route(live, method, template, guard):
    path = _path(template)
    oversized = b"{" + b" " * (2 * MAX_BODY) + b"}"
    cases = {
        "no key, oversized body": {},
        "Basic": {"Authorization": f"Basic {TENANT_KEY}"},
        "keys disagree": {"Authorization": f"Bearer {TENANT_KEY}", "X-API-Key": OTHER_KEY},
        "repeated header": [("Authorization", f"Bearer {TENANT_KEY}"), ("Authorization", f"Bearer {OTHER_KEY}")],
    }
    for name, headers in cases.items():
        if isinstance(headers, dict):
            headers = {**headers, "content-type": "application/json"}
        else:
            headers = [*headers, ("content-type", "application/json")]
        response = _send(live, method, path, content=oversized, headers=headers)
        error = _json_error(response)
        if guard == PUBLIC:
            # No key needed: the body limit answers (or, for a body-less GET, whatever the route does).
            assert response.status_code in (200, 413), (name, response.status_code)
        else:
            assert (response.status_code, error["code"]) == (401, "unauthorized"), (name, response.text)


def test_an_unknown_path_needs_a_key_too(live):
    # Default deny: no route means no body is buffered for an anonymous client either.
    response = _send(live, "POST", "/v1/not-yet-written", content=b"x" * (2 * MAX_BODY))
    assert _json_error(response)["code"] == "unauthorized"
    with live.client(TENANT_KEY) as c:
        assert c.get("/v1/not-yet-written").status_code == 404


# -- text that is not valid Unicode (issue 25 item 2) ----------------------------------------------
#: A lone surrogate: what ``"\\ud800"`` in a JSON body decodes to.
BAD = "\ud800"
_PNG = b64(photo_png(flip=True))
_HI = [{"role": "user", "content": "hi"}]

#: (route, JSON body holding BAD, the field the 400 must name). One row per text field.
TEXT_FIELDS = [
    ("POST /v1/references", {"image": _PNG, "id": BAD}, "id"),
    ("POST /v1/references", {"image": BAD}, "image"),
    ("POST /v1/references", {"image": _PNG, "metadata": {"colour": BAD}}, "metadata.colour"),
    ("POST /v1/references", {"image": _PNG, "metadata": {BAD: "x"}}, "metadata key"),
    ("POST /v1/references", {"image": _PNG, "metadata": {"tags": ["ok", {"deep": BAD}]}}, "metadata.tags[1].deep"),
    ("POST /v1/compare", {"candidate": _PNG, "criteria": BAD, "ref_ids": ["cat"]}, "criteria"),
    ("POST /v1/compare", {"candidate": _PNG, "criteria": ["fur", BAD], "ref_ids": ["cat"]}, "criteria[1]"),
    ("POST /v1/compare", {"candidate": _PNG, "criteria": {"criteria": [{"text": BAD}]}, "ref_ids": ["cat"]},
     "criteria.criteria[0].text"),
    ("POST /v1/compare", {"candidate": _PNG, "criteria": "fur", "ref_ids": [BAD]}, "ref_ids[0]"),
    ("POST /v1/compare", {"candidate": _PNG, "criteria": "fur", "top_k": 1, "query": BAD}, "query"),
    ("POST /v1/compare", {"candidate": BAD, "criteria": "fur", "ref_ids": ["cat"]}, "candidate"),
    ("POST /v1/search", {"text": BAD}, "text"),
    ("POST /v1/search", {"text": "cat", "where": {"colour": BAD}}, "where.colour"),
    ("POST /v1/search", {"text": "cat", "where": {BAD: "x"}}, "where key"),
    ("POST /v1/chat/completions", {"model": BAD, "messages": _HI}, "model"),
    ("POST /v1/chat/completions", {"model": "toy", "messages": [{"role": "user", "content": BAD}]},
     "messages[0].content"),
    ("POST /v1/chat/completions", {"model": "toy", "messages": [
        {"role": "user", "content": [{"type": "text", "text": BAD}]}]}, "messages[0].content[0].text"),
    ("POST /v1/chat/completions", {"model": "toy", "messages": [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "refsight://ref/x"}, "uuid": BAD}]}]},
     "messages[0].content[0].uuid"),
    ("POST /v1/chat/completions", {"model": "toy", "messages": [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": f"refsight://ref/{BAD}"}}]}]},
     "messages[0].content[0].image_url.url"),
    ("POST /v1/chat/completions", {"model": "toy", "messages": _HI, "stop": [BAD]}, "stop[0]"),
    ("POST /v1/chat/completions", {"model": "toy", "messages": _HI, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "properties": {BAD: {}}}}}},
     "response_format.json_schema.schema.properties key"),
    ("POST /v1/chat/completions", {"model": "toy", "messages": _HI, BAD: 1}, "request body key"),
    ("POST /v1/chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": None, "uuid": BAD}]}]}, "messages[0].content[0].uuid"),
    ("POST /v1/completions", {"prompt": BAD}, "prompt"),
    ("POST /completions", {"prompt": BAD}, "prompt"),
    ("POST /chat/completions", {"model": "toy", "messages": [{"role": "user", "content": BAD}]}, "messages[0].content"),
    ("POST /v1/completions", {"prompt": "hi", "stop": [BAD]}, "stop[0]"),
    ("POST /completion", {"prompt": BAD}, "prompt"),
    ("POST /completion", {"prompt": "<__media__>", "multimodal_data": [BAD]}, "multimodal_data[0]"),
    ("POST /completion", {"prompt": {"prompt_string": BAD}}, "prompt.prompt_string"),
    ("POST /tokenize", {"content": BAD}, "content"),
    ("POST /apply-template", {"messages": [{"role": "user", "content": BAD}]}, "messages[0].content"),
    ("POST /api/chat", {"model": "toy", "messages": [{"role": "user", "content": BAD}]}, "messages[0].content"),
    ("POST /api/chat", {"model": "toy", "messages": [{"role": "user", "content": "x", "images": [BAD]}]},
     "messages[0].images[0]"),
    ("POST /api/generate", {"model": "toy", "prompt": BAD}, "prompt"),
    ("POST /api/generate", {"model": "toy", "prompt": "x", "options": {"stop": [BAD]}}, "options.stop[0]"),
    ("POST /api/show", {"model": BAD}, "model"),
    ("POST /api/pull", {"model": BAD}, "model"),
    ("POST /api/push", {"model": BAD}, "model"),
    ("POST /api/create", {"model": BAD}, "model"),
    ("POST /api/copy", {"source": BAD}, "source"),
    ("POST /api/blobs/{digest}", {"x": BAD}, "x"),
    ("POST /api/embed", {"model": "conse", "input": BAD}, "input"),
    ("POST /api/embeddings", {"model": "conse", "prompt": BAD}, "prompt"),
    ("POST /v1/embeddings", {"input": BAD}, "input"),
    ("POST /v1/embeddings", {"input": [{"content": [{"type": "text", "text": BAD}]}]}, "input[0].content[0].text"),
    ("POST /embeddings", {"content": BAD}, "content"),
    ("POST /embedding", {"content": {"prompt_string": BAD}}, "content.prompt_string"),
    ("POST /v1/rerank", {"query": BAD, "documents": ["x"]}, "query"),
    ("POST /rerank", {"query": "q", "documents": [BAD]}, "documents[0]"),
    ("POST /v2/rerank", {"query": "q", "documents": ["x"], "model": BAD}, "model"),
    ("POST /reranking", {"query": "q", "texts": [BAD]}, "texts[0]"),
    ("POST /v1/reranking", {"query": {"text": BAD}, "documents": ["x"]}, "query.text"),
    ("POST /score", {"text_1": BAD, "text_2": "x"}, "text_1"),
    ("POST /v1/score", {"text_1": "q", "text_2": [BAD]}, "text_2[0]"),
    ("POST /v1/messages", {"model": "toy", "max_tokens": 4, "messages": [{"role": "user", "content": BAD}]},
     "messages[0].content"),
    ("POST /v1/messages", {"model": "toy", "max_tokens": 4, "system": BAD, "messages": _HI}, "system"),
    ("POST /v1/messages/count_tokens", {"model": "toy", "messages": [{"role": "user", "content": BAD}]},
     "messages[0].content"),
    ("POST /v1/chat/completions/input_tokens", {"messages": [{"role": "user", "content": BAD}]}, "messages[0].content"),
    ("POST /chat/completions/input_tokens", {"messages": _HI, "stop": [BAD]}, "stop[0]"),
]


def test_every_text_route_has_rows():
    routes = {route for route, _, _ in TEXT_FIELDS}
    # /detokenize takes token ids only, /cors-proxy reads nothing (always 403): no text to check.
    posting = {f"{m} {p}" for m, p, _ in ENDPOINTS if m == "POST" and p not in ("/detokenize", "/cors-proxy")}
    assert posting <= routes, posting - routes


@pytest.mark.parametrize(("route", "body", "field"), TEXT_FIELDS, ids=[f"{r} {f}" for r, _, f in TEXT_FIELDS])
def test_text_that_is_not_valid_unicode_is_400_naming_the_field(live, route, body, field):
    method, path = route.split(" ", 1)
    before = _references(live)
    # json.dumps writes the lone surrogate as the escape \ud800, as a hostile client would.
    response = _send(live, method, path, content=json.dumps(body).encode(),
                     headers={**_credentials("tenant"), "content-type": "application/json"})
    error = _json_error(response)
    assert (response.status_code, error["code"]) == (400, "invalid_input"), response.text
    assert error["message"].startswith(field) and "not valid Unicode" in error["message"], error
    if path.startswith("/v1/chat/"):
        assert error["param"].startswith(field.split(" ")[0]), error  # OpenAI's param names it too
    assert _references(live) == before


def test_multipart_text_fields_are_checked_too(live):
    before = _references(live)
    for data in ({"metadata": '{"colour": "\\ud800"}'}, {"metadata": '{"\\udfff": 1}'}):
        response = _send_form(live, "/v1/references", data)
        error = _json_error(response)
        assert (response.status_code, error["code"]) == (400, "invalid_input"), response.text
        assert error["message"].startswith("metadata") and "not valid Unicode" in error["message"], error
    assert _references(live) == before


def test_a_valid_surrogate_pair_is_text_like_any_other(live):
    with live.client(TENANT_KEY) as c:
        added = c.post("/v1/references", content=json.dumps(
            {"image": b64(photo_png(size=(40, 30))), "id": "emoji", "metadata": {"mood": "\U0001f600"}}).encode(),
            headers={"content-type": "application/json"})
        assert added.status_code == 201, added.text
        assert c.get("/v1/references/emoji").json()["metadata"] == {"mood": "\U0001f600"}
        assert c.delete("/v1/references/emoji").status_code == 200


def _references(live: LiveServer) -> list:
    with live.client(TENANT_KEY) as c:
        return c.get("/v1/references").json()["references"]


def _send_form(live: LiveServer, path: str, data: dict) -> httpx.Response:
    with live.client(TENANT_KEY) as c:
        return c.post(path, files={"image": ("x.png", photo_png(flip=True), "image/png")}, data=data)


# -- rubrics that would cost more than their size (issue 25 item 1) ----------------------------------
def _alias_bomb(levels: int = 8) -> str:
    """The issue's ~400-byte rubric: nine strings, then eight levels of nine aliases each (9**9 strings)."""
    lines = ["criteria:", "- &a0 [" + ",".join(["lol"] * 9) + "]"]
    lines += [f"- &a{i} [{','.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\n"


#: (route, body with a rubric that must be refused at parse time, the field the 400 names). Every route
#: that takes a rubric has rows: the YAML alias bomb, and JSON criteria too wide to be worth walking.
RUBRIC_FIELDS = [
    ("POST /v1/compare", {"candidate": _PNG, "criteria": _alias_bomb(), "ref_ids": ["cat"]}, "criteria"),
    ("POST /v1/compare", {"candidate": _PNG, "criteria": {"criteria": [["lol"] * 200] * 200}, "ref_ids": ["cat"]},
     "criteria"),
    ("POST /v1/compare", {"candidate": _PNG, "criteria": ["fur"] * 20000, "ref_ids": ["cat"]}, "criteria"),
]


@pytest.mark.timeout(60)  # a guard only: the bomb's expanded walk cost 36 s of a worker per request
@pytest.mark.parametrize(("route", "body", "field"), RUBRIC_FIELDS, ids=[f"{r} {i}" for i, (r, _, _) in enumerate(RUBRIC_FIELDS)])
def test_a_rubric_that_costs_more_than_its_size_is_400_and_holds_no_worker(live, route, body, field):
    method, path = route.split(" ", 1)
    content = json.dumps(body).encode()
    assert len(content) < MAX_BODY  # under the body limit: only the rubric's own bound can refuse it
    # Two at once (the server has two workers): neither may hold one, so a third, trivial request answers.
    headers = {**_credentials("tenant"), "content-type": "application/json"}
    with ThreadPoolExecutor(2) as pool:
        responses = list(pool.map(lambda _: _send(live, method, path, content=content, headers=headers), range(2)))
    for response in responses:
        error = _json_error(response)
        assert (response.status_code, error["code"]) in {(400, "invalid_input"), (400, "invalid_rubric")}, response.text
        assert error["message"].startswith((field, "criterion")), error  # the field, or the criterion in it
    with live.client(TENANT_KEY) as c:
        assert c.get("/v1/references").status_code == 200


def test_every_rubric_route_has_rows():
    """A route whose body takes a rubric (a ``criteria`` field) is attacked above."""
    taking = {f"{m} {p}" for m, p, _ in ENDPOINTS if m == "POST" and p in ("/v1/compare",)}
    assert taking <= {route for route, _, _ in RUBRIC_FIELDS}


# -- sampling values: inside the declared ranges they work, outside they are 400 (item 3) ------------
#: Values the chat route's schema accepts, at their edges: each must answer (never a 500).
SAMPLING_EDGES = [
    {"temperature": 1e-300, "seed": 1}, {"temperature": 5e-324, "seed": 2}, {"temperature": 2, "top_p": 1e-300, "seed": 3},
    {"temperature": 2, "top_p": 5e-324, "seed": 4}, {"temperature": 2, "top_p": 1, "seed": 2**63 - 1},
    {"temperature": 1e-12, "frequency_penalty": 2, "presence_penalty": -2, "seed": 0},
    {"temperature": 0, "frequency_penalty": -2, "presence_penalty": 2},
]
#: Values outside them: 400 naming the parameter, before any model work.
SAMPLING_OUT_OF_RANGE = [
    ({"temperature": -1e-300}, "temperature"), ({"temperature": 2.0000001}, "temperature"),
    ({"temperature": float("inf")}, "temperature"), ({"top_p": 0}, "top_p"), ({"top_p": 1.5}, "top_p"),
    ({"seed": -2}, "seed"), ({"seed": 2**64}, "seed"), ({"frequency_penalty": 2.5}, "frequency_penalty"),
    ({"presence_penalty": -3}, "presence_penalty"), ({"max_tokens": 0}, "max_tokens"),
]


@pytest.mark.parametrize(("fields", "param"), SAMPLING_OUT_OF_RANGE, ids=[p for _, p in SAMPLING_OUT_OF_RANGE])
def test_sampling_outside_its_range_is_400_naming_the_parameter(live, fields, param):
    body = {"model": "toy", "messages": _HI, **fields}
    # allow_nan: a hostile client may send the bare token Infinity, which Python's JSON reads.
    response = _send(live, "POST", "/v1/chat/completions", content=json.dumps(body, allow_nan=True).encode(),
                     headers={**_credentials("tenant"), "content-type": "application/json"})
    error = _json_error(response)
    assert response.status_code == 400, response.text
    assert error["param"] == param or error["message"].startswith(param), error


@pytest.fixture(scope="module")
def tiny_options() -> dict:
    """The shared real-model server (tests/server/conftest.py; the real transformers code, where 1e-300 used to be
    a 500), with the tenant key the tests send."""
    return {"keys": {TENANT_KEY: "team"}}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_sampling_at_the_edges_of_its_range_answers_on_a_real_model(tiny, stream):
    with tiny.client(TENANT_KEY) as c:
        for fields in SAMPLING_EDGES:
            body = {"model": "tiny-qwen2-vl", "messages": _HI, "max_tokens": 3, "stream": stream, **fields}
            response = c.post("/v1/chat/completions", json=body)
            assert response.status_code == 200, (fields, response.text[:300])
            if stream:
                assert response.text.rstrip().endswith("data: [DONE]"), (fields, response.text[-300:])
                assert '"error"' not in response.text, (fields, response.text[:300])
