"""Images count against the prompt limit (issue 38), on a real tiny model over loopback.

One stored reference named 4,000 times in a 277 KB body was a 56,026-token prompt: the limit counted
text tokens only. Now each image's tokens count too (a stored package by its layout) and a prompt
over ``max_prompt_tokens`` or the context is llama-server's 400 ``exceed_context_size_error``, with
``n_prompt_tokens`` including the images, before any prefill; the server keeps answering.
"""

from __future__ import annotations

import io

import pytest
from live_server import LiveServer, b64, data_url, photo_png
from PIL import Image

#: tiny-qwen2-vl lays a 64x48 photo out as 6 tokens: 11 of them overflow this limit, one fits.
LIMIT = 60


def _chat(model: str, names: int, **extra) -> dict:
    parts = [{"type": "image_url", "image_url": {"url": "refsight://ref/cat"}}] * names
    return {"model": model, "max_tokens": 2, "messages": [{"role": "user", "content": [*parts, {"type": "text",
                                                                                              "text": "same?"}]}],
            **extra}


def _refused(response) -> dict:
    assert response.status_code == 400, (response.status_code, response.text)
    error = response.json()["error"]
    assert error["code"] == "exceed_context_size_error", error
    return error


@pytest.fixture(scope="module")
def limited(tmp_path_factory, model_cache) -> LiveServer:
    from refsight.server import ServerConfig, create_app

    config = ServerConfig(store=tmp_path_factory.mktemp("store"), model="tiny-qwen2-vl", keys={}, workers=1,
                          max_prompt_tokens=LIMIT)
    live = LiveServer(create_app(config)).start()
    with live.client() as c:
        assert c.post("/v1/references", json={"image": b64(photo_png()), "id": "cat"}).status_code == 201
    yield live
    live.stop()


def _overflow(live: LiveServer, model: str, bound: int) -> None:
    """One name fits; enough names of the same reference to pass ``bound`` are refused, counting the images."""
    with live.client() as c:
        one = c.post("/v1/chat/completions", json=_chat(model, 1))
        assert one.status_code == 200, one.text
        per_image = one.json()["usage"]["prompt_tokens_details"]["cached_tokens"]  # the cached reference's tokens
        names = bound // per_image + 1
        assert 0 < per_image and names <= 16, (per_image, names)  # within max_images_per_request
        error = _refused(c.post("/v1/chat/completions", json=_chat(model, names)))
        assert error["n_ctx"] == bound and error["n_prompt_tokens"] >= names * per_image > bound, error
        assert f"in {names} images" in error["message"], error
        # llama-server's words first (its clients match on them), refsight's count after.
        assert error["message"].startswith(f"request ({error['n_prompt_tokens']} tokens) exceeds the available "
                                           f"context size ({bound} tokens), try increasing it; "), error
        # Ollama's door and llama-server's /completion count the same images.
        ollama = c.post("/api/chat", json={"model": model, "stream": False, "messages": [
            {"role": "user", "content": "same?", "images": ["refsight://ref/cat"] * names}]})
        assert ollama.status_code == 400 and ollama.json()["code"] == "exceed_context_size_error", ollama.text
        # The server stays healthy: what fits is still answered.
        again = c.post("/v1/chat/completions", json=_chat(model, 1))
        assert again.status_code == 200, again.text
        assert c.get("/health").status_code == 200


def test_a_reference_named_past_the_prompt_limit_is_400_counting_its_tokens(limited):
    _overflow(limited, "tiny-qwen2-vl", LIMIT)


def test_new_images_past_the_limit_are_refused_by_their_size_before_encoding(limited):
    # Qwen lays an image out from its size alone: 16 new 64x48 images (4 image tokens each, the placeholder the
    # processor writes between the template's <|vision_start|> and <|vision_end|>) are refused unencoded.
    parts = [{"type": "image_url", "image_url": {"url": data_url(_solid(i))}} for i in range(16)]
    with limited.client() as c:
        misses = c.get("/v1/stats").json()["misses"]
        error = _refused(c.post("/v1/chat/completions", json={"model": "tiny-qwen2-vl", "max_tokens": 2, "messages": [
            {"role": "user", "content": [*parts, {"type": "text", "text": "which?"}]}]}))
        assert error["n_ctx"] == LIMIT and error["n_prompt_tokens"] >= 16 * 4, error
        assert c.get("/v1/stats").json()["misses"] == misses  # no package was encoded


def _solid(i: int) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (64, 48), (i * 15, 80, 160)).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.mark.slow  # a server on the tiny model converted to GGUF (llama-cpp-python: an optional runtime)
def test_a_reference_named_past_the_context_is_400_counting_its_tokens(small_context):
    _overflow(small_context, "tiny-qwen2-vl-gguf", 256)


@pytest.fixture(scope="module")
def small_context(tmp_path_factory, model_cache) -> LiveServer:
    """llama.cpp with a 256-token context (``refsight serve -c 256``); its reference a 256x192 photo."""
    from refsight.backends.options import BackendOptions
    from refsight.server import ServerConfig, create_app

    config = ServerConfig(store=tmp_path_factory.mktemp("store"), model="tiny-qwen2-vl-gguf", keys={}, workers=1,
                          backend_options=BackendOptions(n_ctx=256))
    live = LiveServer(create_app(config)).start()
    with live.client() as c:
        assert c.post("/v1/references", json={"image": b64(photo_png(size=(256, 192))), "id": "cat"}).status_code == 201
    yield live
    live.stop()
