"""Anthropic's Messages API (``/v1/messages``, ``/v1/messages/count_tokens``; issue 51), with Anthropic's own SDK.

The toy model proves the shapes, the event names and every refusal (Anthropic's error shape, the field
named); the tiny GGUF proves the model path: an image block answers exactly as the same message on
``/v1/chat/completions`` (one service call), streamed or not, and ``count_tokens`` is the prompt's count.
"""

from __future__ import annotations

import json

import pytest
from runtimes import require_module

from live_server import LiveServer, b64, photo_png
from refsight.server import ServerConfig, create_app

MESSAGES = [{"role": "user", "content": "Say hello"}]


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    live = LiveServer(create_app(ServerConfig(store=tmp_path_factory.mktemp("anthropic"), model="toy", keys={}))).start()
    yield live
    live.stop()


def http_post(live, path: str, body: dict) -> dict:
    with live.client() as http:
        return http.post(path, json=body).json()


def _refused(response, param: str, kind: str = "invalid_request_error") -> None:
    assert response.status_code == 400, response.text
    body = response.json()
    assert body["type"] == "error" and body["error"]["type"] == kind, body
    assert body["error"]["param"] == param and param in body["error"]["message"], body


def test_the_anthropic_sdk_reads_messages_and_events(toy):
    anthropic = require_module("anthropic", "pip install anthropic")
    client = anthropic.Anthropic(base_url=toy.url, api_key="unused")
    message = client.messages.create(model="any", max_tokens=20, system="Be brief.", messages=MESSAGES)
    assert message.type == "message" and message.role == "assistant" and message.content[0].type == "text"
    assert message.stop_reason in ("end_turn", "max_tokens") and message.usage.output_tokens >= 0
    with client.messages.stream(model="any", max_tokens=20, system="Be brief.", messages=MESSAGES) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == final.content[0].text == message.content[0].text
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model="any", max_tokens=20, messages=MESSAGES,
                               tools=[{"name": "f", "input_schema": {"type": "object"}}])
    assert e.value.body["error"]["type"] == "invalid_request_error" and "tools" in e.value.body["error"]["message"]


def test_the_stream_is_anthropics_events_in_order(toy):
    with toy.client() as client, client.stream(
        "POST", "/v1/messages", json={"max_tokens": 20, "messages": MESSAGES, "stream": True}
    ) as r:
        lines = [line for line in r.iter_lines() if line]
    names = [line[7:] for line in lines if line.startswith("event: ")]
    data = [json.loads(line[6:]) for line in lines if line.startswith("data: ")]
    assert names == [d["type"] for d in data]
    assert names[0] == "message_start" and names[1] == "content_block_start" and names[-3:] == [
        "content_block_stop", "message_delta", "message_stop"]
    assert set(names[2:-3]) == {"content_block_delta"} and data[0]["message"]["content"] == []
    assert data[-2]["delta"]["stop_reason"] in ("end_turn", "max_tokens")


