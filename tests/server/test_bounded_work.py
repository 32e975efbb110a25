"""Work and memory a small body can demand are bounded (hardening round 3, issue 38), on a real server over loopback.

Images per request and their decoded pixels in total, the vLLM uuid memory (nothing kept from a
failing request), thumbnails (snapped sizes, merged misses, a bounded pool) and ``/image`` (the kept
bytes, never decoded); ``/slots`` under keys, ``/apply-template``'s image rule and the server's own
reference URL under a spoofed ``Host``.
"""

from __future__ import annotations

import io
import threading

from live_server import assert_error, b64, data_url, photo_png
from PIL import Image


def _chat(parts: list[dict], **extra) -> dict:
    return {"model": "toy", "max_tokens": 2, "messages": [{"role": "user", "content": parts}], **extra}


def _image_part(url: str, **extra) -> dict:
    return {"type": "image_url", "image_url": {"url": url}, **extra}


def _webp(size: tuple[int, int]) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, (10, 20, 30)).save(buffer, format="WEBP", lossless=True)
    return buffer.getvalue()


def test_images_per_request_are_bounded_on_chat_and_completion(make_server):
    server = make_server(max_images_per_request=4)
    photo = data_url(photo_png())
    with server.client() as c:
        assert c.post("/v1/references", json={"image": b64(photo_png()), "id": "ref"}).status_code == 201
        ok = c.post("/v1/chat/completions", json=_chat([_image_part(photo)] * 4 + [{"type": "text", "text": "?"}]))
        assert ok.status_code == 200, ok.text
        error = assert_error(c.post("/v1/chat/completions", json=_chat([_image_part(photo)] * 5)), 400, "too_many_images")
        assert "max_images_per_request" in error["message"]
        # One stored reference named many times is as many images (issue 38: 4,000 names, 56,026 tokens).
        named = [_image_part("refsight://ref/ref")] * 4000
        assert_error(c.post("/v1/chat/completions", json=_chat(named)), 400, "too_many_images")


def test_decoded_pixels_per_request_are_bounded_before_decoding(make_server):
    # Issue 38: 32 copies of a 1.6 KB lossless WebP just under the pixel limit took the server to 6.2 GB.
    server = make_server(max_image_pixels=4_000_000, max_request_pixels=8_000_000)
    big = data_url(_webp((2000, 1900)), "image/webp")
    with server.client() as c:
        error = assert_error(c.post("/v1/chat/completions", json=_chat([_image_part(big)] * 5)), 400, "too_many_pixels")
        assert "max_request_pixels" in error["message"] and "content[2]" in error["message"]


def test_a_failing_request_remembers_no_uuid(make_server):
    server = make_server()
    uuids = server.app.state.media_uuids
    photo = data_url(photo_png())
    with server.client() as c:
        parts = [_image_part(photo, uuid="kept-only-on-success"), _image_part("", uuid="never-sent")]
        assert_error(c.post("/v1/chat/completions", json=_chat(parts)), 400, "uuid_not_found")
        assert len(uuids) == 0
        # The same uuid sent and named again in ONE request resolves to what this request sent.
        parts = [_image_part(photo, uuid="same"), _image_part("", uuid="same")]
        reply = c.post("/v1/chat/completions", json=_chat(parts))
        assert reply.status_code == 200, reply.text
        assert [u["outcome"] for u in reply.json()["refsight"]["media_uuids"]] == ["stored", "looked_up"]
        assert len(uuids) == 1


def test_the_kept_image_is_served_without_decoding(make_server, monkeypatch):
    server = make_server()
    png = photo_png()
    with server.client() as c:
        assert c.post("/v1/references", json={"image": b64(png), "id": "ref"}).status_code == 201
        engine = server.service.engine

        def no_decode(ref):
            raise AssertionError("/image decoded the kept image")

        monkeypatch.setattr(engine, "reference_image", no_decode)
        reply = c.get("/v1/references/ref/image")
        assert reply.status_code == 200 and reply.content == png and reply.headers["content-type"] == "image/png"
        thumb = c.get("/v1/references/ref/thumbnail", params={"size": 100})
        assert thumb.status_code == 200, thumb.text
        assert max(Image.open(io.BytesIO(thumb.content)).size) <= 128


def test_thumbnail_sizes_snap_and_concurrent_misses_render_once(make_server):
    server = make_server()
    buffer = io.BytesIO()
    Image.new("RGB", (3000, 2000), (200, 10, 10)).save(buffer, format="JPEG")
    with server.client() as c:
        assert c.post("/v1/references", json={"image": b64(buffer.getvalue()), "id": "big"}).status_code == 201
    cache = server.service.thumbnails
    statuses: list[int] = []

    def fetch(size: int) -> None:
        with server.client() as c:
            statuses.append(c.get("/v1/references/big/thumbnail", params={"size": size}).status_code)

    threads = [threading.Thread(target=fetch, args=(size,)) for size in (200, 201, 230, 256, 255, 240, 210, 250)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert statuses == [200] * 8
    # Eight sizes snap to one (256), and eight concurrent misses of it render once.
    assert cache.renders == 1 and cache.hits == 7


def test_slots_do_not_show_other_tenants_work(make_server):
    server = make_server(keys={"key-a-12345678": "a", "key-b-12345678": "b"})
    server.app.state.pool._pending = 1  # another tenant's request holds a worker
    try:
        with server.client("key-b-12345678") as c:
            slots = c.get("/slots").json()
        assert not any(slot["is_processing"] for slot in slots)
    finally:
        server.app.state.pool._pending = 0


def test_apply_template_refuses_images_where_chat_does(server):
    messages = [{"role": "system", "content": [_image_part(data_url(photo_png()))]},
                {"role": "user", "content": "hello"}]
    with server.client() as c:
        assert c.post("/v1/chat/completions", json={"model": "toy", "messages": messages}).status_code == 400
        reply = c.post("/apply-template", json={"messages": messages})
        assert reply.status_code == 400 and reply.json()["error"]["code"] == "unsupported", reply.text


def test_a_spoofed_host_never_makes_another_url_this_servers(server):
    with server.client() as c:
        assert c.post("/v1/references", json={"image": b64(photo_png()), "id": "ref"}).status_code == 201
        other = _image_part("http://evil.example:9999/v1/references/ref/image")
        reply = c.post("/v1/chat/completions", json=_chat([other]), headers={"Host": "evil.example:9999"})
        # Refused: by the Host check (no keys) before the URL is even looked at.
        assert reply.status_code in (400, 403), reply.text
        own = _image_part(f"{server.url}/v1/references/ref/image")
        assert c.post("/v1/chat/completions", json=_chat([own])).status_code == 200


def test_a_spoofed_host_with_keys_does_not_resolve_another_url(make_server):
    server = make_server(keys={"key-a-12345678": "a"})
    with server.client("key-a-12345678") as c:
        assert c.post("/v1/references", json={"image": b64(photo_png()), "id": "ref"}).status_code == 201
        other = _image_part("http://evil.example:9999/v1/references/ref/image")
        reply = c.post("/v1/chat/completions", json=_chat([other]), headers={"Host": "evil.example:9999"})
        assert_error(reply, 400, "unsupported")  # a remote URL, not this server's reference
