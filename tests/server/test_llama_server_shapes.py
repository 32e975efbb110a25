"""The shapes llama-server clients read, over a real socket (issue 37): model names, stream chunks,
``system_fingerprint``, ``timings`` (per token too), streamed ``tokens``, ``generation_settings``,
two trailing assistant messages, ``/apply-template``'s fields, bodies without a JSON Content-Type,
the server defaults of ``--n-predict``/``--temp``/``--seed``, ``--no-webui``.

Each expectation is llama-server's documented behaviour (tools/server/README.md); the toy model keeps
them instant. What a real GGUF changes (``n_predict: -1`` filling the context) is in
``test_llama_server_api.py``.
"""

from __future__ import annotations

import json
import math

import httpx
import pytest

from live_server import LiveServer, assert_error
from runtimes import require_module

from refsight import ContextLengthError, GenerateResult
from refsight.server import ServerConfig, create_app
from refsight.server.intake.completion_parts import fill_context
from refsight.server.replies.timings import TokenClock

HI = [{"role": "user", "content": "hi"}]
GGUF = "tiny-qwen2-vl-gguf"
PROMPT = "<|im_start|>user\nName three colours.<|im_end|>\n<|im_start|>assistant\n"
TIMINGS = {"prompt_n", "prompt_ms", "prompt_per_token_ms", "prompt_per_second", "predicted_n", "predicted_ms",
           "predicted_per_token_ms", "predicted_per_second", "cache_n"}


def _events(response: httpx.Response) -> list[dict]:
    lines = [line[len("data: "):] for line in response.text.splitlines() if line.startswith("data: ")]
    return [json.loads(line) for line in lines if line != "[DONE]"]


def _finite(timings: dict) -> None:
    for name, value in timings.items():
        assert isinstance(value, (int, float)) and math.isfinite(value) and value >= 0, (name, value)


@pytest.fixture
def toy(make_server) -> LiveServer:
    return make_server(served_model_names=("local",))


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> LiveServer:
    """The tiny GGUF on llama.cpp: the raw-prompt routes need a backend that takes raw prompts."""
    require_module("llama_cpp")
    from refsight.builtin_models.gguf import ensure_gguf

    ensure_gguf(GGUF)
    store = tmp_path_factory.mktemp("llama-shapes")
    live = LiveServer(create_app(ServerConfig(store=store, model=GGUF, keys={}, served_model_names=("local",)))).start()
    yield live
    live.stop()


def test_chat_stream_starts_with_null_content_and_carries_fingerprint_and_timings(toy):
    with toy.client() as c:
        reply = c.post("/v1/chat/completions", json={"messages": HI}).json()
        assert reply["system_fingerprint"].startswith("refsight-")
        assert set(reply["timings"]) == TIMINGS
        _finite(reply["timings"])
        streamed = c.post("/v1/chat/completions", json={"messages": HI, "stream": True,
                                                         "stream_options": {"include_usage": True}})
        events = _events(streamed)
        assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
        assert all(e["system_fingerprint"] == reply["system_fingerprint"] for e in events)
        assert "timings" not in events[1]  # only with timings_per_token
        usage = events[-1]
        assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == usage["timings"]["predicted_n"]
        assert set(usage["timings"]) == TIMINGS
        per_token = _events(c.post("/chat/completions", json={"messages": HI, "stream": True, "timings_per_token": True}))
        assert "timings" not in per_token[0] and all("timings" in e for e in per_token[1:])  # llama-server's: not the role's
        _finite(per_token[1]["timings"])
        assert per_token[1]["timings"]["predicted_n"] == 1  # the toy hands its answer over in one piece
        # verbose needs the chat template as text, which the toy does not have: a 400 naming it, never ignored.
        refused = c.post("/v1/chat/completions", json={"messages": HI, "verbose": True})
        assert assert_error(refused, 400, "invalid_input")["param"] == "verbose"


def test_raw_prompt_routes_serve_any_model_name_and_carry_the_fingerprint(llama):
    with llama.client() as c:
        for route in ("/v1/completions", "/completions", "/completion"):
            reply = c.post(route, json={"model": "davinci-002", "prompt": PROMPT, "max_tokens": 2})
            assert reply.status_code == 200 and reply.json()["model"] == "local", reply.text
        assert c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 2}).json()["system_fingerprint"].startswith(
            "refsight-")


