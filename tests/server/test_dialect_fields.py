"""The one policy of every dialect's body, field by field (the instant ``toy`` model, one in-process server):

- a field refsight does not know, and a hint (its value cannot change the answer), is accepted and named in the
  reply's ``refsight.ignored``, wherever that dialect's reply carries refsight's object (logged once);
- a field that would change the answer is honoured, or refused with a 400 naming it and the reason;
- strict types: a string is not a number or a boolean, a number is not a boolean (400/422 naming the field).

The toy honours no sampling field and reads no chat template, so "honoured" is proven on real runtimes
(``test_llama_server_api.py``: the window of the repetition penalty, the template's variables); here the toy's
refusals show the fields are known.
"""

from __future__ import annotations

import json
import logging

import pytest

from live_server import LiveServer
from refsight.server import ServerConfig, create_app

HI = [{"role": "user", "content": "hi"}]
#: What Open WebUI's OpenAI connection copies to the top level of a /v1 body (Ollama's settings): hints here.
OPEN_WEBUI_HINTS = {"num_ctx": 2048, "keep_alive": "5m", "num_keep": 24, "num_batch": 512, "num_thread": 2,
                    "num_gpu": 0, "use_mmap": True, "use_mlock": True, "mirostat_eta": 0.1, "mirostat_tau": 5}


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    live = LiveServer(create_app(ServerConfig(store=tmp_path_factory.mktemp("fields"), model="toy", keys={}))).start()
    with live.client() as client:
        yield client
    live.stop()


def _sse(text: str) -> list[dict]:
    return [json.loads(line[5:]) for line in text.splitlines() if line.startswith("data:") and line != "data: [DONE]"]


def _ndjson(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


#: Where each dialect's reply carries refsight's object: ``read(response) -> the refsight object``.
READERS = {
    "openai": lambda r: r.json()["refsight"],
    "openai-stream": lambda r: next(e["refsight"] for e in _sse(r.text) if "refsight" in e),
    "ollama": lambda r: r.json()["refsight"],
    "ollama-stream": lambda r: _ndjson(r.text)[-1]["refsight"],
    "anthropic": lambda r: r.json()["refsight"],
    "anthropic-stream": lambda r: _sse(r.text)[0]["message"]["refsight"],
}


@pytest.mark.parametrize(("path", "body", "reader", "ignored"), [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi", "name": "me"}], "made_up": 1,
                              "cache_prompt": True, "user": "u", **OPEN_WEBUI_HINTS},
     "openai", [*sorted(["cache_prompt", *OPEN_WEBUI_HINTS, "made_up", "user"]), "messages[0].name"]),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi", "x": 1}]}],
                              "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}},
     "openai-stream", ["messages[0].content[0].x", "stream_options.continuous_usage_stats"]),
    ("/api/chat", {"model": "toy", "stream": False, "messages": HI, "wat": 1, "truncate": True,
                   "options": {"num_thread": 2, "numa": False, "made_up": 1, "response_format": {"type": "text"}}},
     "ollama", ["truncate", "wat", "options.made_up", "options.num_thread", "options.numa", "options.response_format"]),
    ("/api/chat", {"model": "toy", "messages": HI, "options": {"num_gpu": 0}}, "ollama-stream", ["options.num_gpu"]),
    ("/api/generate", {"model": "toy", "stream": False, "prompt": "hi", "context_window": 1},
     "ollama", ["context_window"]),
    ("/api/chat", {"model": "toy", "messages": [], "options": {"use_mmap": True}}, "ollama", ["options.use_mmap"]),
    ("/v1/messages", {"max_tokens": 4, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}]}], "metadata": {"user_id": "u"},
        "made_up": 1}, "anthropic", ["made_up", "metadata", "messages[0].content[0].cache_control"]),
    ("/v1/messages", {"max_tokens": 4, "messages": HI, "stream": True, "service_tier": "auto"},
     "anthropic-stream", ["service_tier"]),
])
def test_unknown_fields_and_hints_are_accepted_and_named_in_refsight_ignored(toy, path, body, reader, ignored):
    response = toy.post(path, json=body)
    assert response.status_code == 200, response.text
    assert READERS[reader](response)["ignored"] == ignored


