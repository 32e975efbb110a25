"""The image mode a ``vllm:`` backend finds on a real server (issue 41).

A server started with ``--mm-processor-cache-gb 0`` (vLLM's caches off, as ``benchmarks/vllm_cache.py``'s
figure (a)) has a vision encoder but serves no image by uuid alone: it answers a uuid-only part with
"Failed to apply Qwen2VLProcessor on data={'images': [None]}", not "Cache miss". The backend must read
that as "pixels, no uuids", never as "no encoder" (which made refsight run its own vision tower on
every candidate: 11x slower than vLLM alone), and ``images=pixels`` must load on it. The mode shows in
:meth:`runtime_info` (``/v1/models``, ``/props``, the serve start-up line). The no-encoder side (image
limit 0) is in ``test_vllm_no_pixels.py``, on the server that file starts anyway.
"""

from __future__ import annotations

import pytest
from vllm_helpers import MAX_NEW_TOKENS, pixel_tokens

pytestmark = pytest.mark.vllm

MODEL = "tiny-qwen2-vl-vllm"
CACHES_OFF = ("--no-enable-prefix-caching", "--mm-processor-cache-gb", "0")


def _load(url: str, **options):
    from refsight.backends.vllm.loading import load_vllm_backend

    return load_vllm_backend(f"vllm:{url}", **options)


def test_a_server_with_its_caches_off_takes_pixels_every_time(vllm_servers, photos):
    from refsight.requests import GenerationRequest
    from refsight.backends.hf.grid import resize_to_grid

    server = vllm_servers.get(MODEL, 8, vllm_args=CACHES_OFF)
    backend = _load(server.url)
    try:
        assert backend.runtime_info() == {"vllm_images": "pixels", "vllm_keeps_uuids": False}
        references = backend.encode([photos["chelsea"]])  # pixel packages: refsight's vision tower never runs
        (candidate,) = backend.encode([photos["rocket"]])
        request = GenerationRequest([*references, "Compare the candidate", candidate, "Same colour?"],
                                    max_new_tokens=MAX_NEW_TOKENS, prefix_segments=1)
        first, second = (backend.generate([request])[0].token_ids for _ in range(2))
        # Every reference went with its pixels both times, with no "Cache miss" round trip.
        assert backend.uuid_stats() == {"uuid_only": 0, "with_pixels": 2, "cache_miss_retries": 0}
        row = [resize_to_grid(backend.encoder, photos["chelsea"].image), "Compare the candidate",
               resize_to_grid(backend.encoder, photos["rocket"].image), "Same colour?"]
        assert first == second == pixel_tokens(server.url, row)
    finally:
        backend.close()
    forced = _load(server.url, vllm_images="pixels")  # the CLI's --vllm-images pixels: it used to raise here
    try:
        assert forced.runtime_info() == {"vllm_images": "pixels", "vllm_keeps_uuids": False}
    finally:
        forced.close()
