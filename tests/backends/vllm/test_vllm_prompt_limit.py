"""Images count against the prompt limit on the vLLM backend too (issue 38), against a real tiny vLLM server.

The vLLM backend counts an image's prompt tokens before anything is sent: a stored reference by
its package (the Qwen grid), a new image by its size, exactly as the transformers backend of the
same weights counts them. A chat naming one reference past ``max_prompt_tokens`` is refsight's 400
``exceed_context_size_error`` (llama-server's shape; ``tests/server/test_prompt_images.py`` holds the
transformers and llama.cpp versions), and vLLM never sees the request; the server keeps answering.
"""

from __future__ import annotations

import base64
import io

import pytest
from PIL import Image

pytestmark = pytest.mark.vllm

MODEL = "tiny-qwen2-vl-vllm"
#: The tiny model lays a 64x48 photo out as 4 image pads (the processor's placeholder): 8 names overflow this limit,
#: one fits.
LIMIT = 30


def _png(image: Image.Image) -> str:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


def _photo(size: tuple[int, int] = (64, 48)) -> Image.Image:
    from refsight.samples import load_sample

    return load_sample("chelsea").resize(size)


@pytest.fixture(scope="module")
def server(vllm_servers):
    """The session's tiny Qwen2-VL vLLM server (pixels allowed), shared with the other vLLM tests."""
    return vllm_servers.get(MODEL, 8)


@pytest.fixture(scope="module")
def limited(server, tmp_path_factory):
    """refsight's server on that vLLM server with ``max_prompt_tokens`` = :data:`LIMIT`; reference ``cat`` stored."""
    from fastapi.testclient import TestClient

    from refsight.server import ServerConfig, create_app

    config = ServerConfig(store=tmp_path_factory.mktemp("store"), model=f"vllm:{server.url}", keys={}, workers=1,
                          max_prompt_tokens=LIMIT)
    with TestClient(create_app(config), base_url="http://127.0.0.1") as client:  # loopback: no API keys needed
        added = client.post("/v1/references", json={"image": _png(_photo()), "id": "cat"})
        assert added.status_code == 201, added.text
        yield client


def _chat(client, names: int) -> object:
    parts = [{"type": "image_url", "image_url": {"url": "refsight://ref/cat"}}] * names
    return client.post("/v1/chat/completions", json={"model": _model(client), "max_tokens": 2, "messages": [
        {"role": "user", "content": [*parts, {"type": "text", "text": "same?"}]}]})


def _model(client) -> str:
    """The model name refsight's server serves (its ``vllm:URL``)."""
    return client.app.state.service.model


def _refused(response) -> dict:
    assert response.status_code == 400, (response.status_code, response.text)
    error = response.json()["error"]
    assert error["code"] == "exceed_context_size_error", error
    assert "max_prompt_tokens" in error["message"], error  # refsight's pre-check, not vLLM's own refusal
    return error


def _vllm_requests(server) -> float:
    """Requests vLLM has finished since it started (its Prometheus counter)."""
    from refsight.backends.vllm.client import VLLMClient

    return VLLMClient("probe", server.url).metric_sum("vllm:request_success")


def test_vllm_counts_an_image_as_the_transformers_backend_of_the_same_weights(server):
    from refsight.backends.registry import get_backend
    from refsight.inputs.images import load_image

    hf = get_backend(MODEL)  # built once per process (shared, so not closed here)
    for images in ("pixels", "embeds"):
        vllm = get_backend(f"vllm:{server.url}", images=images)
        for size in ((64, 48), (256, 192), (13, 900)):
            image = load_image(_photo(size), name=f"photo-{size}")
            expected = hf.image_token_count(image)
            assert expected == hf.image_token_count(hf.encode([image])[0]) > 2, (images, size)
            assert vllm.image_token_count(image) == expected, (images, size)
            assert vllm.image_token_count(vllm.encode([image])[0]) == expected, (images, size)


def test_a_reference_named_past_the_prompt_limit_is_400_before_vllm(limited, server):
    from refsight.backends.registry import get_backend
    from refsight.inputs.images import load_image

    hf = get_backend(MODEL)
    per_image = hf.image_token_count(load_image(_photo(), name="cat"))
    names = LIMIT // per_image + 1
    assert names <= 8, names  # within the vLLM server's image limit: today vLLM would answer it
    one = _chat(limited, 1)
    assert one.status_code == 200, one.text
    sent = _vllm_requests(server)
    error = _refused(_chat(limited, names))
    assert error["n_ctx"] == LIMIT and error["n_prompt_tokens"] >= names * per_image > LIMIT, error
    assert f"in {names} images" in error["message"], error
    ollama = limited.post("/api/chat", json={"model": _model(limited), "stream": False, "messages": [
        {"role": "user", "content": "same?", "images": ["refsight://ref/cat"] * names}]})
    assert ollama.status_code == 400 and ollama.json()["code"] == "exceed_context_size_error", ollama.text
    assert _vllm_requests(server) == sent  # neither request reached vLLM
    again = _chat(limited, 1)
    assert again.status_code == 200, again.text


def test_new_images_past_the_limit_are_refused_by_their_size(limited, server):
    # Eight new 64x48 images (4 image tokens each) are refused from their size: no package made, nothing sent.
    parts = [{"type": "image_url", "image_url": {"url": "data:image/png;base64," + _png(
        Image.new("RGB", (64, 48), (i * 15, 80, 160)))}} for i in range(8)]
    misses = limited.get("/v1/stats").json()["misses"]
    sent = _vllm_requests(server)
    error = _refused(limited.post("/v1/chat/completions", json={"model": _model(limited), "max_tokens": 2, "messages": [
        {"role": "user", "content": [*parts, {"type": "text", "text": "which?"}]}]}))
    assert error["n_ctx"] == LIMIT and error["n_prompt_tokens"] >= 8 * 4, error
    assert limited.get("/v1/stats").json()["misses"] == misses
    assert _vllm_requests(server) == sent


def test_a_prompt_over_vllms_context_is_the_callers_400_not_a_500(server, tmp_path):
    # Under refsight's own limit but over vLLM's --max-model-len 4096: vLLM refuses it (HTTP 400), and
    # refsight's server answers llama-server's exceed_context_size_error with vLLM's figures (was a 500).
    import random

    from fastapi.testclient import TestClient

    from refsight.server import ServerConfig, create_app

    letters = random.Random(0)
    text = " ".join("".join(letters.choice("qxzjkvwy") for _ in range(5)) for _ in range(4000))
    config = ServerConfig(store=tmp_path / "store", model=f"vllm:{server.url}", keys={}, workers=1,
                          max_prompt_tokens=60_000)
    with TestClient(create_app(config), base_url="http://127.0.0.1") as client:
        response = client.post("/v1/chat/completions", json={"model": _model(client), "max_tokens": 2, "messages": [
            {"role": "user", "content": text}]})
        assert response.status_code == 400, (response.status_code, response.text)
        error = response.json()["error"]
        assert error["code"] == "exceed_context_size_error" and error["n_ctx"] == 4096, error
        assert error["n_prompt_tokens"] > 4096 and "vLLM" in error["message"], error
        fits = client.post("/v1/chat/completions", json={"model": _model(client), "max_tokens": 2, "messages": [
            {"role": "user", "content": "same?"}]})
        assert fits.status_code == 200, fits.text