def test_a_model_that_cannot_think_says_so_and_show_names_what_it_ignored(toy):
    shown = toy.post("/api/show", json={"model": "toy", "wat": 1}).json()
    assert "thinking" not in shown["capabilities"] and shown["refsight"] == {"ignored": ["wat"]}


def test_a_reply_without_ignored_fields_names_none(toy):
    assert "ignored" not in toy.post("/v1/chat/completions", json={"messages": HI}).json()["refsight"]
    assert "refsight" not in toy.post("/v1/messages", json={"max_tokens": 4, "messages": HI}).json()


@pytest.mark.parametrize(("path", "body", "field"), [
    # issue 60, group 7: each answered 200 before.
    ("/v1/messages", {"max_tokens": "5", "messages": HI}, "max_tokens"),
    ("/v1/messages", {"max_tokens": 5, "messages": HI, "stream": "yes"}, "stream"),
    ("/api/chat", {"model": "toy", "messages": HI, "options": {"num_predict": "5"}}, "options.num_predict"),
    ("/completion", {"prompt": "x", "n_probs": "5"}, "n_probs"),
    ("/completion", {"prompt": "x", "logit_bias": {"15": "1"}}, "logit_bias.15"),
    ("/completion", {"prompt": "x", "timings_per_token": 5}, "timings_per_token"),
    ("/completion", {"prompt": "x", "continue_final_message": "yes"}, "continue_final_message"),
    ("/tokenize", {"content": "x", "add_special": "yes"}, "add_special"),
    # The same mechanism on every body: numbers, booleans, hints and nested parts alike.
    ("/v1/chat/completions", {"messages": HI, "temperature": "0.5"}, "temperature"),
    ("/v1/chat/completions", {"messages": HI, "seed": True}, "seed"),
    ("/v1/chat/completions", {"messages": HI, "max_tokens": 5.0}, "max_tokens"),
    ("/v1/chat/completions", {"messages": HI, "num_ctx": "2048"}, "num_ctx"),
    ("/v1/chat/completions", {"messages": HI, "use_mmap": 1}, "use_mmap"),
    ("/v1/chat/completions", {"messages": HI, "stream": True, "stream_options": {"include_usage": "yes"}},
     "stream_options.include_usage"),
    ("/v1/chat/completions", {"messages": HI, "think": "yes"}, "think"),
    ("/v1/completions", {"prompt": "x", "logprobs": "2"}, "logprobs"),
    ("/api/chat", {"model": "toy", "messages": HI, "options": {"use_mlock": "true"}}, "options.use_mlock"),
    ("/api/chat", {"model": "toy", "messages": HI, "options": {"temperature": True}}, "options.temperature"),
    ("/api/chat", {"model": "toy", "messages": HI, "keep_alive": True}, "keep_alive"),
    ("/api/generate", {"model": "toy", "prompt": "x", "raw": "yes"}, "raw"),
    ("/v1/messages", {"max_tokens": 5, "messages": HI, "temperature": "1"}, "temperature"),
    ("/v1/messages/count_tokens", {"messages": HI, "metadata": "x"}, "metadata"),
    ("/detokenize", {"tokens": ["1"]}, "tokens.0"),
    ("/apply-template", {"messages": HI, "add_generation_prompt": "no"}, "add_generation_prompt"),
])
def test_a_string_is_no_number_or_boolean_and_a_number_no_boolean_on_every_dialect(toy, path, body, field):
    response = toy.post(path, json=body)
    assert response.status_code in (400, 422), response.text
    error = response.json()
    message = error["error"] if isinstance(error["error"], str) else error["error"]["message"]
    assert message.startswith(f"{field}: "), message


