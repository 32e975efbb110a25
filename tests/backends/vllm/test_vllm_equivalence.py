"""Cached packages through vLLM == vLLM's own pixel path, token for token.

For tiny Qwen2-VL, Qwen2.5-VL and Qwen3-VL on a real vLLM server (CPU):

(a) cached: references' pixel packages made by refsight (the image on its grid, no vision
tower), stored in a ``refsight.store``, loaded back with ``.get(key)`` in a NEW process and
sent to vLLM as ``image_url`` parts beside a fresh candidate (the uuid path is
``test_vllm_uuids.py``; embeddings, for a server without a vision encoder, ``test_vllm_no_pixels.py``);
(b) vLLM's pixel path: the same prompt sent straight to the server with every image
as a PNG, by code independent of refsight's (``vllm_helpers.pixel_tokens``).

Greedy tokens must be identical, with 1 and 3 references in two layouts.

The photos here already sit on the processor's patch grid: refsight's encoder resizes
with PIL, vLLM's processor with torchvision, and the two bicubic kernels differ in the
last bits, so an independent client sending raw off-grid pixels would compare resize
kernels, not the cache. refsight's own pixel path resizes with PIL before sending
(vLLM's resize is then a no-op): ``test_no_cache_path_...`` proves it equal to the
cached path on off-grid photos.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_helpers import MAX_NEW_TOKENS, pixel_tokens
from worker_spec import CANDIDATE, REFS, cases, layout, run_worker, stored_keys

pytestmark = pytest.mark.vllm

WORKER = Path(__file__).with_name("_vllm_cached_worker.py")


@pytest.fixture(scope="module")
def cached(served, grid_photos, tmp_path_factory):
    """Encode and store the references here; run the cached path in a new process."""
    from refsight.backends.registry import get_backend
    from refsight.store import open_store

    name, server = served
    model = f"vllm:{server.url}"
    tmp = tmp_path_factory.mktemp("vllm-equivalence")
    candidate_png = tmp / "candidate.png"
    grid_photos[CANDIDATE].image.save(candidate_png)
    packages = get_backend(model).encode([grid_photos[r] for r in REFS])
    with open_store(tmp / "store") as store:
        keys = stored_keys(store, packages)
    spec = {"store": str(tmp / "store"), "model": model, "cases": cases("", keys, candidate_png, MAX_NEW_TOKENS)}
    return json.loads(run_worker(WORKER, tmp, spec, "out.json").read_text())


def _pixel_row(row: list[tuple], photos) -> list:
    return [s[1] if s[0] == "text" else photos[REFS[s[1]]].image if s[0] == "ref" else photos[CANDIDATE].image for s in row]


@pytest.mark.parametrize("n_refs", [1, 3])
def test_cached_packages_from_disk_in_new_process_equal_vllm_pixel_path(served, cached, grid_photos, n_refs):
    _, server = served
    result = cached[str(n_refs)]
    for row, tokens in zip(layout(n_refs), result["tokens"]):
        assert tokens  # up to MAX_NEW_TOKENS, ending early at <|im_end|>
        assert tokens == pixel_tokens(server.url, _pixel_row(row, grid_photos))
    assert all(result["random_weights"])


def test_refsight_runs_no_image_processor_in_new_process(cached):
    # vLLM encodes every image (references and candidates): refsight's HF processor never runs.
    assert [cached[n]["preprocessed"] for n in ("1", "3")] == [0, 0]


def test_no_cache_path_sends_pixels_and_gives_the_same_tokens(served, photos):
    """Off-grid photos, every image an ImageInput (what --no-cache passes): vLLM gets pixels,
    refsight encodes nothing, and the tokens equal those from refsight's pixel packages."""
    from refsight.requests import GenerationRequest
    from refsight.backends.registry import get_backend

    _, server = served
    backend = get_backend(f"vllm:{server.url}")
    packages = dict(zip(REFS, backend.encode([photos[r] for r in REFS])))

    def rows(ref):
        return [[s[1] if s[0] == "text" else ref(REFS[s[1]]) if s[0] == "ref" else photos[CANDIDATE] for s in row] for row in layout(3)]

    calls = []
    original = backend.encoder.lay_out
    backend.encoder.lay_out = lambda images: calls.append(len(images)) or original(images)
    try:
        fresh = backend.generate([GenerationRequest(row, max_new_tokens=MAX_NEW_TOKENS) for row in rows(photos.get)])
        assert calls == []  # pixels went to vLLM; refsight's encoder never ran
        cached = backend.generate([GenerationRequest(row, max_new_tokens=MAX_NEW_TOKENS) for row in rows(packages.get)])
        assert calls == []  # the candidates go as pixels too: vLLM encodes them
    finally:
        backend.encoder.lay_out = original
    assert [g.token_ids for g in fresh] == [g.token_ids for g in cached]


def test_fingerprints_pixel_packages_and_embeddings(served):
    """A server with a vision encoder: pixel packages under their own fingerprint (no HF key clash);
    ``images=embeds``: the HF encoder's fingerprint, so vllm: and hf: share embedding packages."""
    from refsight.backends.registry import get_backend
    from refsight.backends.vllm.pixels import pixel_fingerprint

    name, server = served
    hf = get_backend(name).fingerprint()
    pixels = get_backend(f"vllm:{server.url}")
    assert pixels.encodes_images and pixels.fingerprint() == pixel_fingerprint(hf) != hf
    assert get_backend(f"vllm:{server.url}", images="embeds").fingerprint() == hf
