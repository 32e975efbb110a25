"""Ollama's native API on ``refsight serve`` (the instant ``toy`` model, real uvicorn on loopback, httpx):
the shapes, NDJSON streaming by default, the 400s in Ollama's ``{"error": "..."}`` shape, what is refused,
stored references from an Ollama body, and API keys as tenants."""

from __future__ import annotations

import base64
import json

import pytest
from live_server import b64, photo_png

KEY, OTHER = "ollama-key-0001", "ollama-key-0002"


def _ollama_error(response, status: int, code: str) -> str:
    """The response is Ollama's error shape (``error`` a string), with refsight's stable code beside it."""
    assert response.status_code == status, (response.status_code, response.text)
    body = response.json()
    assert set(body) == {"error", "code"} and isinstance(body["error"], str), body
    assert body["code"] == code, body
    return body["error"]


def test_chat_streams_ndjson_by_default_and_ends_with_the_counts(client):
    response = client.post("/api/chat", json={"model": "toy", "messages": [{"role": "user", "content": "hi"}]})
    assert response.status_code == 200 and response.headers["content-type"].startswith("application/x-ndjson")
    lines = [json.loads(line) for line in response.text.splitlines()]
    assert [line["done"] for line in lines] == [False] * (len(lines) - 1) + [True]
    assert "".join(line["message"]["content"] for line in lines) == "[toy] 0 images: hi"
    last = lines[-1]
    assert last["done_reason"] == "stop" and last["model"] == "toy:latest" and last["created_at"].endswith("Z")
    for key in ("total_duration", "load_duration", "prompt_eval_count", "prompt_eval_duration", "eval_count",
                "eval_duration"):
        assert isinstance(last[key], int) and last[key] >= 0, key
    assert last["total_duration"] >= last["prompt_eval_duration"]


def test_generate_whole_with_images_system_and_the_load_request(client):
    image = b64(photo_png())
    body = {"model": "toy:latest", "prompt": "what?", "system": "be brief", "images": [image], "stream": False,
            "keep_alive": "5m", "options": {"num_thread": 2, "temperature": 0}}
    answer = client.post("/api/generate", json=body).json()
    assert answer["response"] == "[toy] 1 images: system: be brief user: what?" and answer["done"] is True
    assert answer["refsight"]["references_cached"] == [False]
    loaded = client.post("/api/generate", json={"model": "toy"}).json()
    assert (loaded["done"], loaded["done_reason"], loaded["response"]) == (True, "load", "")
    unloaded = client.post("/api/chat", json={"model": "toy", "messages": [], "keep_alive": 0}).json()
    assert unloaded["done_reason"] == "unload"


def test_a_stored_reference_is_named_as_text_or_as_the_base64_of_that_text(client):
    assert client.post("/v1/references", json={"image": b64(photo_png()), "id": "cat"}).status_code == 201
    named = base64.b64encode(b"refsight://ref/cat").decode()
    for image in ("refsight://ref/cat", named):
        answer = client.post("/api/chat", json={"model": "toy", "stream": False, "messages": [
            {"role": "user", "content": "same?", "images": [image, b64(photo_png(flip=True))]}]}).json()
        assert answer["refsight"]["references_cached"][0] is True, answer
    missing = client.post("/api/generate", json={"model": "toy", "prompt": "x", "images": ["refsight://ref/nope"]})
    assert "nope" in _ollama_error(missing, 404, "reference_not_found")


def test_model_endpoints(client):
    (entry,) = client.get("/api/tags").json()["models"]
    assert entry["name"] == entry["model"] == "toy:latest" and {"digest", "size", "details", "modified_at"} <= set(entry)
    (running,) = client.get("/api/ps").json()["models"]
    assert running["name"] == "toy:latest" and "expires_at" in running
    shown = client.post("/api/show", json={"model": "toy"}).json()
    assert "vision" in shown["capabilities"] and shown["details"]["family"] == "toy"
    assert client.get("/api/version").json()["version"]
    assert client.head("/").status_code == 200 and client.get("/").headers["content-type"].startswith("text/html")


def test_num_ctx_is_accepted_and_the_reply_names_the_context_it_had(client):
    ask = {"model": "toy", "stream": False, "messages": [{"role": "user", "content": "hi"}]}
    plain = client.post("/api/chat", json=ask).json()
    assert "num_ctx" not in plain["refsight"]
    for path, body in (("/api/chat", ask), ("/api/generate", {"model": "toy", "prompt": "hi", "stream": False})):
        sized = client.post(path, json={**body, "options": {"num_ctx": 32768}})
        assert sized.status_code == 200, sized.text
        assert sized.json()["refsight"]["num_ctx"] is None  # the toy echo has no fixed context window
    lines = client.post("/api/chat", json={**ask, "stream": True, "options": {"num_ctx": 2048}}).text.splitlines()
    assert json.loads(lines[-1])["refsight"]["num_ctx"] is None and "refsight" not in json.loads(lines[0])


def test_show_writes_modelfile_parameters_and_template_as_ollama_does(client):
    shown = client.post("/api/show", json={"model": "toy"}).json()
    assert shown["template"] == "" and shown["parameters"] == ""  # the echo has no template, no params layer
    first, *_ = shown["modelfile"].splitlines()
    assert first.startswith('# Modelfile generated by "ollama show"') and "\nFROM toy\n" in shown["modelfile"]
    assert "no chat template" in shown["modelfile"]


