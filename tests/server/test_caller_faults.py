"""Input that is the caller's fault is a 400 naming it, on a real tiny model over loopback: never a 500.

(Hardening round 3.) Extreme aspect ratios, which the models' image processors refuse, are refused
as bad images before any model work, on every door (references, chat, the CLI); an empty raw prompt
names ``prompt``; ``/detokenize`` takes strict integers only.
"""

from __future__ import annotations

import io

import pytest
from live_server import LiveServer, assert_error, b64, data_url
from PIL import Image

from refsight.cli import main

EXTREME = ((1, 10000), (10000, 1), (2, 40000), (65535, 1), (1, 65535))


def _refused(response, code: str = "invalid_input") -> dict:
    """A 400 with a JSON error body carrying ``code`` (the llama-server routes add OpenAI's type and param)."""
    assert response.status_code == 400, (response.status_code, response.text)
    error = response.json()["error"]
    assert error["code"] == code and "Traceback" not in error["message"], error
    return error


def _png(size: tuple[int, int]) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, (90, 120, 30)).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.mark.parametrize("size", EXTREME)
def test_extreme_aspect_ratios_are_a_bad_image_on_every_door(tiny, tmp_path, capsys, size):
    image = _png(size)
    with tiny.client() as c:
        error = assert_error(c.post("/v1/references", json={"image": b64(image), "id": "thin"}), 400, "invalid_image")
        assert "aspect ratio" in error["message"]
        chat = c.post("/v1/chat/completions", json={"model": "tiny-qwen2-vl", "max_tokens": 2, "messages": [
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(image)}},
                                         {"type": "text", "text": "what?"}]}]})
        _refused(chat, "invalid_image")
        assert c.get("/v1/references").json()["references"] == []
    path = tmp_path / "thin.png"
    path.write_bytes(image)
    assert main(["add", str(path), "--store", str(tmp_path / "store"), "--model", "toy"]) == 1
    assert "aspect ratio" in capsys.readouterr().err


@pytest.mark.parametrize("route, body", [
    ("/completion", {"prompt": ""}),
    ("/completion", {"prompt": "", "stream": True}),
    ("/completion", {"prompt": {"prompt_string": ""}}),
    ("/v1/completions", {"model": "tiny-qwen2-vl", "prompt": ""}),
])
def test_an_empty_raw_prompt_is_400_naming_the_prompt(tiny, route, body):
    with tiny.client() as c:
        error = _refused(c.post(route, json=body))
    assert "prompt" in error["message"] and "empty" in error["message"]


@pytest.mark.parametrize("tokens", [["1"], [True], [1.0]])
def test_detokenize_takes_strict_integers(tiny, tokens):
    with tiny.client() as c:
        assert _refused(c.post("/detokenize", json={"tokens": tokens}))["param"] == "tokens.0"
        assert c.post("/detokenize", json={"tokens": [1, 2]}).status_code == 200


@pytest.fixture(scope="module")
def small_context(tmp_path_factory, model_cache) -> LiveServer:
    """llama.cpp with a 256-position context (``refsight serve -c 256``)."""
    from refsight.backends.options import BackendOptions
    from refsight.server import ServerConfig, create_app

    config = ServerConfig(store=tmp_path_factory.mktemp("store"), model="tiny-qwen2-vl-gguf", keys={},
                          backend_options=BackendOptions(n_ctx=256))
    live = LiveServer(create_app(config)).start()
    yield live
    live.stop()


@pytest.mark.slow  # a server on the tiny model converted to GGUF (llama-cpp-python: an optional runtime)
@pytest.mark.parametrize("route, body", [
    ("/completion", {"prompt": "fur " * 350, "n_predict": 4}),
    ("/v1/chat/completions", {"model": "tiny-qwen2-vl-gguf", "max_tokens": 4,
                              "messages": [{"role": "user", "content": "fur " * 350}]}),
    ("/completion", {"prompt": "Describe a cat.", "n_predict": 400}),
])
def test_a_prompt_or_answer_longer_than_the_context_is_400_in_llama_servers_shape(small_context, route, body):
    with small_context.client() as c:
        error = _refused(c.post(route, json=body), "exceed_context_size_error")
    assert error["n_ctx"] == 256 and 0 < error["n_prompt_tokens"]
    # The server still answers what fits.
    with small_context.client() as c:
        assert c.post("/completion", json={"prompt": "Describe a cat.", "n_predict": 4}).status_code == 200


def test_a_draft_07_tuple_schema_is_accepted_and_constrains_the_answer(tiny):
    # llama-server takes draft-07's tuple form; so does refsight (as 2020-12's prefixItems).
    schema = {"type": "array", "items": [{"type": "integer", "minimum": 0, "maximum": 9}, {"type": "boolean"}],
              "additionalItems": False}
    with tiny.client() as c:
        reply = c.post("/v1/chat/completions", json={
            "model": "tiny-qwen2-vl", "max_tokens": 64, "messages": [{"role": "user", "content": "Give a pair."}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "pair", "schema": schema}}})
    assert reply.status_code == 200, reply.text
    import json

    answer = json.loads(reply.json()["choices"][0]["message"]["content"])
    assert isinstance(answer, list) and len(answer) == 2
    assert isinstance(answer[0], int) and not isinstance(answer[0], bool) and isinstance(answer[1], bool)


def test_one_default_n_predict_in_props_slots_and_the_readme(tiny):
    from pathlib import Path

    from refsight.server.intake.generation_body import DEFAULT_MAX_TOKENS

    with tiny.client() as c:
        props = c.get("/props").json()["default_generation_settings"]["params"]["n_predict"]
        # A slot shows params once it has run a task (llama-server's /slots): run one.
        assert c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}).status_code == 200
        slots = [slot["params"]["n_predict"] for slot in c.get("/slots").json() if "params" in slot]
    assert props == DEFAULT_MAX_TOKENS and slots and set(slots) == {DEFAULT_MAX_TOKENS}
    readme = (Path(__file__).resolve().parents[2] / "docs" / "http.md").read_text()
    assert f"(default {DEFAULT_MAX_TOKENS})" in readme


def test_llama_servers_routes_without_v1_and_its_models_list(tiny):
    with tiny.client() as c:
        for path in ("/v1/models", "/models"):
            listed = c.get(path).json()
            assert listed["object"] == "list" and listed["data"][0]["id"] == "tiny-qwen2-vl"
            assert listed["models"][0]["model"] == "tiny-qwen2-vl"
            assert listed["models"][0]["capabilities"] == ["completion", "multimodal"]
        messages = [{"role": "user", "content": "Hi"}]
        chat = c.post("/chat/completions", json={"model": "tiny-qwen2-vl", "max_tokens": 2, "messages": messages})
        assert chat.status_code == 200 and chat.json()["object"] == "chat.completion"
        # llama-server's /completions is its native /completion (not OpenAI's /v1/completions).
        done = c.post("/completions", json={"model": "tiny-qwen2-vl", "n_predict": 2, "prompt": "Once"})
        assert done.status_code == 200 and done.json()["stop"] is True and "content" in done.json()
        # Errors keep the OpenAI shape on the short paths too.
        assert "type" in c.post("/chat/completions", json={"messages": []}).json()["error"]
