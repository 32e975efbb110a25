"""refsight against llama-server itself: the same GGUF behind both, both started from their command lines with
the same flags (``-np 1 -c 512``), the same raw requests in llama-server's shapes, the same answers (tokens,
text, counts) and the answer fields llama-server clients read; issue 37's round-2 items one by one (routes,
model names, errors, streams and timings, ``generation_settings``, JSON schema, ``/apply-template``, bodies
without a JSON Content-Type, slots). The start-up flags that must differ (keys, hosts, ``-np 2``) are in
``test_llama_server_live_flags.py``.

The llama-server binary is built from the llama-cpp-python sdist on first use and cached in the user
cache dir (``benchmarks/llama_server.py``), as the vs-llama-server benchmark does: hence slow.
"""

from __future__ import annotations

import httpx
import pytest
from runtimes import require_module

from live_server import b64, photo_png
from llama_pair import MARKER, both, events, finite, start_pair

require_module("llama_cpp.mtmd_cpp", "pip install 'refsight[llamacpp]'")

PROMPT = "<|im_start|>user\nName three colours.<|im_end|>\n<|im_start|>assistant\n"
HI = [{"role": "user", "content": "hi"}]
N_CTX = 512  # small, so a prompt over the context is cheap to send


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """(llama-server's URL, refsight's URL): ``llama-server`` and ``refsight serve`` with ``-np 1 -c 512``."""
    theirs, ours = start_pair(tmp_path_factory.mktemp("live"), parallel=1, n_ctx=N_CTX)
    yield theirs.url, ours.url
    ours.stop()
    theirs.stop()


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_the_native_endpoints_answer_as_llama_server_does(servers):
    theirs, ours = (r.json() for r in both(servers, "GET", "/health"))
    assert theirs == ours == {"status": "ok"}
    for body in ({"content": "Hi <|im_start|> ünï 🐈"}, {"content": "Hi <|im_start|>", "with_pieces": True},
                 {"content": "Hi <|im_start|>", "parse_special": False}, {"content": "Hi", "add_special": True}):
        theirs, ours = (r.json() for r in both(servers, "POST", "/tokenize", json=body))
        assert theirs == ours, body
    ids = ours["tokens"]
    theirs, ours = (r.json() for r in both(servers, "POST", "/detokenize", json={"tokens": [1, 53, 86, 2]}))
    assert theirs == ours and ids
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "hello"}, {"role": "user", "content": "colours?"}]
    theirs, ours = (r.json() for r in both(servers, "POST", "/apply-template", json={"messages": messages}))
    assert theirs == ours
    theirs, ours = (r.json() for r in both(servers, "GET", "/slots"))
    assert set(theirs[0]) <= set(ours[0])
    theirs, ours = (r.json() for r in both(servers, "GET", "/props"))
    assert {"default_generation_settings", "total_slots", "model_path", "chat_template", "modalities", "media_marker",
            "build_info", "model_alias"} <= set(theirs) & set(ours)
    assert theirs["modalities"]["vision"] == ours["modalities"]["vision"] is True
    assert theirs["chat_template"] == ours["chat_template"]


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_completion_is_llama_servers_answer_and_with_an_image_its_chat_answer(servers):
    body = {"prompt": PROMPT, "n_predict": 12, "temperature": 0, "return_tokens": True, "cache_prompt": False}
    theirs, ours = (r.json() for r in both(servers, "POST", "/completion", json=body))
    assert set(theirs) <= set(ours)  # every field a llama-server client reads is there
    for key in ("content", "tokens", "tokens_predicted", "tokens_evaluated", "stop_type", "stop", "has_new_line"):
        assert theirs[key] == ours[key], key
    assert [httpx.get(f"{url}/props").json()["media_marker"] for url in servers] == [MARKER, MARKER]
    # With an image: refsight's /completion of the chat's own prompt is llama-server's chat answer. (llama-server's
    # /completion of that very prompt evaluates one token fewer than its chat on this build, and answers otherwise.)
    image = b64(photo_png("chelsea", (56, 56)))
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": f"data:image/png;base64,{image}"}},
                                             {"type": "text", "text": "What is this?"}]}]
    theirs_prompt, ours_prompt = (r.json()["prompt"] for r in both(servers, "POST", "/apply-template", json={"messages": messages}))
    assert theirs_prompt == ours_prompt and theirs_prompt.count(MARKER) == 1
    chat = httpx.post(f"{servers[0]}/v1/chat/completions", timeout=300,
                      json={"messages": messages, "max_tokens": 12, "temperature": 0}).json()
    ours = httpx.post(f"{servers[1]}/completion", timeout=300, json={**body, "prompt": ours_prompt, "multimodal_data": [image]}).json()
    assert ours["content"] == chat["choices"][0]["message"]["content"]
    assert ours["tokens_evaluated"] == chat["usage"]["prompt_tokens"]


