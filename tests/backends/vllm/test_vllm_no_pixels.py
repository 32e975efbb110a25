"""Cached references reach vLLM as embeddings only: its vision encoder never runs for them.

The server here is started with an image limit of 0: vLLM then handles images as
embeddings only and does not build its vision encoder at all (its log says so), and
it refuses any request that carries pixels. refsight's cached path (references from
the store, the candidate encoded by refsight) still works on it, and gives the same
tokens as the pixel path of a server of the same weights that may take pixels.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.vllm

MODEL = "tiny-qwen2-vl-vllm"
PROMPT = "Same colour?"


@pytest.fixture(scope="module")
def images(photos, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("vllm-no-pixels")
    for name in photos:
        photos[name].image.save(tmp / f"{name}.png")
    return tmp


def test_embeddings_only_server_loads_no_vision_encoder(vllm_servers):
    server = vllm_servers.get(MODEL, 0)
    # vLLM logs the modalities from a set: either order means both are embeddings-only.
    log = server.log.read_text()
    assert any(
        f"modalities handled as embedding-only: {pair}" in log for pair in ("('video', 'image')", "('image', 'video')")
    ), log[-2000:]


def test_cached_references_need_no_pixels_and_match_the_pixel_path(vllm_servers, images, tmp_path):
    from refsight import Engine
    from refsight.errors import GenerationError

    no_pixels = vllm_servers.get(MODEL, 0)
    kwargs = dict(ref_ids=["chelsea", "coffee", "astronaut"], candidate=images / "rocket.png", max_new_tokens=8)
    with Engine(tmp_path / "store", model=f"vllm:{no_pixels.url}") as engine:
        for name in ("chelsea", "coffee", "astronaut"):
            engine.add(images / f"{name}.png", ref_id=name)
        cached = engine.generate(PROMPT, **kwargs)
        assert cached.references_cached == [True, True, True, False]
        # The same request with pixels (--no-cache) is refused by this server: the cached
        # path above therefore sent none.
        with pytest.raises(GenerationError, match="At most 0 image"):
            engine.generate(PROMPT, use_cache=False, **kwargs)
    pixels = vllm_servers.get(MODEL, 8)
    # The pixel path of a server of the same weights that has a vision encoder (every image as pixels).
    with Engine(tmp_path / "store", model=f"vllm:{pixels.url}") as engine:
        fresh = engine.generate(PROMPT, use_cache=False, **kwargs)
    assert cached.tokens == fresh.tokens


def test_the_mode_is_embeds_and_pixels_forced_on_it_fail_loudly(vllm_servers):
    from refsight.backends.vllm.loading import load_vllm_backend
    from refsight.errors import ModelLoadError

    no_pixels = vllm_servers.get(MODEL, 0)
    backend = load_vllm_backend(f"vllm:{no_pixels.url}")
    try:
        assert backend.runtime_info() == {"vllm_images": "embeds", "vllm_keeps_uuids": False}
    finally:
        backend.close()
    with pytest.raises(ModelLoadError, match="no vision encoder"):
        load_vllm_backend(f"vllm:{no_pixels.url}", vllm_images="pixels")  # --vllm-images pixels
