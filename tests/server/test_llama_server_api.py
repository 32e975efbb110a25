"""llama-server's own endpoints, in llama-server's request shapes (raw HTTP) and OpenAI's (the openai SDK),
over a real socket on the llama.cpp backend and the transformers backend.

On llama.cpp, ``/tokenize``, ``/detokenize`` and ``/completion`` are compared with llama-cpp-python's own
``Llama`` on the same GGUF: identical tokens and text. On both backends a ``/completion`` of the prompt
``/apply-template`` rendered, with the image in ``multimodal_data``, is the chat endpoint's answer.
"""

from __future__ import annotations

import io
import json
import socket
import threading
import time

import httpx
import openai
import pytest
import uvicorn
from PIL import Image
from runtimes import require_module

from live_server import LiveServer, b64, data_url, photo_png
from refsight.server import ServerConfig, create_app

GGUF = "tiny-qwen2-vl-gguf"
CAT = photo_png("chelsea", (56, 56))
PROMPT = "<|im_start|>user\nName three colours.<|im_end|>\n<|im_start|>assistant\n"


def _serve(store, model: str) -> LiveServer:
    live = LiveServer(create_app(ServerConfig(store=store, model=model, keys={}, served_model_names=("local",)))).start()
    with live.client() as c:
        assert c.post("/v1/references", json={"image": b64(CAT), "id": "cat"}).status_code == 201
    return live


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> LiveServer:
    require_module("llama_cpp")
    from refsight.builtin_models.gguf import ensure_gguf

    ensure_gguf(GGUF)  # built before the server starts, so start-up is only the load
    live = _serve(tmp_path_factory.mktemp("llama-server-api"), GGUF)
    yield live
    live.stop()


@pytest.fixture(scope="module")
def hf(tmp_path_factory) -> LiveServer:
    require_module("transformers")
    live = _serve(tmp_path_factory.mktemp("llama-server-api-hf"), "tiny-qwen2-vl")
    yield live
    live.stop()


@pytest.fixture(scope="module")
def reference_llama(llama):
    """llama-cpp-python's own high-level ``Llama`` on the served GGUF (the backend's context and batch sizes)."""
    import llama_cpp

    backend = llama.service.engine.backend()
    model = llama_cpp.Llama(str(backend.model_path), n_ctx=4096, n_batch=2048, n_ubatch=2048, verbose=False, seed=0)
    yield model
    model.close()