@pytest.mark.parametrize(("path", "body", "field", "reason"), [
    ("/v1/chat/completions", {"messages": HI, "typical_p": 0.5}, "typical_p", "locally typical sampling"),
    ("/v1/chat/completions", {"messages": HI, "samplers": ["top_k"]}, "samplers", "sampler order is fixed"),
    ("/v1/chat/completions", {"messages": HI, "guided_json": {"type": "object"}}, "guided_json", "response_format"),
    ("/v1/chat/completions", {"messages": HI, "min_tokens": 3}, "min_tokens", "minimum answer length"),
    ("/v1/chat/completions", {"messages": HI, "logit_bias": {"15": 1}}, "logit_bias", "does not support"),
    ("/v1/chat/completions", {"messages": HI, "repeat_penalty": 1.1, "repeat_last_n": 64}, "repetition_penalty",
     "does not support"),
    ("/v1/chat/completions", {"messages": HI, "chat_template_kwargs": {"messages": []}},
     "chat_template_kwargs.messages", "refsight sets messages"),
    ("/v1/chat/completions", {"messages": HI, "think": True, "reasoning_effort": "none"}, "think", "give one"),
    ("/api/chat", {"model": "toy", "messages": HI, "options": {"mirostat": 2}}, "options.mirostat", "mirostat"),
    # Ollama's own answer for a model that cannot think (llama-server's: the variable unread, 200; see below).
    ("/api/chat", {"model": "toy", "messages": HI, "think": "medium"}, '"toy:latest" does not support thinking', ""),
    ("/v1/messages", {"max_tokens": 4, "messages": HI, "mcp_servers": [{"name": "x"}]}, "mcp_servers", "MCP servers are not supported"),
])
def test_a_field_that_would_change_the_answer_is_refused_by_name_where_it_is_not_honoured(toy, path, body, field,
                                                                                         reason):
    response = toy.post(path, json=body)
    assert response.status_code == 400, response.text
    error = response.json()
    message = error["error"] if isinstance(error["error"], str) else error["error"]["message"]
    assert message.startswith(field) and reason in message, message


@pytest.mark.parametrize(("path", "body", "reader", "ignored"), [
    # Open WebUI's advanced parameters at the values its UI fills in (issue 61): answered, each as it means.
    ("/v1/chat/completions", {"messages": HI, "max_tokens": -1}, "openai", None),
    ("/v1/chat/completions", {"messages": HI, "logit_bias": ""}, "openai", None),
    ("/v1/chat/completions", {"messages": HI, "repeat_last_n": 64}, "openai", None),  # no penalty: no window
    ("/v1/chat/completions", {"messages": HI, "reasoning_effort": "medium", "think": False}, "openai",
     ["reasoning_effort", "think"]),  # llama-server's answer: the toy's template reads neither variable
    ("/api/chat", {"model": "toy", "stream": False, "messages": HI, "think": False,
                   "options": {"logit_bias": "", "repeat_last_n": 64, "reasoning_effort": "medium"}},
     "ollama", ["options.reasoning_effort", "think"]),
])
def test_open_webui_values_are_answered(toy, path, body, reader, ignored):
    response = toy.post(path, json=body)
    assert response.status_code == 200, response.text
    assert READERS[reader](response).get("ignored") == ignored


def test_an_ignored_field_is_logged_once(toy, caplog):
    body = {"messages": HI, "a_field_nobody_sent_before": 1, "messages_name": 2}
    with caplog.at_level(logging.INFO, logger="refsight.server"):
        for _ in range(3):
            assert toy.post("/v1/chat/completions", json=body).status_code == 200
    logged = [r.getMessage() for r in caplog.records if "a_field_nobody_sent_before" in r.getMessage()]
    assert len(logged) == 1 and "/v1/chat/completions" in logged[0] and "messages_name" in logged[0], logged


def test_the_servers_verbose_adds_no_verbose_where_the_template_is_not_text(tmp_path):
    # refsight serve -v is llama-server's --verbose (every chat's __verbose); a backend that shows no template as
    # text answers without it, unless the request asks for it by name.
    live = LiveServer(create_app(ServerConfig(store=tmp_path, model="toy", keys={}, verbose=True))).start()
    try:
        with live.client() as client:
            plain = client.post("/v1/chat/completions", json={"messages": HI})
            assert plain.status_code == 200 and "__verbose" not in plain.json(), plain.text
            asked = client.post("/v1/chat/completions", json={"messages": HI, "verbose": True})
            assert asked.status_code == 400 and asked.json()["error"]["param"] == "verbose", asked.text
    finally:
        live.stop()
