"""Every HTTP body decoded and checked one way, on every route (issue 49, items 5, 6, 9 and 12), over loopback.

- a JSON body in UTF-16 or UTF-32 (RFC 7159 section 8.1) is read as its UTF-8 twin and checked the same
  way: a ``\\ud800`` escape is a 400 naming the field on every dialect's routes (it was a 500, or 200 with
  U+FFFD on ``/apply-template``); bytes that do not decode (a raw encoded lone surrogate, ``0xff``) are a
  400 naming the body;
- a body of more values than the limit is refused before it is parsed; a path no route serves (404) or
  serves with another method (405) is answered before its body is read at all;
- Ollama's routes read JSON whatever the ``Content-Type`` (``curl -d`` sends form-urlencoded), as Ollama does;
- ``true`` is no number in any dialect's numeric fields (it was taken as 1), and (issue 60, group 7) a string is no
  number or boolean, nor a number a boolean, in any field of any body: pydantic's strict types, one mechanism
  (field-by-field tables of every dialect: ``test_dialect_fields.py``).
"""

from __future__ import annotations

import json
import socket
import types
import typing
from typing import Annotated, Any, Union

import httpx
import pytest
from fastapi.routing import APIRoute
from live_server import photo_png
from pydantic import BaseModel, ValidationError

from refsight.server.intake.bodies import AddReferenceBody, CompareBody
from refsight.server.edge.gate import flat_routes
from refsight.server.routes.ollama_bodies import OllamaOptions
from refsight.server.edge.json_content import MAX_BODY_VALUES

BAD = "\ud800"
_HI = [{"role": "user", "content": "hi"}]

#: (route, JSON body holding BAD, the field the 400 must name): the routes the issue found answering 500 or U+FFFD.
TEXT_ROUTES = [
    ("/api/generate", {"model": "toy", "prompt": BAD}, "prompt"),
    ("/api/chat", {"model": "toy", "messages": [{"role": "user", "content": BAD}]}, "messages[0].content"),
    ("/completion", {"prompt": BAD}, "prompt"),
    ("/tokenize", {"content": BAD}, "content"),
    ("/chat/completions", {"messages": [{"role": "user", "content": BAD}]}, "messages[0].content"),
    ("/apply-template", {"messages": [{"role": "user", "content": BAD}]}, "messages[0].content"),
    ("/v1/search", {"text": BAD}, "text"),
]
#: The encodings RFC 7159 allows, with and without a byte-order mark ("utf-16": a mark, then little-endian).
ENCODINGS = ["utf-16", "utf-16-be", "utf-32-le", "utf-8-sig"]


def _error(response: httpx.Response) -> tuple[int, str, str]:
    """(status, code, message) of an error in any dialect's shape."""
    body = response.json()
    if isinstance(body["error"], str):  # Ollama's shape
        return response.status_code, body["code"], body["error"]
    return response.status_code, body["error"]["code"], body["error"]["message"]


def _post(client: httpx.Client, path: str, body: bytes, content_type: str | None = "application/json") -> httpx.Response:
    return client.post(path, content=body, headers={"content-type": content_type} if content_type else {})


@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize(("path", "body", "field"), TEXT_ROUTES, ids=[r[0] for r in TEXT_ROUTES])
def test_a_lone_surrogate_is_400_naming_the_field_in_every_encoding(client, path, body, field, encoding):
    # json.dumps writes the escape \ud800, as a hostile client would; then the text goes out in `encoding`.
    response = _post(client, path, json.dumps(body).encode(encoding))
    status, code, message = _error(response)
    assert (status, code) == (400, "invalid_input"), response.text
    assert message.startswith(field) and "not valid Unicode" in message, message


@pytest.mark.parametrize(("raw", "named"), [
    (b'{"content": "\xed\xa0\x80"}', "not valid UTF-8 (byte 0xed at offset 13"),  # raw UTF-8 of U+D800
    (b'{"content": "\xff"}', "not valid UTF-8 (byte 0xff at offset 13"),
    ('{"content": "\ud800x"}'.encode("utf-16-le", "surrogatepass"), "not valid UTF-16-LE"),
    ('{"content": "\ud800"}'.encode("utf-32-be", "surrogatepass"), "not valid UTF-32-BE"),
])
@pytest.mark.parametrize("path", ["/tokenize", "/api/chat", "/v1/references"])
def test_bytes_that_do_not_decode_are_400_naming_the_body(client, path, raw, named):
    status, code, message = _error(_post(client, path, raw))
    assert (status, code) == (400, "invalid_input") and message.startswith(f"request body: {named}"), message


