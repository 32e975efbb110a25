"""The memory bound on the routes that decoded or tokenized outside the work pool (issue 60, groups 4 and 5), on one
real ``refsight serve`` of the tiny GGUF with one worker, its RSS read from ``/proc`` (peak: ``VmHWM``, restarted
before each flood).

Before, ``/v1/messages/count_tokens`` and ``/v1/chat/completions/input_tokens`` decoded their images and
``/tokenize`` read its pieces in the shared thread pool, every request at once (12 requests of two 39.6-Mpx PNGs:
+1.97 GB peak, 1.30 GB kept; 24 ``/tokenize`` of 131k CJK characters ``with_pieces``: +2.9 GB), and a ``logit_bias``
text key was tokenized on the event loop before any bound (a 20M-character key: ``/health`` frozen 10.3 s, +1.67 GB).
Now they take the work pool's turns, as chat does, and a text key is bounded before anything is tokenized. The sizes
here are the smallest that still fail the old code (its figures are in each test's docstring).
"""

from __future__ import annotations

import base64
import struct
import threading
import time
import zlib
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from hardening_helpers import ServeProcess
from runtimes import require_module

pytestmark = pytest.mark.slow  # a real `refsight serve` of the tiny GGUF, measured

GGUF = "tiny-qwen2-vl-gguf"


def _png(width: int, height: int, shade: int) -> bytes:
    """An 8-bit RGB PNG of one colour, written row by row through zlib: a few KB on the wire, ``width x height``
    pixels decoded."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    compressor = zlib.compressobj(9)
    row = b"\x00" + bytes((shade, 60, 90)) * width
    pixels = b"".join([compressor.compress(row) for _ in range(height)] + [compressor.flush()])
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    require_module("llama_cpp")
    from refsight.builtin_models.gguf import ensure_gguf

    ensure_gguf(GGUF)  # built before the server starts, so its start is only the load
    served = ServeProcess(tmp_path_factory.mktemp("memory") / "store", "--attributes", "none",
                          model=GGUF).wait_ready(timeout=300)
    try:
        yield served
    finally:
        served.stop()


def _flood(server: ServeProcess, requests: list[tuple[str, dict]]) -> tuple[list[int], float, float]:
    """All ``requests`` at once: their statuses, the peak RSS rise over the RSS before, and what stays after, in MB."""
    base = server.reset_peak()
    with ThreadPoolExecutor(len(requests)) as pool, httpx.Client(base_url=server.url, timeout=300) as c:
        codes = list(pool.map(lambda r: c.post(r[0], json=r[1]).status_code, requests))
    peak = server.peak_rss_mb() - base
    time.sleep(0.5)
    return codes, peak, server.rss_mb() - base


#: Concurrent requests of each flood, and the images' side (two images a request, 6.25 Mpx each).
IMAGE_REQUESTS, SIDE = 8, 2500


def test_counting_a_prompts_images_takes_the_pools_turns(server):
    """8 requests (4 ``count_tokens``, 4 ``input_tokens``), each with two 6.25-Mpx PNGs: one decoded image at a time
    (one worker): +2 MB peak. Before: every request decoded at once, +246 MB peak, all of it kept (12 requests of two
    39.6-Mpx images: +1.97 GB, against +345 MB now)."""
    images = [base64.b64encode(_png(SIDE, SIDE, shade)).decode() for shade in (10, 200)]
    openai = {"model": GGUF, "messages": [{"role": "user", "content": [
        *({"type": "image_url", "image_url": {"url": f"data:image/png;base64,{b}"}} for b in images),
        {"type": "text", "text": "?"}]}]}
    anthropic = {"model": GGUF, "messages": [{"role": "user", "content": [
        *({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b}} for b in images),
        {"type": "text", "text": "?"}]}]}
    warm = [("/v1/chat/completions/input_tokens", openai)]  # the first decode's one-off costs count in the base
    assert _flood(server, warm)[0] == [200]
    flood = [("/v1/messages/count_tokens", anthropic), ("/v1/chat/completions/input_tokens", openai)] * (IMAGE_REQUESTS // 2)
    codes, peak, kept = _flood(server, flood)
    print(f"{IMAGE_REQUESTS} image counts: peak +{peak:.0f} MB, kept +{kept:.0f} MB")
    assert codes == [200] * IMAGE_REQUESTS, codes
    assert peak < 100 and kept < 60, (peak, kept)


#: Concurrent ``/tokenize`` requests and their CJK characters each.
TOKENIZE_REQUESTS, CJK_CHARS = 8, 32768


def test_tokenize_with_pieces_takes_the_pools_turns(server):
    """8 ``/tokenize`` of 32k CJK characters ``with_pieces`` (98k tokens each): one at a time, +19 MB peak. Before:
    all at once, +210 MB (24 of 131k characters: +2.9 GB, against +327 MB now)."""
    text = "".join(chr(0x4E00 + (i * 7919) % 20000) for i in range(CJK_CHARS))
    body = {"content": text, "with_pieces": True}
    assert _flood(server, [("/tokenize", body)])[0] == [200]
    codes, peak, kept = _flood(server, [("/tokenize", body)] * TOKENIZE_REQUESTS)
    print(f"{TOKENIZE_REQUESTS} tokenize: peak +{peak:.0f} MB, kept +{kept:.0f} MB")
    assert codes == [200] * TOKENIZE_REQUESTS, codes
    assert peak < 80, peak


def test_a_long_logit_bias_key_is_refused_before_it_is_tokenized(server):
    """A 4M-character text key: refused by name at once (+18 MB, ``/health`` within 0.02 s throughout). Before:
    tokenized on the event loop, then refused by the pair count: +338 MB, ``/health`` waited 3.6 s (a 20M-character
    key: 10.3 s and +1.67 GB)."""
    key = "ab" * 2_000_000
    worst, stop = [0.0], threading.Event()

    def watch() -> None:
        with httpx.Client(base_url=server.url, timeout=60) as c:
            while not stop.is_set():
                began = time.monotonic()
                c.get("/health")
                worst[0] = max(worst[0], time.monotonic() - began)
                time.sleep(0.02)

    watcher = threading.Thread(target=watch)
    base = server.reset_peak()
    watcher.start()
    try:
        with httpx.Client(base_url=server.url, timeout=120) as c:
            reply = c.post("/completion", json={"prompt": "hi", "n_predict": 1, "logit_bias": {key: 1}})
            ok = c.post("/completion", json={"prompt": "hi", "n_predict": 1, "logit_bias": [["hello world", -1]]})
    finally:
        stop.set()
        watcher.join()
    peak = server.peak_rss_mb() - base
    print(f"4M-character logit_bias key: {reply.status_code}, /health at most {worst[0]:.2f} s, peak +{peak:.0f} MB")
    assert reply.status_code == 400 and "4000000 characters" in reply.json()["error"]["message"], reply.text
    assert reply.json()["error"]["param"] == "logit_bias"
    assert ok.status_code == 200, ok.text  # a phrase's every token, as llama-server biases them
    assert worst[0] < 0.5 and peak < 100, (worst[0], peak)