def test_health_is_public_and_503_while_the_model_loads(tmp_path):
    # A server whose lifespan has not loaded the model (uvicorn without lifespan): llama-server's 503.
    app = create_app(ServerConfig(store=tmp_path / "s", model="toy", keys={"health-key-00001": "a"}))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, lifespan="off", log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        while not server.started:
            time.sleep(0.02)
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        loading = httpx.get(f"{url}/health")
        assert loading.status_code == 503
        assert loading.json() == {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


@pytest.mark.slow  # a server on the tiny model converted to GGUF (llama-cpp-python: an optional runtime)
def test_health_and_props(llama):
    with llama.client() as c:
        assert c.get("/health").json() == {"status": "ok"} and c.get("/v1/health").status_code == 200
        props = c.get("/props").json()
    backend = llama.service.engine.backend()
    assert props["media_marker"] == backend.media_marker == backend.runtime.marker
    assert props["default_generation_settings"]["n_ctx"] == backend.runtime.settings.n_ctx
    assert props["modalities"] == {"vision": True, "audio": False, "video": False} and props["model_alias"] == "local"
    assert "<|im_start|>" in props["chat_template"]  # the GGUF's own Jinja template
    with llama.client() as c:
        slots = c.get("/slots").json()
        assert [s["id"] for s in slots] == [0, 1] and not any(s["is_processing"] for s in slots)
        assert slots[0]["n_ctx"] == backend.runtime.settings.n_ctx
    params = props["default_generation_settings"]["params"]
    assert params["temperature"] == 0.0  # refsight is greedy by default
    # ...and samples, when asked to, through llama-server's sampler defaults on llama.cpp.
    assert (params["top_k"], params["top_p"], params["min_p"]) == (40, 0.95, 0.05)


@pytest.mark.slow  # a server on the tiny model converted to GGUF (llama-cpp-python: an optional runtime)
def test_several_prompts_in_one_completion_are_answered_in_order_as_llama_server(llama):
    text = "I believe the meaning of life is"
    with llama.client() as c:
        tokens = c.post("/tokenize", json={"content": text, "add_special": True}).json()["tokens"]
        one = c.post("/completion", json={"prompt": tokens, "n_predict": 6}).json()
        for prompts in ([tokens, tokens], [tokens, text], [tokens, {"prompt_string": text}], [text, tokens, [text]]):
            answers = c.post("/completion", json={"prompt": prompts, "n_predict": 6}).json()
            assert isinstance(answers, list) and [a["index"] for a in answers] == list(range(len(prompts)))
            assert {a["content"] for a in answers} == {one["content"]}
        assert isinstance(c.post("/completion", json={"prompt": [text], "n_predict": 2}).json(), dict)  # one: an object
        for body, param in (({"prompt": [text, text], "stream": True}, "stream"), ({"prompt": [text] * 17}, "prompt"),
                            ({"prompt": []}, "prompt"), ({"prompt": [text, 5.5]}, "prompt"),
                            ({"prompt": [text, text], "multimodal_data": []}, "multimodal_data")):
            refused = c.post("/completion", json={**body, "n_predict": 2})
            assert refused.status_code == 400 and refused.json()["error"]["param"] == param, body


@pytest.mark.slow  # a server on the tiny model converted to GGUF (llama-cpp-python: an optional runtime)
def test_tokenize_and_detokenize_equal_llama_cpp_python(llama, reference_llama):
    text = "Hello <|im_start|>world, ünïcode 🐈"
    with llama.client() as c:
        for add_special in (False, True):
            for parse_special in (False, True):
                got = c.post("/tokenize", json={"content": text, "add_special": add_special, "parse_special": parse_special})
                assert got.json()["tokens"] == reference_llama.tokenize(text.encode(), add_bos=add_special, special=parse_special)
        pieces = c.post("/tokenize", json={"content": text, "with_pieces": True}).json()["tokens"]
        ids = [p["id"] for p in pieces]
        assert ids == reference_llama.tokenize(text.encode(), add_bos=False, special=True)
        for piece in pieces:
            raw = reference_llama.detokenize([piece["id"]], special=True)
            assert piece["piece"] == (raw.decode() if isinstance(piece["piece"], str) else list(raw))
        back = c.post("/detokenize", json={"tokens": ids}).json()["content"]
        assert back == reference_llama.detokenize(ids, special=True).decode() == text
        bad = c.post("/detokenize", json={"tokens": [10**9]})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens[0]"


@pytest.mark.slow  # a server on the tiny model converted to GGUF (llama-cpp-python: an optional runtime)
@pytest.mark.parametrize("fields", [{}, {"repeat_penalty": 1.3}, {"top_k": 5, "min_p": 0.1},
                                    # llama-server's (and Ollama's) repeat_last_n: the penalty's window.
                                    {"repeat_penalty": 1.6, "repeat_last_n": 3}, {"repeat_penalty": 1.6, "repeat_last_n": 0},
                                    # Sampled: llama-server's sampler defaults and order, one seed on both sides.
                                    {"temperature": 0.8, "seed": 7}, {"temperature": 1.5, "seed": 7, "top_k": 3},
                                    {"temperature": 2.0, "seed": 7, "min_p": 0.3}, {"temperature": 0.2, "seed": 7, "top_p": 0.5}])
def test_completion_equals_llama_cpp_python_on_the_same_gguf(llama, reference_llama, fields):
    import llama_cpp

    with llama.client() as c:
        got = c.post("/completion", json={"prompt": PROMPT, "n_predict": 12, "cache_prompt": True, "return_tokens": True,
                                          **fields}).json()
    options = {"temp": fields.get("temperature", 0.0), "top_k": fields.get("top_k", 40), "top_p": fields.get("top_p", 0.95),
               "min_p": fields.get("min_p", 0.05), "repeat_penalty": fields.get("repeat_penalty", 1.0)}
    prompt_ids = reference_llama.tokenize(PROMPT.encode(), add_bos=True, special=True)
    reference_llama.set_seed(fields.get("seed", 1))  # its draw's seed (greedy decoding draws nothing)
    reference_llama.last_n_tokens_size = fields.get("repeat_last_n", 64)  # its penalty_last_n
    their_tokens = []
    for token in reference_llama.generate(prompt_ids, reset=True, **options):
        their_tokens.append(token)
        if llama_cpp.llama_vocab_is_eog(reference_llama._model.vocab, token) or len(their_tokens) == 12:
            break
    assert got["tokens"] == their_tokens
    # Random weights make bytes that are not UTF-8: refsight shows them as U+FFFD (create_completion would
    # drop them and decode past max_tokens to finish a character, so the tokens are compared through generate).
    assert got["content"] == reference_llama.detokenize(their_tokens).decode("utf-8", "replace")
    assert got["tokens_predicted"] == len(their_tokens)
    assert got["tokens_evaluated"] == len(prompt_ids)
    assert got["stop"] is True and got["stop_type"] in ("eos", "limit") and got["model"] == "local"
    assert got["generation_settings"]["n_predict"] == 12


@pytest.mark.slow  # a server on the tiny model converted to GGUF (llama-cpp-python: an optional runtime)
def test_a_sampled_completion_draws_through_llama_servers_sampler_defaults(llama):
    """A request that samples and names no filter gets llama-server's top-k 40, top-p 0.95 and min-p 0.05: the
    tokens of naming them, not those of naming none (the llama.cpp suite's sampled tests expect its chain)."""
    ask = {"prompt": PROMPT, "n_predict": 16, "temperature": 1.0, "seed": 11, "return_tokens": True, "ignore_eos": True}
    filters = ({}, {"top_k": 40, "top_p": 0.95, "min_p": 0.05}, {"top_k": 0, "top_p": 1.0, "min_p": 0.0})
    with llama.client() as c:
        default, named, unfiltered = (c.post("/completion", json={**ask, **fields}).json() for fields in filters)
    assert default["tokens"] == named["tokens"] != unfiltered["tokens"]
    settings = default["generation_settings"]
    assert (settings["top_k"], settings["top_p"], settings["min_p"]) == (40, 0.95, 0.05)


@pytest.mark.slow  # a server on the tiny model converted to GGUF (llama-cpp-python: an optional runtime)
def test_ignore_eos_shows_a_banned_end_token_in_logit_bias_as_llama_server(llama, reference_llama):
    """llama-server reads ``ignore_eos`` as a -inf bias (JSON null) on every end-of-generation token, appended to the
    request's own biases and shown in ``generation_settings.logit_bias`` (the llama.cpp suite's test_ignore_eos)."""
    ask = {"prompt": PROMPT, "n_predict": 4, "temperature": 0, "logit_bias": [[5, 1.5]]}
    with llama.client() as c:
        on, off = (c.post("/completion", json={**ask, "ignore_eos": flag}).json()["generation_settings"]
                   for flag in (True, False))
    (end,) = reference_llama.tokenize(b"<|im_end|>", add_bos=False, special=True)
    assert on["ignore_eos"] is True and on["logit_bias"][0] == {"bias": 1.5, "token": 5}
    banned = on["logit_bias"][1:]
    assert banned and all(entry["bias"] is None for entry in banned) and end in {entry["token"] for entry in banned}
    assert off["ignore_eos"] is False and off["logit_bias"] == [{"bias": 1.5, "token": 5}]


@pytest.mark.parametrize("backend", [pytest.param("llama", marks=pytest.mark.slow), "hf"])  # llama: converted to GGUF
def test_chat_input_tokens_are_the_prompt_tokens_the_chat_then_uses(backend, request):
    """llama-server's ``/chat/completions/input_tokens`` (with and without ``/v1``): the chat's prompt tokens, a stored
    reference's image tokens included, as the chat's own ``usage.prompt_tokens`` then counts them."""
    live = request.getfixturevalue(backend)
    image = {"type": "image_url", "image_url": {"url": "refsight://ref/cat"}}
    chats = ([{"role": "system", "content": "Book"}, {"role": "user", "content": "What is the best book"}],
             [{"role": "user", "content": [{"type": "text", "text": "What is this?"}, image]}])
    with live.client() as c:
        for messages in chats:
            counted = [c.post(path, json={"messages": messages}).json()["input_tokens"]
                       for path in ("/chat/completions/input_tokens", "/v1/chat/completions/input_tokens")]
            used = c.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 1}).json()["usage"]
            assert counted == [used["prompt_tokens"]] * 2, (messages, counted, used)


