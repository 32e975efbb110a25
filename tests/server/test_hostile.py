"""Hostile input against EVERY route of the app: new endpoints join by default.

The routes are enumerated from ``app.routes`` at collection time, so an endpoint
added later is attacked here without anyone writing a test for it. Each case is sent
to each route and method of a live server with API keys:

- JSON nested 1000 deep, a ``where`` of 2000 keys, control characters in every string
  and in the path, with valid credentials;
- a body over the limit with no key; ``Basic`` auth; a bearer token and ``X-API-Key``
  that disagree; a repeated ``Authorization`` header.

Never a 5xx; every 4xx is the documented JSON error body; and where the answer is
known for every route (deep JSON: 400, missing or ambiguous credentials: 401 on a
route that needs a key), it is asserted exactly.
"""

from __future__ import annotations

import json
from urllib.parse import quote

import httpx
import pytest
from fastapi.routing import APIRoute
from live_server import LiveServer, b64, photo_png

from refsight.server import ServerConfig, create_app
from refsight.server.gate import OPERATOR, PUBLIC, flat_routes, route_guard

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
        assert error["code"] == "invalid_reference_id", error


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
