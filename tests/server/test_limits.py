"""Limits: body size, image pixels, a bounded work queue (429), work off the event loop, one encode per image."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from live_server import assert_error, b64, data_url, photo_png
from refsight.backends.registry import get_backend, register_backend
from refsight.backends.toy import ToyBackend


class SlowToy(ToyBackend):
    """The toy backend with a fixed delay in encode and generate, to make overlaps certain."""

    delay = 0.4

    def encode(self, images):
        time.sleep(self.delay)
        return super().encode(images)

    def generate(self, requests, **options):
        time.sleep(self.delay)
        return super().generate(requests, **options)


@pytest.fixture
def slow_model(backend_registry) -> str:
    name = "slow-toy-server-tests"
    register_backend(name, lambda model, **options: SlowToy(model))  # re-registering drops an old instance
    return name


def _chat(url: str, text: str = "hello") -> httpx.Response:
    payload = {"model": "slow-toy-server-tests", "messages": [{"role": "user", "content": text}]}
    return httpx.post(f"{url}/v1/chat/completions", json=payload, timeout=30)


def test_body_over_the_limit_is_413_declared_or_chunked(make_server):
    live = make_server(max_body_bytes=50_000)
    with live.client() as c:
        big = {"image": "A" * 60_000}
        assert_error(c.post("/v1/references", json=big), 413, "body_too_large")

        def chunks():
            for _ in range(8):
                yield b"x" * 10_000

        chunked = c.post("/v1/references", content=chunks(), headers={"content-type": "application/json"})
        assert_error(chunked, 413, "body_too_large")
        assert c.post("/v1/references", json={"image": b64(photo_png()), "id": "small"}).status_code == 201


def test_images_over_the_pixel_limit_are_refused(make_server):
    live = make_server(max_image_pixels=1000)
    with live.client() as c:
        error = assert_error(c.post("/v1/references", json={"image": b64(photo_png(size=(64, 48))), "id": "big"}),
                             400, "invalid_image")
        assert "3072 pixels" in error["message"] and "1000-pixel limit" in error["message"]
        chat = c.post("/v1/chat/completions", json={"model": "toy", "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": data_url(photo_png(size=(64, 48)))}}]}]})
        assert "messages[0].content[0].image_url" in assert_error(chat, 400, "invalid_image")["message"]
        assert c.get("/v1/references").json() == {"references": []}


def test_a_full_queue_answers_429_and_the_rest_complete(make_server, slow_model):
    live = make_server(model=slow_model, workers=1, queue=1)
    with ThreadPoolExecutor(6) as pool:
        responses = list(pool.map(lambda i: _chat(live.url, f"q{i}"), range(6)))
    codes = sorted(r.status_code for r in responses)
    assert codes.count(200) >= 2 and codes.count(429) >= 1 and set(codes) <= {200, 429}, codes
    refused = next(r for r in responses if r.status_code == 429)
    assert_error(refused, 429, "overloaded")
    assert refused.headers["retry-after"] == "1"
    # Once the queue drains the service answers again.
    assert _chat(live.url).status_code == 200


def test_model_work_runs_off_the_event_loop(make_server, slow_model):
    live = make_server(model=slow_model, workers=1)
    SlowToy.delay = 5.0
    try:
        worker = threading.Thread(target=_chat, args=(live.url,))
        worker.start()
        time.sleep(0.5)  # the chat is now inside generate, holding the only worker for 5 s
        assert httpx.get(f"{live.url}/healthz", timeout=5).status_code == 200
        with live.client() as c:
            assert c.get("/v1/references").status_code == 200  # catalog reads do not queue behind the model
        # An order, not a time: both were answered while the model still held its worker.
        assert worker.is_alive()
        worker.join()
    finally:
        SlowToy.delay = 0.4


@pytest.mark.parametrize("share", [False, True], ids=["isolated-tenants", "shared-encodes"])
def test_concurrent_adds_of_one_new_image_encode_it_once(make_server, slow_model, share):
    live = make_server(
        model=slow_model, workers=8, keys={"tenant-a-key-123": "a", "tenant-b-key-456": "b"}, share_packages=share
    )
    backend = get_backend(slow_model)
    before = backend.images_encoded
    png = photo_png("rocket")

    def add(i: int) -> dict:
        key = "tenant-a-key-123" if i % 2 else "tenant-b-key-456"
        with live.client(key) as c:
            response = c.post("/v1/references", json={"image": b64(png), "id": f"r{i}"})
            assert response.status_code == 201, response.text
            return {"tenant": key[7], **response.json()}

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(add, range(8)))
    # Isolated tenants each encode the image once (their keys differ); shared, the deployment does once.
    assert backend.images_encoded - before == (1 if share else 2)
    assert len({r["package_key"] for r in results}) == (1 if share else 2)
    cached = {tenant: sorted(r["cached"] for r in results if r["tenant"] == tenant) for tenant in ("a", "b")}
    if share:
        assert sorted(cached["a"] + cached["b"]) == [False] + [True] * 7
    else:  # each tenant sees exactly one "first" add of its own; the rest are its own cache hits
        assert cached == {"a": [False, True, True, True], "b": [False, True, True, True]}