@pytest.mark.slow  # a server on the tiny model converted to GGUF (llama-cpp-python: an optional runtime)
def test_an_image_whose_tokens_fill_the_context_is_refused_before_decoding_not_a_500(llama):
    """An 8000x5000 image is 4,000 image tokens on 80 M-RoPE positions: the KV cells, not the positions, fill the
    4,096 context. An answer that cannot fit is a 400 naming ``max_new_tokens`` before decoding (it was a 500:
    llama_decode found the context full mid-answer); one that fits is answered."""
    buffer = io.BytesIO()
    Image.new("RGB", (8000, 5000), (40, 90, 160)).save(buffer, "PNG")
    image = {"type": "image_url", "image_url": {"url": data_url(buffer.getvalue())}}
    messages = [{"role": "user", "content": [{"type": "text", "text": "What is this?"}, image]}]
    with llama.client() as c:
        refused = c.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 128})
        answered = c.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 8})
    error = refused.json()["error"]
    assert refused.status_code == 400 and error["type"] == "exceed_context_size_error", refused.text  # llama-server's
    assert error["param"] == "max_new_tokens" and error["n_prompt_tokens"] > 4000, error  # the cells, not 80 positions
    assert answered.status_code == 200 and answered.json()["usage"]["prompt_tokens"] > 4000, answered.text


