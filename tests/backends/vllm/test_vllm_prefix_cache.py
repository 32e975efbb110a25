"""vLLM's automatic prefix caching reuses the judge's reference prefix; yes/no scoring on vLLM.

On the real tiny Qwen2-VL server: judge prompts put the references first with stable
uuids (the package keys), so a second and third rubric against the same references
hit vLLM's prefix cache for the whole reference part (its Prometheus counters say
so, and the backend reports the hit rate), and the greedy tokens equal those of the
same request with a fresh ``cache_salt`` (which shares nothing with earlier requests).

Yes/no scoring (the reranker) reads P("yes") from vLLM's raw log-probabilities: it
repeats exactly, agrees with the HF backend on the same weights, and is the same from
cached packages as from pixels vLLM encodes itself (within a measured bound).
"""

from __future__ import annotations

import uuid

import pytest

pytestmark = pytest.mark.vllm

MODEL = "tiny-qwen2-vl-vllm"
RUBRICS = ("red colour", "round shape", "has fur")
CRITERIA = ("short fur", "pointed ears")
REFS = ("chelsea", "coffee", "astronaut")
#: vLLM's KV block size on a CPU (``vllm/platforms/cpu.py``): the prefix cache's unit.
BLOCK = 128


@pytest.fixture(scope="module")
def backend(vllm_servers):
    from refsight.backends.registry import get_backend

    server = vllm_servers.get(MODEL, 8)
    backend = get_backend(f"vllm:{server.url}")
    # Not closed here: get_backend caches it (and its encoder) for the whole session, and the
    # next module asking for this server gets the same object.
    return backend


def _judge_request(references, candidate, rubric):
    from refsight.requests import GenerationRequest
    from refsight.judge.prompts import reference_prefix

    segments = [*reference_prefix(references), "Candidate:", candidate, f"\nCriteria:\n1. {rubric}\nAnswer in JSON."]
    return GenerationRequest(segments, max_new_tokens=8)


def test_second_and_third_rubric_hit_the_prefix_cache_with_identical_tokens(backend, photos):
    from refsight.inputs.images import load_image
    from refsight.samples import load_sample

    # vLLM's CPU KV blocks hold 128 tokens and only whole blocks are cached: seven
    # references (16 image tokens each at 224², the tiny processor's limit) make a
    # prefix of more than one block. Images used nowhere else: the first rubric is cold.
    big = [load_image(load_sample(name, (224, side))) for name in ("chelsea", "coffee", "astronaut") for side in (224, 210)]
    big.append(load_image(load_sample("rocket", (224, 224))))
    packages = backend.encode(big)
    candidate = backend.encode([photos["rocket"]])[0]
    reference_tokens = sum(backend.image_tokens(packages))
    assert reference_tokens >= 100
    rates = []
    for i, rubric in enumerate(RUBRICS):
        request = _judge_request(packages, candidate, rubric)
        before = backend.prefix_cache_stats()
        generation = backend.generate([request])[0]
        after = backend.prefix_cache_stats()
        hits, queries = after["hits"] - before["hits"], after["queries"] - before["queries"]
        assert queries == generation.prompt_tokens
        rates.append(hits / queries)
        if i:
            # The whole KV blocks of the reference part came from the cache (the last,
            # partial one, shared with the candidate's tokens, cannot be).
            assert BLOCK <= hits < queries and hits % BLOCK == 0, (hits, reference_tokens, queries)
        else:
            assert hits == 0
        body = backend.chat_body(request)
        salted = backend.client.chat({**body, "cache_salt": uuid.uuid4().hex})
        assert salted["choices"][0]["token_ids"] == generation.token_ids
    stats = backend.prefix_cache_stats()
    assert 0.0 < stats["hit_rate"] <= 1.0
    print(f"\nvLLM prefix-cache hit rate per rubric: {[round(r, 3) for r in rates]}; server total {stats}")


def test_yes_no_scores_repeat_match_hf_and_pixels(backend, photos):
    from refsight.requests import GenerationRequest
    from refsight.compare.rerank import rerank_segments

    references = [photos[r] for r in REFS]
    packages = backend.encode(references)
    cand_package = backend.encode([photos["rocket"]])[0]

    def requests(refs, cand):
        return [GenerationRequest(rerank_segments(r, cand, CRITERIA), max_new_tokens=1) for r in refs]

    cached = backend.score_yes_no(requests(packages, cand_package))
    again = backend.score_yes_no(requests(packages, cand_package))
    fresh = backend.score_yes_no(requests(references, photos["rocket"]))
    # The HF encoder scores its own packages (the backend's are pixel packages: vLLM encodes them).
    hf_packages = backend.encoder.encode([*references, photos["rocket"]])
    hf = backend.encoder.score_yes_no(requests(hf_packages[:-1], hf_packages[-1]))
    assert cached == again
    assert all(0.0 < s < 1.0 for s in cached) and len(set(cached)) == len(REFS)
    pixel_delta = max(abs(a - b) for a, b in zip(cached, fresh))
    hf_delta = max(abs(a - b) for a, b in zip(cached, hf))
    print(f"\nvLLM yes/no: cached {cached}, |cached - pixels| {pixel_delta:.3g}, |vLLM - HF| {hf_delta:.3g}")
    # Measured on the tiny float32 model: 1.2e-7 (pixels) and 5e-8 (HF): vLLM's own encoder
    # and kernels differ from refsight's HF encoder in the last bits of float32.
    assert pixel_delta <= 1e-6
    assert hf_delta <= 1e-6


def test_engine_stats_report_the_servers_prefix_cache(vllm_servers, tmp_path):
    """``Engine.stats()`` (and so ``refsight stats`` and ``/metrics``) shows a loaded vllm backend's hit rate."""
    from refsight import Engine
    from refsight.backends.options import BackendOptions

    server = vllm_servers.get(MODEL, 8)
    name = f"vllm:{server.url}"
    with Engine(tmp_path / "store", model=name, backend_options=BackendOptions(encoder=MODEL)) as engine:
        assert "runtime_prefix_cache" not in engine.stats().to_dict()  # no backend loaded: nothing asked of the server
        engine.backend()
        figures = engine.stats().to_dict()["runtime_prefix_cache"][name]
        assert figures["queries"] > 0 and figures["hits"] > 0  # the earlier tests' requests
        assert figures["hit_rate"] == figures["hits"] / figures["queries"]
        assert engine.stats(tenant_view=True, namespace="default").runtime_prefix_cache is None
