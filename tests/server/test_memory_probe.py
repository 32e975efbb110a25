"""Benchmark-style probe: the RSS of a real ``refsight serve`` under requests within the documented limits
(issue 38, item 1). The bound is the README's: no such request or flood raises the server's peak RSS by
more than :data:`BOUND_MB` over its idle RSS.

Three floods, each small on the wire (and, below, one request with the most images of the most pixels
the limits allow, which holds one decoded image at a time): a chat naming 32 copies of a 3000x3000 lossless WebP (a few KB
each: 9 megapixels decoded apiece), 8 concurrent thumbnails of a 24-megapixel reference, and a uuid
flood (16 parts a request under 256-character uuids).
"""

from __future__ import annotations

import base64
import io
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from hardening_helpers import ServeProcess
from runtimes import require_module
from PIL import Image

pytestmark = pytest.mark.slow  # each test measures a server in a subprocess

#: The README's bound on what one request or flood within the limits adds to the server's RSS.
BOUND_MB = 1024


def _vm_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def _encoded(size: tuple[int, int], fmt: str, color: tuple[int, int, int] = (30, 60, 90), **options) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, color).save(buffer, format=fmt, **options)
    return buffer.getvalue()


def run_floods(url: str) -> dict[str, int]:
    """The three floods against a server at ``url``; the status codes seen, by flood."""
    seen: dict[str, int] = {}
    webp = base64.b64encode(_encoded((3000, 3000), "WEBP", lossless=True)).decode()
    part = {"type": "image_url", "image_url": {"url": f"data:image/webp;base64,{webp}"}}
    with httpx.Client(base_url=url, timeout=300) as c:
        chat = c.post("/v1/chat/completions", json={
            "model": "toy", "max_tokens": 1, "messages": [{"role": "user", "content": [part] * 32}]})
        seen["chat_32_images"] = chat.status_code
        big = base64.b64encode(_encoded((6000, 4000), "JPEG", quality=60)).decode()
        seen["add_reference"] = c.post("/v1/references", json={"image": big, "id": "big"}).status_code
        tiny = base64.b64encode(_encoded((8, 8), "PNG")).decode()
        tiny_part = {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{tiny}"}}
        for i in range(40):
            parts = [{**tiny_part, "uuid": f"{i:04d}-{j:02d}".ljust(256, "u")} for j in range(16)]
            seen["uuid_flood"] = c.post("/v1/chat/completions", json={
                "model": "toy", "max_tokens": 1, "messages": [{"role": "user", "content": parts}]}).status_code

    def thumbnail(size: int) -> int:
        with httpx.Client(base_url=url, timeout=300) as c:
            return c.get("/v1/references/big/thumbnail", params={"size": size}).status_code

    with ThreadPoolExecutor(8) as pool:
        seen["thumbnails"] = max(pool.map(thumbnail, [1024, 1000, 900, 800, 700, 600, 1023, 999]))
    return seen


def test_requests_within_the_limits_stay_under_the_rss_bound(tmp_path):
    server = ServeProcess(tmp_path / "store").wait_ready()
    try:
        idle = _vm_rss_mb(server.process.pid)
        seen = run_floods(server.url)
        peak = server.peak_rss_mb()
        after = _vm_rss_mb(server.process.pid)
    finally:
        server.stop()
    print(f"idle {idle:.0f} MB, peak {peak:.0f} MB, after {after:.0f} MB, {seen}")
    assert seen["chat_32_images"] == 400 and seen["add_reference"] == 201, seen
    assert seen["uuid_flood"] == 200 and seen["thumbnails"] == 200, seen
    assert peak - idle < BOUND_MB, f"peak RSS rose {peak - idle:.0f} MB over idle {idle:.0f} MB"


#: The most a request may hold within the limits: ``max_images_per_request`` (16) distinct images of 5 megapixels
#: each, 80 M pixels together (``max_request_pixels``), a few KB each on the wire as lossless WebP.
MOST_IMAGES, SIDE = 16, 2236
#: 15 MB: one such image decoded (RGB).
DECODED_MB = SIDE * SIDE * 3 / 2**20


def test_a_request_holds_one_decoded_image_at_a_time(tmp_path):
    """Each image is released once encoded (issue 38): the request's peak is about one decoded image, not 16."""
    parts = []
    for i in range(MOST_IMAGES):
        webp = base64.b64encode(_encoded((SIDE, SIDE), "WEBP", lossless=True, color=(i * 15, 60, 90))).decode()
        parts.append({"type": "image_url", "image_url": {"url": f"data:image/webp;base64,{webp}"}})
    server = ServeProcess(tmp_path / "store").wait_ready()
    try:
        with httpx.Client(base_url=server.url, timeout=300) as c:
            warm = c.post("/v1/chat/completions", json={"model": "toy", "max_tokens": 1, "messages": [
                {"role": "user", "content": parts[:1]}]})  # the first request's one-off costs (imports, pools)
            idle = server.peak_rss_mb()
            chat = c.post("/v1/chat/completions", json={"model": "toy", "max_tokens": 1, "messages": [
                {"role": "user", "content": parts}]})
        peak = server.peak_rss_mb()
    finally:
        server.stop()
    rise = peak - idle
    print(f"{MOST_IMAGES} images of {SIDE}x{SIDE}: peak RSS {idle:.0f} MB after one image, {peak:.0f} MB after "
          f"all, +{rise:.0f} MB ({rise / DECODED_MB:.1f} decoded images)")
    assert warm.status_code == 200 and chat.status_code == 200, (warm.text, chat.text)
    assert rise < 6 * DECODED_MB, f"peak RSS rose {rise:.0f} MB: {rise / DECODED_MB:.1f} decoded images held at once"


def _png16(width: int, height: int, colour_type: int) -> bytes:
    """A 16-bit PNG (colour type 0: grey, 4: grey and alpha) of one colour, written row by row through zlib:
    ~100 KB on the wire for 40 M pixels (Pillow writes no 16-bit grey+alpha)."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    compressor = zlib.compressobj(9)
    row = b"\x00" + b"\x12\x34" * {0: 1, 4: 2}[colour_type] * width
    pixels = b"".join([compressor.compress(row) for _ in range(height)] + [compressor.flush()])
    header = struct.pack(">IIBBBBB", width, height, 16, colour_type, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")


def _hostile_cases(model: str) -> list[tuple[str, str, bytes, int, int]]:
    """``(name, path, body, status, bound MB on toy)`` of issue 49's items 5 and 10, each small on the wire."""
    escapes = b'{"prompt":"' + b'\\"' * ((31 << 20) // 2) + b'"}'
    lists = b'{"model":"toy","l":[' + b"[]," * ((31 << 20) // 3) + b"[]]}"
    return [("escapes, unknown path", "/no-such-route", escapes, 404, 32),
            ("escapes, /completion", "/completion", escapes, 400, 300),
            ("escapes, /api/chat", "/api/chat", escapes, 400, 300),
            ("10 M lists, /api/show", "/api/show", lists, 400, 200),
            ("16-bit grey PNG, /api/chat", "/api/chat", _image_chat(_png16(8000, 5000, 0), model), 200, 450),
            ("16-bit grey+alpha PNG, /api/chat", "/api/chat", _image_chat(_png16(8000, 5000, 4), model), 200, 450)]


def _image_chat(png: bytes, model: str) -> bytes:
    image = base64.b64encode(png).decode()
    return json.dumps({"model": model, "stream": False, "options": {"num_predict": 8}, "messages": [
        {"role": "user", "content": "hi", "images": [image]}]}).encode()


def _each_peak(tmp_path: Path, model: str, cases: list) -> dict[str, tuple[int, float, str]]:
    """Each case's status, its own peak RSS rise (the peak restarted before each) and the reply's start."""
    server = ServeProcess(tmp_path / "store", model=model).wait_ready(timeout=300)
    seen = {}
    try:
        with httpx.Client(base_url=server.url, timeout=300) as c:
            warm = c.post("/api/chat", content=_image_chat(_encoded((64, 48), "PNG"), model))  # the first request's one-off costs
            assert warm.status_code == 200, warm.text
            for name, path, body, _, _ in cases:
                base = server.reset_peak()
                reply = c.post(path, content=body, headers={"content-type": "application/json"})
                seen[name] = (reply.status_code, server.peak_rss_mb() - base, reply.text[:200])
    finally:
        server.stop()
    print(f"{model}: " + "; ".join(f"{name}: {code}, +{rise:.0f} MB" for name, (code, rise, _) in seen.items()))
    return seen


def test_hostile_bodies_and_16_bit_images_stay_far_under_the_bound(tmp_path):
    """Issue 49, items 5 and 10, each request's own peak (the peak restarted before each): 31 MiB of \\" escapes
    (+1.43 GB before: the depth scan held a Python object per escape; an unknown path read the body too), a
    body of 10 M empty lists (+868 MB, parsed), and 40-megapixel 16-bit PNGs of ~100 KB (+802 MB grey,
    +926 MB grey and alpha: int64 copies of the whole image, then four RGBA copies)."""
    cases = _hostile_cases("toy")
    seen = _each_peak(tmp_path, "toy", cases)
    for name, _, _, status, bound_mb in cases:
        code, rise, text = seen[name]
        assert code == status, (name, text)
        assert rise < bound_mb, f"{name}: peak RSS rose {rise:.0f} MB (bound {bound_mb} MB)"


@pytest.mark.parametrize("model", ["tiny-qwen2-vl", "tiny-qwen2-vl-gguf"])
def test_the_bound_holds_on_the_transformers_and_llama_cpp_runtimes(tmp_path, model):
    """The same requests on a real runtime: the 16-bit images are encoded and answered, and no request raises
    the server's peak RSS by more than the documented :data:`BOUND_MB` (llama.cpp copies the RGB pixels twice)."""
    if model.endswith("-gguf"):
        require_module("llama_cpp")
        from refsight.builtin_models.gguf import ensure_gguf

        ensure_gguf(model)  # built before the server starts, so its start is only the load
    cases = _hostile_cases(model)
    seen = _each_peak(tmp_path, model, cases)
    for name, _, _, status, _ in cases:
        code, rise, text = seen[name]
        assert code == status, (name, text)
        assert rise < BOUND_MB, f"{name}: peak RSS rose {rise:.0f} MB (bound {BOUND_MB} MB)"