def test_what_refsight_cannot_honour_is_refused_by_name_in_anthropics_shape(toy):
    image = {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}
    with toy.client() as client:
        def post(**body):
            return client.post("/v1/messages", json={"max_tokens": 8, "messages": MESSAGES, **body})

        _refused(post(tools=[{"name": "f", "input_schema": {"type": "object"}}]), "tools")
        _refused(post(tool_choice={"type": "any"}), "tool_choice")
        _refused(post(thinking={"type": "enabled", "budget_tokens": 1024}), "thinking.budget_tokens")  # >= max_tokens
        _refused(post(thinking={"type": "enabled", "budget_tokens": "4"}), "thinking.budget_tokens")
        _refused(post(thinking={"type": "adaptive"}), "thinking.type")
        # enabled: the template's enable_thinking, as llama-server sets it (the toy reads no template: named)
        thinking = post(thinking={"type": "enabled", "budget_tokens": 4})
        assert thinking.status_code == 200 and thinking.json()["refsight"]["ignored"] == ["thinking"], thinking.text
        _refused(post(messages=[*MESSAGES, {"role": "assistant", "content": "Hi"}]), "messages", "invalid_request_error")
        _refused(post(stop_sequences=["a", "b", "c", "d", "e"]), "stop_sequences")
        # A tool result is a tool message: the toy echo renders no chat template to offer tools in.
        _refused(post(messages=[{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "1"}]}]),
                 "messages")
        _refused(client.post("/v1/messages", json={"messages": MESSAGES}), "max_tokens")
        refused = post(messages=[{"role": "user", "content": [image, {"type": "text", "text": "?"}]}])
        assert refused.status_code == 400 and refused.json()["type"] == "error", refused.text  # no remote media here
        _refused(post(max_tokens="5"), "max_tokens")  # strict types: a string is no number
        _refused(post(stream="yes"), "stream")
        hints = post(metadata={"user_id": "u"}, thinking={"type": "disabled"}, tool_choice={"type": "none"}, container="x",
                     made_up=1)
        assert hints.status_code == 200, hints.text  # the toy reads no template: thinking's variable changes nothing
        assert hints.json()["refsight"]["ignored"] == ["container", "made_up", "metadata", "thinking"]


@pytest.mark.slow  # a server on the tiny GGUF (llama-cpp-python: an optional runtime)
def test_an_image_block_answers_as_the_chat_route_and_count_tokens_counts_the_prompt(tmp_path):
    require_module("llama_cpp.mtmd_cpp", "pip install 'refsight[llamacpp]'")
    anthropic = require_module("anthropic", "pip install anthropic")
    from refsight.builtin_models.gguf import ensure_gguf

    ensure_gguf("tiny-qwen2-vl-gguf")  # built before the server starts, so start-up is only the load
    live = LiveServer(create_app(ServerConfig(store=tmp_path, model="tiny-qwen2-vl-gguf", keys={}))).start()
    try:
        photo = b64(photo_png())
        blocks = [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": photo}},
                  {"type": "text", "text": "What is this?"}]
        client = anthropic.Anthropic(base_url=live.url, api_key="unused")
        message = client.messages.create(model="m", max_tokens=6, system="Be brief.",
                                         messages=[{"role": "user", "content": blocks}])
        with live.client() as http:
            chat = http.post("/v1/chat/completions", json={"max_tokens": 6, "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": f"data:image/png;base64,{photo}"}},
                                             {"type": "text", "text": "What is this?"}]}]}).json()
        assert message.content[0].text == chat["choices"][0]["message"]["content"]
        usage = message.usage
        assert usage.input_tokens + usage.cache_read_input_tokens == chat["usage"]["prompt_tokens"]
        text_only = http_post(live, "/v1/chat/completions", {"max_tokens": 1, "messages": [
            {"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is this?"}]})
        counted = client.messages.count_tokens(model="m", system="Be brief.", messages=[{"role": "user", "content": "What is this?"}])
        assert counted.input_tokens == text_only["usage"]["prompt_tokens"]
        # A fresh image llama.cpp lays out only when it encodes it: not counted (a lower bound).
        with_image = client.messages.count_tokens(model="m", system="Be brief.", messages=[{"role": "user", "content": blocks}])
        assert counted.input_tokens <= with_image.input_tokens < chat["usage"]["prompt_tokens"]
        with client.messages.stream(model="m", max_tokens=6, messages=[{"role": "user", "content": blocks}],
                                    system="Be brief.") as stream:
            assert "".join(stream.text_stream) == message.content[0].text
        # A final assistant message is Anthropic's prefill: continued as the chat route continues it (llama-server's).
        prefill = [{"role": "user", "content": "What is this?"}, {"role": "assistant", "content": "It is"}]
        continued = client.messages.create(model="m", max_tokens=6, messages=prefill)
        chat = http_post(live, "/v1/chat/completions", {"max_tokens": 6, "messages": prefill})
        assert continued.content[0].text == chat["choices"][0]["message"]["content"]
        assert client.messages.count_tokens(model="m", messages=prefill).input_tokens == chat["usage"]["prompt_tokens"]
    finally:
        live.stop()
