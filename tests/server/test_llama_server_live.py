"""refsight against llama-server itself: the same GGUF behind both, the same raw requests in llama-server's
shapes, the same answers (tokens, text, counts) and the answer fields llama-server clients read.

The llama-server binary is built from the llama-cpp-python sdist on first use and cached in the user
cache dir (``benchmarks/llama_server.py``), as the vs-llama-server benchmark does: hence slow.
"""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import pytest
from runtimes import require_module

from live_server import LiveServer, b64, photo_png
from refsight.server import ServerConfig, create_app

require_module("llama_cpp.mtmd_cpp", "pip install 'refsight[llamacpp]'")

GGUF = "tiny-qwen2-vl-gguf"
PROMPT = "<|im_start|>user\nName three colours.<|im_end|>\n<|im_start|>assistant\n"
MARKER = "<__media__>"  # mtmd's default, refsight's marker


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """(llama-server's URL, refsight's URL) on the same GGUF, with the same context and batch sizes."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import llama_server

    from refsight.backends.llamacpp.models import ensure_gguf

    model, mmproj = ensure_gguf(GGUF)
    binary = llama_server.ensure_llama_server()
    with pytest.MonkeyPatch.context() as env:
        env.setenv("LLAMA_MEDIA_MARKER", MARKER)  # llama-server's marker is random unless pinned
        theirs = llama_server.LlamaServer(binary, model, mmproj, threads=2).start()
    ours = LiveServer(create_app(ServerConfig(store=tmp_path_factory.mktemp("live"), model=GGUF, keys={}))).start()
    yield theirs.url, ours.url
    ours.stop()
    theirs.stop()


def _both(servers, method: str, path: str, **kwargs):
    return [httpx.request(method, f"{url}{path}", timeout=300, **kwargs) for url in servers]


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_the_native_endpoints_answer_as_llama_server_does(servers):
    theirs, ours = (r.json() for r in _both(servers, "GET", "/health"))
    assert theirs == ours == {"status": "ok"}
    for body in ({"content": "Hi <|im_start|> ünï 🐈"}, {"content": "Hi <|im_start|>", "with_pieces": True},
                 {"content": "Hi <|im_start|>", "parse_special": False}, {"content": "Hi", "add_special": True}):
        theirs, ours = (r.json() for r in _both(servers, "POST", "/tokenize", json=body))
        assert theirs == ours, body
    ids = ours["tokens"]
    theirs, ours = (r.json() for r in _both(servers, "POST", "/detokenize", json={"tokens": [1, 53, 86, 2]}))
    assert theirs == ours and ids
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "hello"}, {"role": "user", "content": "colours?"}]
    theirs, ours = (r.json() for r in _both(servers, "POST", "/apply-template", json={"messages": messages}))
    assert theirs == ours
    theirs, ours = (r.json() for r in _both(servers, "GET", "/slots"))
    assert set(theirs[0]) <= set(ours[0])
    theirs, ours = (r.json() for r in _both(servers, "GET", "/props"))
    assert {"default_generation_settings", "total_slots", "model_path", "chat_template", "modalities", "media_marker",
            "build_info", "model_alias"} <= set(theirs) & set(ours)
    assert theirs["modalities"]["vision"] == ours["modalities"]["vision"] is True
    assert theirs["chat_template"] == ours["chat_template"]


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_completion_is_llama_servers_answer_and_with_an_image_its_chat_answer(servers):
    body = {"prompt": PROMPT, "n_predict": 12, "temperature": 0, "return_tokens": True, "cache_prompt": False}
    theirs, ours = (r.json() for r in _both(servers, "POST", "/completion", json=body))
    assert set(theirs) <= set(ours)  # every field a llama-server client reads is there
    for key in ("content", "tokens", "tokens_predicted", "tokens_evaluated", "stop_type", "stop", "has_new_line"):
        assert theirs[key] == ours[key], key
    assert [httpx.get(f"{url}/props").json()["media_marker"] for url in servers] == [MARKER, MARKER]
    # With an image: refsight's /completion of the chat's own prompt is llama-server's chat answer. (llama-server's
    # /completion of that very prompt evaluates one token fewer than its chat on this build, and answers otherwise.)
    image = b64(photo_png("chelsea", (56, 56)))
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": f"data:image/png;base64,{image}"}},
                                             {"type": "text", "text": "What is this?"}]}]
    theirs_prompt, ours_prompt = (r.json()["prompt"] for r in _both(servers, "POST", "/apply-template", json={"messages": messages}))
    assert theirs_prompt == ours_prompt and theirs_prompt.count(MARKER) == 1
    chat = httpx.post(f"{servers[0]}/v1/chat/completions", timeout=300,
                      json={"messages": messages, "max_tokens": 12, "temperature": 0}).json()
    ours = httpx.post(f"{servers[1]}/completion", timeout=300, json={**body, "prompt": ours_prompt, "multimodal_data": [image]}).json()
    assert ours["content"] == chat["choices"][0]["message"]["content"]
    assert ours["tokens_evaluated"] == chat["usage"]["prompt_tokens"]