def _without_timings(response: httpx.Response) -> tuple[int, dict]:
    body = response.json()
    for volatile in ("created_at", "total_duration", "load_duration", "prompt_eval_duration", "eval_duration", "refsight"):
        body.pop(volatile, None)
    return response.status_code, body


def test_a_utf16_or_utf32_body_answers_as_its_utf8_twin(client):
    text = "héllo \U0001f600 [x]"
    routes = [  # (path, body, what of the answer shows the text as the route read it)
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": text}]},
         lambda answer: answer["choices"][0]["message"]["content"]),
        ("/api/generate", {"model": "toy", "prompt": text, "stream": False}, lambda answer: answer["response"]),
        ("/v1/search", {"text": text, "k": 1}, lambda answer: answer["results"]),
    ]
    for path, body, seen in routes:
        twin = _post(client, path, json.dumps(body, ensure_ascii=False).encode())
        assert twin.status_code == 200, twin.text
        for encoding in ("utf-16", "utf-16-be", "utf-32-le"):
            answer = _post(client, path, json.dumps(body, ensure_ascii=False).encode(encoding))
            assert answer.status_code == 200 and seen(answer.json()) == seen(twin.json()), (path, encoding, answer.text)
    assert text in seen_text(client, "utf-32-be")


def seen_text(client: httpx.Client, encoding: str) -> str:
    """What the toy model answers to a chat sent in ``encoding`` (it echoes the prompt's text)."""
    body = {"messages": [{"role": "user", "content": "héllo \U0001f600 [x]"}]}
    return _post(client, "/v1/chat/completions", json.dumps(body, ensure_ascii=False).encode(encoding)).json()[
        "choices"][0]["message"]["content"]


def test_a_body_of_more_values_than_the_limit_is_refused_before_it_is_parsed(client):
    many = b'{"model": "toy", "more": [' + b"[]," * MAX_BODY_VALUES + b"[]]}"
    status, code, message = _error(_post(client, "/api/show", many))
    assert (status, code) == (400, "invalid_input") and f"more than {MAX_BODY_VALUES} values" in message, message
    assert _post(client, "/api/show", b'{"model": "toy"}').status_code == 200


def _first_reply(port: int, method: str, path: str, *, declared: int = 10 << 20) -> bytes:
    """The server's first bytes after a request head declaring ``declared`` bytes of body, of which 1 KiB is sent."""
    with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
        head = (f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                f"Content-Length: {declared}\r\n\r\n")
        sock.sendall(head.encode() + b'"' + b"\\\"" * 512)
        try:
            return sock.recv(4096)
        except TimeoutError:
            return b""  # still waiting for the body


def test_a_path_no_route_serves_is_answered_before_its_body_is_read(server):
    assert _first_reply(server.port, "POST", "/no-such-route").startswith(b"HTTP/1.1 404")
    assert _first_reply(server.port, "POST", "/healthz").startswith(b"HTTP/1.1 405")  # a GET route
    assert _first_reply(server.port, "POST", "/tokenize") == b""  # a real route waits for its body (the contrast)


OLLAMA_BODIES = [
    ("/api/generate", {"model": "toy", "prompt": "Why is the sky blue?", "stream": False}),
    ("/api/chat", {"model": "toy", "messages": _HI, "stream": False}),
    ("/api/show", {"model": "toy"}),
]


@pytest.mark.parametrize("content_type", ["application/x-www-form-urlencoded", "text/plain", None])
@pytest.mark.parametrize(("path", "body"), OLLAMA_BODIES, ids=[p for p, _ in OLLAMA_BODIES])
def test_ollama_routes_read_json_whatever_the_content_type(client, path, body, content_type):
    # Ollama's documented examples are `curl URL -d '{...}'`: curl labels that form-urlencoded.
    labelled = _without_timings(_post(client, path, json.dumps(body).encode()))
    answer = _post(client, path, json.dumps(body).encode(), content_type)
    assert answer.status_code == 200, answer.text
    assert _without_timings(answer) == labelled


def test_a_multipart_upload_is_still_a_multipart_upload(client):
    files = {"image": ("cat.png", photo_png(), "image/png")}
    added = client.post("/v1/references", data={"id": "cat", "metadata": '{"a": 1}'}, files=files)
    assert added.status_code == 201, added.text
    assert client.get("/v1/references/cat").json()["metadata"] == {"a": 1}