def test_completion_timings_settings_and_streamed_tokens(llama):
    with llama.client() as c:
        done = c.post("/completion", json={"prompt": PROMPT, "n_predict": 6, "return_tokens": True}).json()
        assert set(done["timings"]) == TIMINGS
        _finite(done["timings"])
        assert done["timings"]["predicted_n"] == done["tokens_predicted"] == len(done["tokens"])
        assert done["timings"]["cache_n"] == done["tokens_cached"]
        assert done["timings"]["prompt_n"] + done["timings"]["cache_n"] == done["tokens_evaluated"]
        settings = done["generation_settings"]
        assert {"logit_bias", "n_keep", "ignore_eos", "n_probs", "samplers", "mirostat", "typical_p", "stream",
                "timings_per_token", "max_tokens", "model"} <= set(settings)
        assert settings["n_predict"] == 6 and settings["logit_bias"] == []
        assert done["timings"]["predicted_per_second"] > 0  # several tokens: a real rate
        events = _events(c.post("/completion", json={"prompt": PROMPT, "n_predict": 6, "stream": True,
                                                      "timings_per_token": True}))
        pieces, last = events[:-1], events[-1]
        assert pieces and last["stop"] is True
        for piece in pieces:
            assert piece["stop"] is False and set(piece["timings"]) >= {"predicted_n", "predicted_ms", "prompt_ms"}
            tokens = c.post("/tokenize", json={"content": piece["content"], "parse_special": False}).json()["tokens"]
            assert piece["tokens"] == tokens and tokens
        assert last["generation_settings"]["stream"] is True
        _finite(last["timings"])
        # response_fields: only those, under their paths (one that names nothing is left out), as llama-server.
        fields = ["content", "generation_settings/n_predict", "timings/predicted_n", "nothing/here"]
        picked = c.post("/completion", json={"prompt": PROMPT, "n_predict": 6, "response_fields": fields}).json()
        assert picked == {"content": done["content"], "generation_settings/n_predict": 6, "timings/predicted_n": 6}
        assert len(c.post("/completion", json={"prompt": PROMPT, "n_predict": 2, "response_fields": []}).json()) > 3