def _slow(test):
    return pytest.mark.slow(pytest.mark.timeout(3600)(test))


@_slow
def test_routes_without_v1_and_the_models_list_are_llama_servers(servers):
    """Item 1-2: /completions is /completion, /chat/completions and /models answer as with /v1; ``models``
    beside OpenAI's ``data``, with ``capabilities``."""
    body = {"prompt": PROMPT, "n_predict": 6, "temperature": 0, "cache_prompt": False}
    theirs, ours = both(servers, "POST", "/completions", json=body)
    assert theirs.status_code == ours.status_code == 200
    assert set(theirs.json()) <= set(ours.json()) and theirs.json()["content"] == ours.json()["content"]
    chat = {"messages": HI, "max_tokens": 6, "temperature": 0}
    theirs, ours = (r.json() for r in both(servers, "POST", "/chat/completions", json=chat))
    assert theirs["object"] == ours["object"] == "chat.completion"
    assert theirs["choices"][0]["message"]["content"] == ours["choices"][0]["message"]["content"]
    for path in ("/models", "/v1/models"):
        theirs, ours = (r.json() for r in both(servers, "GET", path))
        assert theirs["object"] == ours["object"] == "list"
        assert set(theirs["models"][0]) == set(ours["models"][0]), path
        assert set(theirs["models"][0]["details"]) == set(ours["models"][0]["details"])
        assert theirs["models"][0]["capabilities"] == ours["models"][0]["capabilities"] == ["completion", "multimodal"]
        assert {"id", "object", "created", "owned_by", "aliases", "tags"} <= set(theirs["data"][0]) & set(ours["data"][0])
        assert ours["data"][0]["id"] in ours["data"][0]["aliases"] and theirs["data"][0]["id"] in theirs["data"][0]["aliases"]


@_slow
def test_any_model_name_is_served_by_the_one_model(servers):
    """Item 4: "gpt-3.5-turbo" / "davinci-002" are answered by the served model, as llama-server answers them."""
    chat = {"model": "gpt-3.5-turbo", "messages": HI, "max_tokens": 4, "temperature": 0}
    theirs, ours = both(servers, "POST", "/v1/chat/completions", json=chat)
    assert theirs.status_code == ours.status_code == 200
    assert theirs.json()["choices"][0]["message"] == ours.json()["choices"][0]["message"]
    assert ours.json()["model"] != "gpt-3.5-turbo"  # the reply names the model that answered, as llama-server's does
    text = {"model": "davinci-002", "prompt": PROMPT, "max_tokens": 4, "temperature": 0}
    theirs, ours = both(servers, "POST", "/v1/completions", json=text)
    assert theirs.status_code == ours.status_code == 200
    assert theirs.json()["choices"][0]["text"] == ours.json()["choices"][0]["text"]


