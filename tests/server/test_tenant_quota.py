"""Under a byte quota, one tenant's images never evict another's packages (issue 60, group 6), on a real
``refsight serve`` of the tiny GGUF with two keys and ``--max-package-bytes``.

Before, tenant b's remembered images (each sent twice: the ``recurring`` policy keeps it) pushed the store over its
quota and the one least-recently-used order evicted tenant a's reference package: a's next chat on its own reference
re-encoded it and lost its prefix state (``cached_tokens`` 12 → 0, ``references_cached`` true → false). Now each
tenant holds an equal share and only its own writes evict its packages (``docs/architecture/policies.md``, policy 4).
"""

from __future__ import annotations

import io

import httpx
import pytest
from hardening_helpers import ServeProcess
from live_server import b64, data_url
from PIL import Image
from runtimes import require_module

pytestmark = pytest.mark.slow  # a real `refsight serve` of the tiny GGUF

GGUF = "tiny-qwen2-vl-gguf"
KEY_A, KEY_B = "key-a-12345678", "key-b-12345678"
#: Tenant b's distinct images, each sent twice: enough to take the store past its quota several times over.
B_IMAGES = 8


def _png(n: int) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (64, 48), ((n * 37) % 256, (n * 91) % 256, (n * 13) % 256)).save(buffer, format="PNG")
    return buffer.getvalue()


def _chat(client: httpx.Client, url: str) -> dict:
    reply = client.post("/v1/chat/completions", json={"model": GGUF, "max_tokens": 1, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "what is it?"}]}]})
    assert reply.status_code == 200, reply.text
    return reply.json()


def test_another_tenants_images_never_evict_a_tenants_package(tmp_path):
    require_module("llama_cpp")
    from refsight.builtin_models.gguf import ensure_gguf

    ensure_gguf(GGUF)
    keys = tmp_path / "keys.txt"
    keys.write_text(f"{KEY_A}=alpha\n{KEY_B}=bravo\n")
    server = ServeProcess(tmp_path / "store", "--max-package-bytes", "20KB", "--attributes", "none", keys=keys,
                          model=GGUF).wait_ready(timeout=300)
    try:
        a = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {KEY_A}"}, timeout=120)
        b = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {KEY_B}"}, timeout=120)
        assert a.post("/v1/references", json={"image": b64(_png(999)), "id": "refA"}).status_code == 201
        _chat(a, "refsight://ref/refA")
        before = _chat(a, "refsight://ref/refA")  # its prefix state stored by the first
        for _ in range(2):
            for n in range(B_IMAGES):
                _chat(b, data_url(_png(n)))
        b_stats = b.get("/v1/stats").json()
        after = _chat(a, "refsight://ref/refA")
        cached = a.get("/v1/references/refA").json()["cached"]
    finally:
        server.stop()
    print(f"tenant a: cached_tokens {before['usage']['prompt_tokens_details']['cached_tokens']} -> "
          f"{after['usage']['prompt_tokens_details']['cached_tokens']}; "
          f"b's remembered images kept: {b_stats['remembered']} of {B_IMAGES}")
    assert before["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    assert 0 < b_stats["remembered"] < B_IMAGES  # b was held to its share, from its own images
    assert after["usage"] == before["usage"] and after["refsight"]["references_cached"] == [True] and cached
    assert server.process.returncode in (0, -2), server.log