def test_n_predict_minus_one_fills_the_rest_of_the_context(llama):
    n_ctx = llama.service.context_size
    with llama.client() as c:
        # Greedy on random weights rarely meets its end token: the answer runs into the context's end.
        body = {"prompt": PROMPT * (n_ctx // 40), "n_predict": -1, "ignore_eos": False}
        done = c.post("/completion", json=body, timeout=600).json()
        assert done["generation_settings"]["n_predict"] == -1
        if done["stop_type"] == "limit":
            assert done["truncated"] is True
            assert done["tokens_evaluated"] + done["tokens_predicted"] == n_ctx
        else:  # it met its end token first: not truncated
            assert done["truncated"] is False


def _result(**fields) -> GenerateResult:
    """A generation as the service returns it (only the fields a test names differ from nothing)."""
    return GenerateResult(**{"text": "", "tokens": [], "model": "m", "random_weights": True, "references_cached": [],
                             "timings_ms": {}, **fields})


def test_the_generation_rate_excludes_the_first_token():
    clock = TokenClock()
    clock.begin()
    assert clock.wrap(None) is None  # not streamed: the engine's own path
    tick = clock.wrap(lambda piece: None)
    tick("a")
    clock.stop()
    one = clock.final(_result(prompt_tokens=5, prefix_tokens_reused=2, tokens=[7]))
    assert one["predicted_n"] == 1 and one["predicted_per_second"] == 0 and one["predicted_per_token_ms"] == 0
    assert one["prompt_n"] == 3 and one["cache_n"] == 2
    clock.first -= 0.5  # as if the first token had come half a second before the end
    two = clock.final(_result(prompt_tokens=5, prefix_tokens_reused=0, tokens=[7, 8, 9]))
    # to the last digit, from the ms the reply shows (llama.cpp's test_metrics recomputes it so, within 1e-6)
    assert abs(two["predicted_per_second"] - 1e3 / two["predicted_ms"] * 2) < 1e-9
    _finite(two)


def test_fill_context_retries_with_the_room_the_backend_names():
    asked: list[int] = []

    def generate(limit: int) -> GenerateResult:
        asked.append(limit)
        if limit > 90:
            raise ContextLengthError("max_new_tokens", "does not fit", n_prompt_tokens=10, n_ctx=100)
        return _result(finish_reason="length", tokens=[1] * limit)

    # The answers are typed to the edge (issue 36): truncated is an attribute, no longer a dict key.
    assert fill_context(generate, 100, 1024).truncated is True and asked == [100, 90]
    assert fill_context(lambda limit: _result(finish_reason="stop", tokens=[1]), None, 64).truncated is False

    def too_long(limit: int) -> GenerateResult:
        raise ContextLengthError("prompt", "too long", n_prompt_tokens=200, n_ctx=100)

    with pytest.raises(ContextLengthError):
        fill_context(too_long, 100, 1024)


def test_two_trailing_assistant_messages_are_a_400(toy):
    with toy.client() as c:
        messages = [*HI, {"role": "assistant", "content": "a"}, {"role": "assistant", "content": "b"}]
        error = assert_error(c.post("/v1/chat/completions", json={"messages": messages}), 400, "invalid_input")
        assert error["param"] == "messages"
        # One is continued (the prefill: tests/server/prefill_checks.py), which the toy, rendering no chat
        # template, refuses by name.
        one = assert_error(c.post("/v1/chat/completions", json={"messages": messages[:-1]}), 400, "unsupported")
        assert one["param"] == "messages" and "continue" in one["message"]


def test_apply_template_takes_add_generation_prompt_and_empty_tools(llama):
    with llama.client() as c:
        plain = c.post("/apply-template", json={"messages": HI})
        assert plain.status_code == 200, plain.text
        for extra in ({"add_generation_prompt": True}, {"tools": None}, {"tools": []}):
            assert c.post("/apply-template", json={"messages": HI, **extra}).json() == plain.json()
        # false: the same turns without the opening of the answer's turn, as llama-server renders them.
        closed = c.post("/apply-template", json={"messages": HI, "add_generation_prompt": False}).json()["prompt"]
        assert plain.json()["prompt"] == closed + "<|im_start|>assistant\n"
        # A chat's verbose: llama-server's __verbose, the answer as /completion gives it, the prompt as rendered.
        chat = {"messages": HI, "max_tokens": 3, "temperature": 0}
        verbose = c.post("/v1/chat/completions", json={**chat, "verbose": True}).json()
        assert verbose["__verbose"]["prompt"] == plain.json()["prompt"]
        assert verbose["__verbose"]["content"] == verbose["choices"][0]["message"]["content"]
        assert verbose["__verbose"]["tokens_predicted"] == verbose["usage"]["completion_tokens"]
        assert "__verbose" not in c.post("/v1/chat/completions", json={**chat, "verbose": False}).json()
        # Tools go to the template as llama-server hands them over: the tiny GGUF's template reads none of them.
        tools = [{"type": "function", "function": {"name": "f"}}]
        assert c.post("/apply-template", json={"messages": HI, "tools": tools}).json() == plain.json()
        refused = c.post("/apply-template", json={"messages": HI, "tools": [{"type": "web_search"}]})
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "tools[0].type", refused.text


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded"])
def test_a_body_without_a_json_content_type_is_read_as_json(llama, content_type):
    headers = {"content-type": content_type} if content_type else {}
    with llama.client() as c:
        for route, body in (("/v1/chat/completions", {"messages": HI, "max_tokens": 2}), ("/tokenize", {"content": "hi"}),
                            ("/completion", {"prompt": PROMPT, "n_predict": 2})):
            request = c.build_request("POST", route, content=json.dumps(body).encode(), headers=headers)
            assert request.headers.get("content-type") == content_type
            reply = c.send(request)
            assert reply.status_code == 200, (route, reply.text)
        bad = c.post("/tokenize", content=b"{not json", headers=headers)
        assert bad.status_code in (400, 422)  # still checked as JSON


def test_server_defaults_n_predict_temp_seed_and_no_webui(make_server):
    live = make_server(n_predict=7, webui=False)
    with live.client() as c:
        assert c.get("/props").json()["default_generation_settings"]["params"]["n_predict"] == 7
        assert all("params" not in s for s in c.get("/slots").json())  # no slot has run a task yet
        assert c.get("/").status_code == 404
        assert c.get("/health").status_code == 200
    # --temp is a default the toy backend cannot honour: requests say so by name, never ignore it.
    hot = make_server(sampling_defaults={"temperature": 0.8, "seed": 3})
    with hot.client() as c:
        assert assert_error(c.post("/v1/chat/completions", json={"messages": HI}), 400, "unsupported")["param"] == "temperature"
        assert c.post("/v1/chat/completions", json={"messages": HI, "temperature": 0}).status_code == 400  # the seed
        assert c.post("/v1/chat/completions", json={"messages": HI, "temperature": 0, "seed": -1}).status_code == 200
