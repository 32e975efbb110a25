"""Property: any image shape and any prompt text is a 200 or a 4xx on the routes that take them, never a 500
(issue 38, item 3), on real tiny models over loopback.
"""

from __future__ import annotations

import io

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from live_server import LiveServer, b64, data_url
from PIL import Image

# Shapes from 1 pixel to thin strips past every processor's aspect-ratio limit.
SIDES = st.one_of(st.integers(1, 64), st.integers(65, 1200), st.sampled_from([1, 2, 3, 13, 14, 28, 2000, 4000]))
TEXTS = st.one_of(st.just(""), st.text(max_size=60), st.sampled_from(["<__media__>", "<image>", "\x00", " ", "\n" * 5]))
SETTINGS = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _png(width: int, height: int) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (width % 256, height % 256, 90)).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture(scope="module", params=["toy", "tiny-qwen2-vl"])
def live(request, tmp_path_factory, model_cache) -> LiveServer:
    from refsight.server import ServerConfig, create_app

    config = ServerConfig(store=tmp_path_factory.mktemp("store"), model=request.param, keys={}, max_new_tokens=4)
    server = LiveServer(create_app(config)).start()
    yield server
    server.stop()


def _never_500(response) -> None:
    assert response.status_code in (200, 201) or 400 <= response.status_code < 500, (response.status_code, response.text[:300])


@SETTINGS
@given(width=SIDES, height=SIDES, text=TEXTS)
def test_image_shapes_and_texts_are_never_a_500(live, width, height, text):
    image = _png(width, height)
    model = live.service.served_model
    with live.client() as c:
        _never_500(c.post("/v1/references", json={"image": b64(image), "metadata": {"note": text}}))
        parts = [{"type": "image_url", "image_url": {"url": data_url(image)}}, {"type": "text", "text": text}]
        _never_500(c.post("/v1/chat/completions", json={
            "model": model, "max_tokens": 2, "messages": [{"role": "user", "content": parts}]}))
        marker = c.get("/props").json()["media_marker"]
        _never_500(c.post("/completion", json={"prompt": f"{text}{marker}", "multimodal_data": [b64(image)], "n_predict": 2}))
        _never_500(c.post("/apply-template", json={"messages": [{"role": "user", "content": parts}]}))
        _never_500(c.post("/v1/compare", json={"candidate": b64(image), "criteria": [text]}))


@SETTINGS
@given(text=TEXTS)
def test_prompt_texts_are_never_a_500(live, text):
    model = live.service.served_model
    with live.client() as c:
        _never_500(c.post("/completion", json={"prompt": text, "n_predict": 2}))
        _never_500(c.post("/v1/completions", json={"model": model, "prompt": text, "max_tokens": 2}))
        _never_500(c.post("/v1/chat/completions", json={
            "model": model, "max_tokens": 2, "messages": [{"role": "user", "content": text}]}))
        _never_500(c.post("/tokenize", json={"content": text}))
        _never_500(c.post("/v1/search", json={"text": text}))