# -- true is not 1 (item 12) ----------------------------------------------------------------------
@pytest.mark.parametrize(("path", "body", "named"), [
    ("/api/generate", {"model": "toy", "prompt": "x", "stream": False, "options": {"num_predict": True}}, "options.num_predict"),
    ("/api/chat", {"model": "toy", "messages": _HI, "stream": False, "options": {"temperature": True}}, "options.temperature"),
    ("/api/generate", {"model": "toy", "prompt": "x", "stream": False, "options": {"typical_p": True}}, "options.typical_p"),
    ("/api/generate", {"model": "toy", "prompt": "x", "stream": False, "options": {"num_thread": True}}, "options.num_thread"),
    ("/api/generate", {"model": "toy", "prompt": "x", "stream": False, "keep_alive": True}, "keep_alive"),
    ("/v1/chat/completions", {"messages": _HI, "max_tokens": True}, "max_tokens"),
    ("/v1/chat/completions", {"messages": _HI, "seed": False}, "seed"),
    ("/completion", {"prompt": "x", "n_predict": True}, "n_predict"),
    ("/v1/completions", {"prompt": "x", "n": True}, "n"),
    ("/v1/search", {"text": "cat", "k": True}, "k"),
])
def test_a_boolean_is_no_number_in_any_dialect(client, path, body, named):
    status, _, message = _error(client.post(path, json=body))
    assert 400 <= status < 500 and message.startswith(named), message


def _kinds(annotation: Any) -> set[Any]:
    """The types a field annotation admits (its union's members, through ``Annotated``)."""
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        return _kinds(typing.get_args(annotation)[0])
    if origin in (Union, types.UnionType):
        return {kind for arg in typing.get_args(annotation) for kind in _kinds(arg)}
    return {annotation}


def _body_models() -> set[type[BaseModel]]:
    """Every request body model of the app (those FastAPI reads, those read_body reads, the one Ollama's ``options``
    become) and the models inside them."""
    from refsight.server import ServerConfig, create_app

    app = create_app(ServerConfig(store="/nonexistent", model="toy", keys={}))
    stack: list[Any] = [AddReferenceBody, CompareBody, OllamaOptions]  # OllamaOptions: Ollama's options
    stack += [p.field_info.annotation for _, route in flat_routes(app.routes) if isinstance(route, APIRoute)
              for p in route.dependant.body_params]
    models: set[type[BaseModel]] = set()
    while stack:
        item = stack.pop()
        if isinstance(item, type) and issubclass(item, BaseModel):
            if item not in models:
                models.add(item)
                stack += [field.annotation for field in item.model_fields.values()]
        else:
            stack += list(typing.get_args(item))
    return models


def test_every_number_and_boolean_field_of_every_body_takes_its_own_type_alone():
    """The mechanism, not the examples: each int/float field of each body refuses ``true`` and ``"1"``, each
    boolean refuses ``1`` and ``"true"`` (a new field included)."""
    checked = []
    for model in _body_models():
        for name, field in model.model_fields.items():
            kinds = _kinds(field.annotation)
            wrong = [*((True, "1") if kinds & {int, float} else ()), *((1, "true") if bool in kinds else ())]
            if not wrong or str in kinds:
                continue
            key = field.alias or name
            for value in wrong:
                with pytest.raises(ValidationError) as e:
                    model.model_validate({key: value})
                assert any(err["loc"][:1] == (key,) for err in e.value.errors()), (model.__name__, key, value)
            checked.append(f"{model.__name__}.{key}")
    assert {"OllamaOptions.n_predict", "ChatBody.temperature", "ChatBody.max_completion_tokens", "SearchBody.k",
            "OllamaChatBody.top_logprobs", "MessagesBody.max_tokens", "MessagesBody.stream", "CompletionBody.n_probs",
            "CompletionBody.timings_per_token", "TokenizeBody.add_special", "ChatBody.num_ctx",
            "OllamaOptions.use_mmap"} <= set(checked), sorted(checked)


def test_the_bounds_of_every_numeric_field_reach_the_schema_as_json_schema_words():
    """pydantic writes a bound as ``minimum``/``maximum``, never raw (``ge``, which no client reads)."""
    from refsight.server import ServerConfig, create_app

    stack: list[Any] = [create_app(ServerConfig(store="/nonexistent", model="toy", keys={})).openapi()]
    raw = []
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            raw += [key for key in ("ge", "le", "gt", "lt") if key in item and "type" in item]
            stack += list(item.values())
        elif isinstance(item, list):
            stack += item
    assert not raw, raw