def _apply_template_then_complete(live: LiveServer, image: str, **fields) -> dict:
    messages = [{"role": "user", "content": [{"type": "text", "text": "What is this?"},
                                             {"type": "image_url", "image_url": {"url": "refsight://ref/cat"}}]}]
    with live.client() as c:
        prompt = c.post("/apply-template", json={"messages": messages}).json()["prompt"]
        marker = c.get("/props").json()["media_marker"]
        assert prompt.count(marker) == 1
        return c.post("/completion", json={"prompt": prompt, "multimodal_data": [image], "n_predict": 8, **fields}).json()


@pytest.mark.parametrize("backend", [pytest.param("llama", marks=pytest.mark.slow), "hf"])  # llama: converted to GGUF
def test_completion_with_an_image_is_the_chat_answer_and_takes_stored_references(backend, request):
    live = request.getfixturevalue(backend)
    chat = openai.OpenAI(base_url=f"{live.url}/v1", api_key="none", max_retries=0).chat.completions.create(
        model="local", max_tokens=8, messages=[{"role": "user", "content": [
            {"type": "text", "text": "What is this?"}, {"type": "image_url", "image_url": {"url": data_url(CAT)}}]}])
    by_bytes = _apply_template_then_complete(live, b64(CAT))
    by_reference = _apply_template_then_complete(live, "refsight://ref/cat")
    by_url = _apply_template_then_complete(live, f"{live.url}/v1/references/cat/image")
    assert by_bytes["content"] == by_reference["content"] == by_url["content"] == chat.choices[0].message.content
    assert by_bytes["tokens_evaluated"] == chat.usage.prompt_tokens
    assert by_reference["refsight"]["references_cached"] == [True]
    # The object prompt llama-server documents is the same request.
    with live.client() as c:
        prompt = c.post("/apply-template", json={"messages": [{"role": "user", "content": [
            {"type": "text", "text": "What is this?"}, {"type": "image_url", "image_url": {"url": ""}}]}]}).json()["prompt"]
        same = c.post("/completion", json={"prompt": {"prompt_string": prompt, "multimodal_data": [b64(CAT)]},
                                           "n_predict": 8}).json()
        assert same["content"] == by_bytes["content"]
        mismatch = c.post("/completion", json={"prompt": prompt, "n_predict": 8})
        assert mismatch.status_code == 400 and mismatch.json()["error"]["param"] == "multimodal_data"


@pytest.mark.slow  # a server on the tiny model converted to GGUF (llama-cpp-python: an optional runtime)
def test_a_streamed_completion_is_the_plain_one_in_pieces(llama):
    with llama.client() as c:
        plain = c.post("/completion", json={"prompt": PROMPT, "n_predict": 10}).json()
        events = []
        with c.stream("POST", "/completion", json={"prompt": PROMPT, "n_predict": 10, "stream": True}) as response:
            assert response.headers["content-type"].startswith("text/event-stream")
            for line in response.iter_lines():
                if line.startswith("data: "):
                    events.append(json.loads(line[6:]))
    assert all(e["stop"] is False for e in events[:-1]) and events[-1]["stop"] is True
    assert "".join(e["content"] for e in events) == plain["content"]
    assert events[-1]["tokens_predicted"] == plain["tokens_predicted"]


