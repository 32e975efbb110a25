"""Vertex AI's prediction protocol (llama-server's ``AIP_MODE=PREDICTION``): each instance answered by the route its
``@requestFormat`` names, with the caller's key, in order; a bad instance answered in its place; the health route;
and ``refsight serve`` reading the environment as llama-server does. A live server on the toy model, with a key."""

from __future__ import annotations

import argparse

import pytest

from refsight.cli.arguments import UsageError
from refsight.cli.serving import vertex_settings
from refsight.server.routes.vertex import MAX_INSTANCES, request_format

KEY = "key-vertex-1234"
HI = [{"role": "user", "content": "hi"}]


def test_instances_are_dispatched_to_the_routes_their_format_names(make_server):
    server = make_server(keys={KEY: "default"}, vertex_predict_route="/predict", vertex_health_route="/ping")
    body = {"instances": [
        {"@requestFormat": "chatCompletions", "max_tokens": 4, "messages": HI, "stream": True},
        {"@requestFormat": "/v1/chat/completions", "max_tokens": 4, "messages": HI},
        {"@requestFormat": "messages", "max_tokens": 4, "messages": HI},  # Anthropic's
        {"@requestFormat": "chatCompletions", "max_tokens": "4", "messages": HI},  # the route's own 400
        {"@requestFormat": "nowhere"}, {"max_tokens": 4}, [1],
    ]}
    with server.client(KEY) as client:
        reply = client.post("/predict", json=body)
        assert reply.status_code == 200, reply.text
        first, second, tokens, refused, *bad = reply.json()["predictions"]
        assert first["object"] == second["object"] == "chat.completion" and first["choices"][0]["message"]["content"]
        assert tokens["type"] == "message" and refused["error"]["param"] == "max_tokens"
        assert [b["error"]["message"] for b in bad] == [
            "no handler registered for @requestFormat: nowhere", "each instance must include a string @requestFormat",
            "each instance must be a JSON object"]
        assert client.get("/ping").json() == client.get("/health").json()
        too_many = client.post("/predict", json={"instances": [{"@requestFormat": "messages"}] * (MAX_INSTANCES + 1)})
        assert too_many.status_code == 400 and "instances" in too_many.text
        broken = client.post("/predict", content=b'{"instances": [', headers={"content-type": "application/json"})
        assert broken.status_code == 400 and broken.json()["error"]["message"], broken.text  # named, never a 500
        # Read as JSON whatever its label, as llama-server reads it, so the edge's bounds hold for it too.
        deep = client.post("/predict", content=b"[" * 200_000, headers={"content-type": "text/plain"})
        assert deep.status_code == 400 and "nested" in deep.json()["error"]["message"], deep.text
    with server.client() as anonymous:  # the caller's key is each instance's key
        assert anonymous.post("/predict", json=body).status_code == 401


def test_the_formats_are_llama_servers_and_serve_reads_the_environment(monkeypatch, capsys):
    assert [request_format(p) for p in ("/v1/chat/completions", "/apply-template", "/v1/messages/count_tokens",
                                        "/api/chat", "/v1/models/{model_id}")] == [
        "chatCompletions", "applyTemplate", "messagesCountTokens", "apiChat", "models"]
    args = argparse.Namespace(port=8000)
    assert vertex_settings(args) == {}  # no AIP_MODE: not Vertex AI
    monkeypatch.setenv("AIP_MODE", "PREDICTION")
    monkeypatch.setenv("AIP_HTTP_PORT", "8081")
    assert vertex_settings(args) == {"vertex_predict_route": "/predict", "vertex_health_route": None}
    assert args.port == 8081 and "AIP_HTTP_PORT 8081, not --port 8000" in capsys.readouterr().err
    monkeypatch.setenv("AIP_HTTP_PORT", "x")
    with pytest.raises(UsageError, match="AIP_HTTP_PORT=x"):
        vertex_settings(args)