@_slow
def test_errors_have_llama_servers_status_type_and_figures(servers):
    """Item 3: over the context, 400 exceed_context_size_error with the same n_prompt_tokens and n_ctx; two
    trailing assistant messages, 400; n_predict -1 fills the context and says truncated."""
    for path, body in (("/completion", {"prompt": "hello " * 600, "n_predict": 4}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hello " * 600}], "max_tokens": 4})):
        theirs, ours = both(servers, "POST", path, json=body)
        assert theirs.status_code == ours.status_code == 400, path
        theirs, ours = theirs.json()["error"], ours.json()["error"]
        assert theirs["type"] == ours["type"] == "exceed_context_size_error", path
        assert theirs["n_ctx"] == ours["n_ctx"] == N_CTX and ours["n_prompt_tokens"] > N_CTX, path
        assert "exceeds the available context size" in theirs["message"] and "exceeds the available context size" in ours["message"]
        if path == "/completion":  # the raw prompt: the same count, so llama-server's words (refsight's count after)
            assert theirs["n_prompt_tokens"] == ours["n_prompt_tokens"]
            assert ours["message"].startswith(theirs["message"]), (ours["message"], theirs["message"])
        else:  # refsight counts a chat before its template (a bound checked before any model work): docs/http.md
            assert ours["n_prompt_tokens"] <= theirs["n_prompt_tokens"]
    # A raw prompt that fits once its special tokens are parsed (380 tokens; spelled out, they would be ~900).
    theirs, ours = both(servers, "POST", "/completion", json={"prompt": PROMPT * 20, "n_predict": 2, "temperature": 0})
    assert theirs.status_code == ours.status_code == 200, ours.text
    assert theirs.json()["tokens_evaluated"] == ours.json()["tokens_evaluated"]
    messages = [*HI, {"role": "assistant", "content": "a"}, {"role": "assistant", "content": "b"}]
    theirs, ours = both(servers, "POST", "/v1/chat/completions", json={"messages": messages, "max_tokens": 4})
    assert theirs.status_code == ours.status_code == 400
    assert theirs.json()["error"]["type"] == ours.json()["error"]["type"] == "invalid_request_error"
    theirs, ours = (r.json() for r in both(servers, "POST", "/completion",
                                           json={"prompt": PROMPT, "n_predict": -1, "temperature": 0}))
    for key in ("truncated", "tokens_predicted", "tokens_evaluated", "stop_type"):
        assert theirs[key] == ours[key], key
    assert ours["truncated"] is True and ours["tokens_predicted"] + ours["tokens_evaluated"] == N_CTX


@_slow
def test_streamed_chat_chunks_and_their_timings(servers):
    """Item 5: the first chunk's content is null, every chunk has a system_fingerprint, timings_per_token puts
    timings on each content chunk, and the usage chunk has the full timings."""
    body = {"messages": HI, "max_tokens": 4, "temperature": 0, "stream": True, "timings_per_token": True,
            "stream_options": {"include_usage": True}}
    theirs, ours = (events(r) for r in both(servers, "POST", "/v1/chat/completions", json=body))
    texts, per_chunk = [], []
    for chunks in (theirs, ours):
        assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
        assert "timings" not in chunks[0]  # the role's chunk carries none, even with timings_per_token
        assert all(isinstance(c["system_fingerprint"], str) and c["system_fingerprint"] for c in chunks)
        content = [c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")]
        assert content and all(finite(c["timings"]) for c in content)
        texts.append("".join(c["choices"][0]["delta"]["content"] for c in content))
        per_chunk.append(set(content[0]["timings"]))
        assert chunks[-1]["choices"] == [] and finite(chunks[-1]["timings"])
    assert texts[0] == texts[1]
    assert set(theirs[-1]["timings"]) == set(ours[-1]["timings"])
    assert theirs[-1]["usage"]["completion_tokens"] == ours[-1]["usage"]["completion_tokens"]
    assert per_chunk[1] <= per_chunk[0]  # refsight's per-chunk timings: see docs/http.md, "What still differs"
    for path, body in (("/v1/chat/completions", {"messages": HI, "max_tokens": 2}),
                       ("/v1/completions", {"prompt": PROMPT, "max_tokens": 2})):
        assert all(isinstance(r.json()["system_fingerprint"], str) for r in both(servers, "POST", path, json=body))


@_slow
def test_completion_timings_cache_fields_and_generation_settings(servers):
    """Item 5: /completion's timings (same keys, finite, a 1-token answer's rate 0), tokens_cached and cache_n,
    generation_settings (refsight's keys include llama-server's, in replies, /props and /slots)."""
    body = {"prompt": PROMPT, "n_predict": 4, "temperature": 0}
    theirs, ours = (r.json() for r in both(servers, "POST", "/completion", json=body))
    assert set(theirs["timings"]) == set(ours["timings"]) and finite(theirs["timings"]) and finite(ours["timings"])
    assert "tokens_cached" in theirs and "tokens_cached" in ours and "cache_n" in ours["timings"]
    assert set(theirs["generation_settings"]) <= set(ours["generation_settings"])
    for answer in (r.json() for r in both(servers, "POST", "/completion", json={**body, "n_predict": 1})):
        assert answer["timings"]["predicted_n"] == 1 and answer["timings"]["predicted_per_second"] == 0
    theirs, ours = (r.json()["default_generation_settings"] for r in both(servers, "GET", "/props"))
    assert set(theirs["params"]) <= set(ours["params"]) and theirs["n_ctx"] == ours["n_ctx"] == N_CTX
    sampler = ("top_k", "top_p", "min_p", "repeat_penalty", "presence_penalty", "frequency_penalty")
    # llama-server's sampler defaults are refsight's on llama.cpp (llama-server writes its float32 values widened).
    assert [ours["params"][k] for k in sampler] == [pytest.approx(theirs["params"][k], rel=1e-6) for k in sampler]
    theirs, ours = (r.json()[0]["params"] for r in both(servers, "GET", "/slots"))
    assert set(theirs) <= set(ours)


@_slow
def test_streamed_completion_pieces_carry_tokens(servers):
    """Item 5: each streamed /completion piece has its content and tokens, the last one the final object."""
    body = {"prompt": PROMPT, "n_predict": 4, "temperature": 0, "stream": True, "cache_prompt": False}
    theirs, ours = (events(r) for r in both(servers, "POST", "/completion", json=body))
    for pieces in (theirs, ours):
        assert all(p["stop"] is False and p["tokens"] and all(isinstance(t, int) for t in p["tokens"]) for p in pieces[:-1])
        assert pieces[-1]["stop"] is True and pieces[-1]["tokens_predicted"] == 4 and finite(pieces[-1]["timings"])
    assert "".join(p["content"] for p in theirs) == "".join(p["content"] for p in ours)
    assert set(theirs[-1]) <= set(ours[-1])
    assert {"index", "content", "tokens", "stop", "id_slot"} <= set(theirs[0]) & set(ours[0])


@_slow
def test_tuple_schema_apply_template_and_bodies_without_json_content_type(servers):
    """Items 6-8: the draft-07 tuple schema is taken by both; /apply-template's add_generation_prompt and
    tools null/[] render the same prompt; a body sent as text/plain, a form or with no type is JSON to both."""
    schema = {"type": "array", "items": [{"type": "integer"}]}
    for path, body in (("/completion", {"prompt": PROMPT, "n_predict": 8, "json_schema": schema}),
                       ("/v1/chat/completions", {"messages": HI, "max_tokens": 8, "response_format": {
                           "type": "json_schema", "json_schema": {"name": "t", "schema": schema}}})):
        assert [r.status_code for r in both(servers, "POST", path, json=body)] == [200, 200], path
    for extra in ({}, {"add_generation_prompt": False}, {"add_generation_prompt": True}, {"tools": None},
                  {"tools": []}, {"add_generation_prompt": False, "tools": []}):
        theirs, ours = both(servers, "POST", "/apply-template", json={"messages": HI, **extra})
        assert theirs.status_code == ours.status_code == 200 and theirs.json() == ours.json(), extra
    for headers in ({}, {"Content-Type": "text/plain"}, {"Content-Type": "application/x-www-form-urlencoded"}):
        theirs, ours = both(servers, "POST", "/tokenize", content=b'{"content": "Hi there"}', headers=headers)
        assert theirs.status_code == ours.status_code == 200 and theirs.json() == ours.json(), headers
        body = b'{"prompt": "Once", "n_predict": 3, "temperature": 0}'
        theirs, ours = both(servers, "POST", "/completion", content=body, headers=headers)
        assert theirs.status_code == ours.status_code == 200 and theirs.json()["content"] == ours.json()["content"]


@_slow
def test_one_slot_and_the_keyless_preflight(servers):
    """Item 7: -np 1 is one slot of the whole -c; a keyless preflight is 200 on both (CORS headers: llama-server
    allows every origin by default, refsight without keys loopback origins: see test_llama_server_live_flags.py)."""
    theirs, ours = (r.json() for r in both(servers, "GET", "/slots"))
    assert len(theirs) == len(ours) == 1 and theirs[0]["n_ctx"] == ours[0]["n_ctx"] == N_CTX
    theirs, ours = (r.json() for r in both(servers, "GET", "/props"))
    assert theirs["total_slots"] == ours["total_slots"] == 1
    preflight = {"Origin": "http://example.com", "Access-Control-Request-Method": "POST"}
    theirs, ours = both(servers, "OPTIONS", "/v1/chat/completions", headers=preflight)
    assert theirs.status_code == ours.status_code == 200
    assert theirs.headers["access-control-allow-origin"] == "http://example.com"  # llama-server's default: any origin
    assert "access-control-allow-origin" not in ours.headers  # refsight without keys: loopback origins (docs/http.md)


@_slow
def test_the_assistant_prefill_and_prompt_progress_are_llama_servers(servers):
    """Issue 51: a final assistant message (and continue_final_message with add_generation_prompt false) renders
    the prompt llama-server renders and continues it with the same tokens (llama-server writes the prefill at the
    head of its content, refsight only what was generated: docs/http.md); the two servers' refusals agree;
    return_progress streams prompt_progress in llama-server's shapes with the same totals."""
    prefilled = [*HI, {"role": "assistant", "content": "Well,"}]
    for body in ({"messages": prefilled}, {"messages": prefilled, "continue_final_message": True,
                                           "add_generation_prompt": False}, {"messages": HI, "add_generation_prompt": False}):
        theirs, ours = (r.json() for r in both(servers, "POST", "/apply-template", json=body))
        assert theirs == ours, body
        chat = {**body, "max_tokens": 6, "temperature": 0}
        theirs, ours = (r.json() for r in both(servers, "POST", "/v1/chat/completions", json=chat))
        generated = ours["choices"][0]["message"]["content"]
        assert theirs["choices"][0]["message"]["content"] in (generated, "Well," + generated), body
        for key in ("prompt_tokens", "completion_tokens"):
            assert theirs["usage"][key] == ours["usage"][key], (body, key)
    for body in ({"messages": prefilled, "continue_final_message": True},
                 {"messages": [*prefilled, {"role": "assistant", "content": "b"}]}):
        assert [r.status_code for r in both(servers, "POST", "/v1/chat/completions", json=body)] == [400, 400]
    for path, body in (("/v1/chat/completions", {"messages": HI, "max_tokens": 2}), ("/completion", {"prompt": PROMPT,
                       "n_predict": 2}), ("/v1/completions", {"prompt": PROMPT, "max_tokens": 2})):
        streams = [events(r) for r in both(servers, "POST", path, json={**body, "stream": True, "return_progress": True})]
        shapes, totals = [], []
        for chunks in streams:
            reports = [i for i, c in enumerate(chunks) if "prompt_progress" in c]
            assert reports and reports[-1] < next((i for i, c in enumerate(chunks) if _text(c)), len(chunks)), path
            reports = [chunks[i] for i in reports]
            last = reports[-1]["prompt_progress"]
            assert set(last) == {"total", "cache", "processed", "time_ms"} and last["processed"] == last["total"]
            shapes.append({key for c in reports for key in c})
            totals.append(last["total"])
        assert shapes[0] <= shapes[1] and totals[0] == totals[1], path


def _text(chunk: dict) -> str:
    """A streamed chunk's text in any of the three shapes (``/completion``, text and chat completions)."""
    choice = (chunk.get("choices") or [{}])[0]
    return chunk.get("content") or choice.get("text") or (choice.get("delta") or {}).get("content") or ""