@pytest.mark.slow  # a server on the tiny model converted to GGUF (llama-cpp-python: an optional runtime)
def test_v1_completions_with_the_openai_sdk(llama):
    client = openai.OpenAI(base_url=f"{llama.url}/v1", api_key="none", max_retries=0)
    with llama.client() as c:
        native = c.post("/completion", json={"prompt": PROMPT, "n_predict": 10}).json()
    completion = client.completions.create(model="local", prompt=PROMPT, max_tokens=10)
    assert completion.object == "text_completion" and completion.choices[0].text == native["content"]
    assert completion.usage.completion_tokens == native["tokens_predicted"]
    streamed = "".join(chunk.choices[0].text for chunk in client.completions.create(
        model="local", prompt=PROMPT, max_tokens=10, stream=True) if chunk.choices)
    assert streamed == native["content"]
    constrained = client.completions.create(model="local", prompt=PROMPT, max_tokens=4, extra_body={"grammar": "root ::= \"a\""})
    assert constrained.choices[0].text == "a"  # llama-server's GBNF grammar, honoured on llama.cpp
    # A list of prompts: a choice each, in order, the usage summed.
    several = client.completions.create(model="local", prompt=[PROMPT, "Once upon a time", PROMPT], max_tokens=10)
    assert [c.index for c in several.choices] == [0, 1, 2]
    assert several.choices[0].text == several.choices[2].text == native["content"]
    alone = client.completions.create(model="local", prompt="Once upon a time", max_tokens=10)
    assert several.choices[1].text == alone.choices[0].text
    assert several.usage.prompt_tokens == 2 * completion.usage.prompt_tokens + alone.usage.prompt_tokens
    with pytest.raises(openai.BadRequestError) as refused:  # several prompts stream one at a time
        client.completions.create(model="local", prompt=[PROMPT, PROMPT], max_tokens=2, stream=True)
    assert refused.value.body["param"] == "stream"


@pytest.mark.slow  # a server on the tiny model converted to GGUF (llama-cpp-python: an optional runtime)
def test_chat_template_kwargs_the_template_never_reads_are_named_as_ignored(llama):
    # The variables a template reads reach it (tests/server/test_template_variables.py).
    client = openai.OpenAI(base_url=f"{llama.url}/v1", api_key="none", max_retries=0)
    hi = [{"role": "user", "content": "hi"}]
    plain = client.chat.completions.create(model="local", messages=hi, max_tokens=4)
    thinking_off = client.chat.completions.create(
        model="local", messages=hi, max_tokens=4, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert thinking_off.choices[0].message.content == plain.choices[0].message.content
    assert thinking_off.model_extra["refsight"]["ignored"] == ["chat_template_kwargs.enable_thinking"]
    with pytest.raises(openai.BadRequestError) as info:  # refsight's render sets it from the request itself
        client.chat.completions.create(model="local", messages=hi, max_tokens=4,
                                       extra_body={"chat_template_kwargs": {"add_generation_prompt": False}})
    assert info.value.body["param"] == "chat_template_kwargs.add_generation_prompt"


def test_tokenize_detokenize_and_health_on_transformers(hf):
    tokenizer = hf.service.engine.backend().tokenizer
    text = "Hello <|im_start|>world, ünïcode 🐈"
    with hf.client() as c:
        assert c.get("/health").json() == {"status": "ok"}
        ids = c.post("/tokenize", json={"content": text}).json()["tokens"]
        assert ids == tokenizer(text, add_special_tokens=False)["input_ids"]
        plain = c.post("/tokenize", json={"content": text, "parse_special": False}).json()["tokens"]
        assert plain != ids and tokenizer.convert_tokens_to_ids("<|im_start|>") not in plain
        assert c.post("/detokenize", json={"tokens": ids}).json()["content"] == text
        pieces = c.post("/tokenize", json={"content": "cat", "with_pieces": True}).json()["tokens"]
        assert "".join(p["piece"] for p in pieces) == "cat"
        assert c.get("/props").json()["media_marker"] == "<__media__>"
