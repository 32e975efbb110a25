"""References by uuid on a real vLLM server: the same tokens as vLLM's all-pixels path.

On a server with a vision encoder the backend sends the candidate as pixels and each
reference (a package in the request's reference prefix) by ``uuid`` = ``refsight-`` + its
package key: with its pixels the first time, uuid-only once the server holds it, and with
its pixels again after a "Cache miss" (one retry, counted). Greedy tokens must equal those
of every image sent as pixels by code independent of refsight's (``vllm_helpers.pixel_tokens``),
with 1 and 3 references, for every tiny family.
"""

from __future__ import annotations

import pytest

from vllm_helpers import MAX_NEW_TOKENS, pixel_tokens

pytestmark = pytest.mark.vllm

REFS = ("chelsea", "coffee", "astronaut")


def _fresh_backend(url: str):
    """A backend of its own (get_backend would share one, and its memory of what the server holds)."""
    from refsight.backends.vllm.loading import load_vllm_backend

    return load_vllm_backend(f"vllm:{url}")


def _request(references: list, candidate, text: str = "Same colour?"):
    from refsight.requests import GenerationRequest

    segments = [*references, "Compare the candidate", candidate, text]
    return GenerationRequest(segments, max_new_tokens=MAX_NEW_TOKENS, prefix_segments=len(references))


def _pixel_row(request, photos, names: list[str]) -> list:
    images = iter([photos[n].image for n in names] + [photos["rocket"].image])
    return [s if isinstance(s, str) else next(images) for s in request.segments]


@pytest.mark.parametrize("n_refs", [1, 3])
def test_references_by_uuid_equal_the_all_pixels_path(served, grid_photos, n_refs):
    from refsight.backends.vllm.pixels import reference_uuid

    _, server = served
    backend = _fresh_backend(server.url)
    try:
        assert backend.encodes_images
        names = list(REFS[:n_refs])
        references = backend.encode([grid_photos[n] for n in names])
        candidate = backend.encode([grid_photos["rocket"]])[0]  # a memory-only package: never by uuid
        request = _request(references, candidate)
        parts = backend.chat_body(request)["messages"][-1]["content"]
        images = [p for p in parts if p["type"] == "image_url"]
        assert [p.get("uuid") for p in images] == [reference_uuid(r.key) for r in references] + [None]
        assert all(p["image_url"]["url"].startswith("data:image/png") for p in images)
        expected = pixel_tokens(server.url, _pixel_row(request, grid_photos, names))
        first = backend.generate([request])[0]
        assert backend.uuid_stats() == {"uuid_only": 0, "with_pixels": n_refs, "cache_miss_retries": 0}
        again = backend.generate([_request(references, candidate)])[0]  # now uuid-only: the server holds them
        assert backend.uuid_stats() == {"uuid_only": n_refs, "with_pixels": n_refs, "cache_miss_retries": 0}
        assert first.token_ids == again.token_ids == expected
        assert first.image_tokens == [int(p.metadata["num_tokens"]) for p in [*references, candidate]]
    finally:
        backend.close()


def test_a_cache_miss_is_retried_once_with_pixels(served, grid_photos, photos):
    """The backend believes the server holds a reference it never saw (it restarted, its caches
    forgot): vLLM answers "Cache miss", the request is sent again with the pixels, counted once."""
    from refsight.backends.vllm.pixels import reference_uuid

    _, server = served
    backend = _fresh_backend(server.url)
    try:
        # Off-grid and flipped: pixels this server was never sent by any test.
        from PIL import ImageOps

        from refsight.inputs.images import load_image

        unseen = load_image(ImageOps.mirror(photos["coffee"].image), name="unseen")
        reference = backend.encode([unseen])[0]
        candidate = backend.encode([grid_photos["rocket"]])[0]
        backend.held.add([reference_uuid(reference.key)])
        answer = backend.generate([_request([reference], candidate)])[0]
        assert backend.uuid_stats() == {"uuid_only": 0, "with_pixels": 1, "cache_miss_retries": 1}
        from refsight.backends.vllm.pixels import pixel_image

        row = [pixel_image(reference), "Compare the candidate", grid_photos["rocket"].image, "Same colour?"]
        assert answer.token_ids == pixel_tokens(server.url, row)
        again = backend.generate([_request([reference], candidate)])[0]
        assert backend.uuid_stats() == {"uuid_only": 1, "with_pixels": 1, "cache_miss_retries": 1}
        assert again.token_ids == answer.token_ids
    finally:
        backend.close()


def test_the_rerankers_reference_goes_by_uuid_and_scores_as_with_pixels(served, grid_photos):
    """The reranker puts the candidate first and names its reference (``reference_keys``): the reference
    travels by uuid (pixels once, then uuid-only), the candidate never, and the score is the all-pixels score."""
    from refsight.requests import GenerationRequest
    from refsight.backends.vllm.pixels import reference_uuid
    from refsight.compare.rerank import rerank_segments

    _, server = served
    backend = _fresh_backend(server.url)
    try:
        reference = backend.encode([grid_photos["chelsea"]])[0]
        candidate = backend.encode([grid_photos["rocket"]])[0]
        segments = rerank_segments(reference, candidate, ("short fur",))
        named = GenerationRequest(segments, max_new_tokens=1, reference_keys=frozenset({reference.key}))
        body = backend.chat_body(named)
        images = [p for m in body["messages"] if isinstance(m["content"], list) for p in m["content"]
                  if p["type"] == "image_url"]
        assert [p.get("uuid") for p in images] == [None, reference_uuid(reference.key)]  # candidate first
        pixels = backend.score_yes_no([GenerationRequest(segments, max_new_tokens=1)])[0]  # no names: all pixels
        assert backend.uuid_stats() == {"uuid_only": 0, "with_pixels": 0, "cache_miss_retries": 0}
        first = backend.score_yes_no([named])[0]
        assert backend.uuid_stats() == {"uuid_only": 0, "with_pixels": 1, "cache_miss_retries": 0}
        again = backend.score_yes_no([named])[0]
        assert backend.uuid_stats() == {"uuid_only": 1, "with_pixels": 1, "cache_miss_retries": 0}
        assert first == pytest.approx(pixels, abs=1e-6) and again == pytest.approx(first, abs=1e-6)
    finally:
        backend.close()