@pytest.mark.parametrize(("path", "method"), [("/api/pull", "POST"), ("/api/push", "POST"), ("/api/create", "POST"),
                                              ("/api/delete", "DELETE"), ("/api/copy", "POST")])
def test_store_management_is_refused_saying_what_refsight_serves(client, path, method):
    message = _ollama_error(client.request(method, path, json={"model": "x"}), 400, "unsupported")
    assert "refsight" in message


@pytest.mark.parametrize(("body", "status", "code", "named"), [
    ({"think": True}, 400, "unsupported", '"toy:latest" does not support thinking'),  # Ollama's own 400
    ({"options": {"num_predict": "5"}}, 400, "invalid_input", "options.num_predict"),  # strict types
    ({"tools": [{"type": "function", "function": {"name": "f"}}]}, 400, "unsupported", "tools"),
    ({"logprobs": True}, 400, "unsupported", "logprobs"),
    ({"options": {"mirostat": 2}}, 400, "unsupported", "options.mirostat"),
    ({"options": {"num_ctx": "big"}}, 400, "invalid_input", "options.num_ctx"),
    ({"options": {"num_ctx": 0}}, 400, "invalid_input", "options.num_ctx"),
    ({"options": {"num_ctx": True}}, 400, "invalid_input", "options.num_ctx"),
    ({"options": {"temperature": "hot"}}, 400, "invalid_input", "options.temperature"),
    ({"options": {"num_predict": 5000}}, 400, "invalid_input", "options.num_predict"),
    ({"options": {"top_k": 5}}, 400, "unsupported", "options.top_k"),  # the toy echo samples nothing
    ({"format": {"type": "nope"}}, 400, "invalid_input", "format"),
    ({"stream": "yes please"}, 400, "invalid_input", "stream"),
])
def test_bad_input_is_ollamas_error_shape_naming_the_field(client, body, status, code, named):
    request = {"model": "toy", "messages": [{"role": "user", "content": "hi"}], **body}
    assert named in _ollama_error(client.post("/api/chat", json=request), status, code)


def test_a_name_not_served_follows_one_rule_on_every_generation_route(client, make_server):
    # Ollama's routes as /v1 and llama-server's: another name is answered by the served model, the reply naming it;
    # with --strict-model-name it is a 404 on each; /api/show is a lookup, always exact.
    chat = {"model": "llava:7b", "stream": False, "messages": [{"role": "user", "content": "hi"}]}
    generate = {"model": "llava:7b", "stream": False, "prompt": "hi"}
    openai = {"model": "llava:7b", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    for path, body, named in (("/api/chat", chat, "model"), ("/api/generate", generate, "model"),
                              ("/v1/chat/completions", openai, "model")):
        reply = client.post(path, json=body)
        assert reply.status_code == 200 and reply.json()[named].startswith("toy"), (path, reply.text)
    assert 'model "llava:7b" not found' in _ollama_error(client.post("/api/show", json={"model": "llava:7b"}), 404,
                                                        "model_not_found")
    with make_server(strict_model_names=True).client() as strict:
        for path, body in (("/api/chat", chat), ("/api/generate", generate)):
            assert 'model "llava:7b" not found' in _ollama_error(strict.post(path, json=body), 404, "model_not_found")
        assert strict.post("/v1/chat/completions", json=openai).status_code == 404


@pytest.mark.parametrize(("body", "named"), [
    ({"suffix": "end"}, "suffix"), ({"template": "{{ .Prompt }}"}, "template"), ({"context": [1, 2]}, "context"),
    ({"raw": True, "system": "s"}, "system"), ({"images": ["not base64!"]}, "images[0]"),
    ({"images": [b64(b"not an image")]}, "images[0]"),
])
def test_generate_refuses_what_it_cannot_honour(client, body, named):
    response = client.post("/api/generate", json={"model": "toy", "prompt": "hi", **body})
    assert response.status_code == 400 and response.json()["error"].startswith(named), response.text


def test_thinking_is_refused_and_tool_messages_where_no_template_renders_them(client):
    for message, said in (({"role": "tool", "content": "42"}, "cannot offer tools"),  # the toy echo has no template
                          ({"role": "assistant", "content": "", "thinking": "hm"}, "not supported")):
        response = client.post("/api/chat", json={"model": "toy", "messages": [message]})
        assert said in _ollama_error(response, 400, "unsupported")


def test_bearer_keys_are_tenants_and_errors_before_the_route_keep_ollamas_shape(make_server):
    live = make_server(keys={KEY: "team", OTHER: "other"})
    with live.client(KEY) as team, live.client(OTHER) as other, live.client() as anonymous:
        assert team.post("/v1/references", json={"image": b64(photo_png()), "id": "cat"}).status_code == 201
        body = {"model": "toy", "stream": False, "messages": [{"role": "user", "content": "x", "images": ["refsight://ref/cat"]}]}
        assert team.post("/api/chat", json=body).status_code == 200
        _ollama_error(other.post("/api/chat", json=body), 404, "reference_not_found")  # another tenant's id
        _ollama_error(anonymous.post("/api/chat", json=body), 401, "unauthorized")
        assert anonymous.get("/api/version").status_code == 200  # public, as Ollama's
        _ollama_error(anonymous.get("/api/nothing-here"), 401, "unauthorized")
        _ollama_error(team.get("/api/nothing-here"), 404, "not_found")
