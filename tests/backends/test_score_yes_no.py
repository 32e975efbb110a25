"""Yes/no scoring on a real (tiny, random-weight) transformers model: the reranker's model path.

Scores from cached packages equal those from fresh encodes, repeat exactly, and equal the
softmax over the yes/no logits that greedy generation sees at its first step.
"""

from __future__ import annotations

import math

import pytest

from refsight import Engine
from refsight.requests import GenerationRequest
from refsight.compare.rerank import RerankQuery, VlmReranker, rerank_segments
from refsight.samples import load_sample

CRITERIA = ("short fur", "pointed ears")


@pytest.fixture(scope="module")
def tiny_engine(tmp_path_factory):
    from refsight.inputs.images import load_image

    engine = Engine(tmp_path_factory.mktemp("yes-no") / "store", model="tiny-qwen2-vl")
    for name, size in (("chelsea", (80, 64)), ("coffee", (72, 56)), ("rocket", (56, 72))):
        # One add per image: one image per vision forward, like the fresh path's single candidate.
        engine.add(load_image(load_sample(name, size)), ref_id=name)
    yield engine, load_image(load_sample("chelsea", (64, 56)).transpose(0))
    engine.close()


def test_cached_and_fresh_scores_are_identical_and_deterministic(tiny_engine):
    engine, candidate = tiny_engine
    refs = [engine.reference(n) for n in ("chelsea", "coffee", "rocket")]
    query = RerankQuery(image=candidate, criteria=CRITERIA, text="; ".join(CRITERIA))
    cached = VlmReranker(engine.context(), engine.packages).score(query, refs)
    again = VlmReranker(engine.context(), engine.packages).score(query, refs)
    fresh = VlmReranker(engine.context(use_cache=False), engine.packages).score(query, refs)
    assert cached == again
    assert cached == fresh
    assert all(0.0 < s < 1.0 for s in cached) and len(set(cached)) == 3


def test_score_is_the_yes_no_softmax_of_the_first_generated_step(tiny_engine):
    import torch

    engine, candidate = tiny_engine
    backend = engine.backend()
    reference = engine.reference_package(engine.reference("coffee")).package
    request = GenerationRequest(segments=rerank_segments(reference, candidate, CRITERIA), max_new_tokens=1)
    score = backend.score_yes_no([request])[0]
    logits = backend.generate([request], return_logits=True)[0].logits[0]
    yes, no = backend.answer_token_ids()
    expected = torch.softmax(logits[[yes, no]].float(), dim=-1)[0].item()
    assert math.isclose(score, expected, abs_tol=1e-5)


def test_the_reranker_names_its_reference_and_a_wrong_name_is_refused(tiny_engine):
    """The candidate comes first in a rerank prompt, so the request names the reference by its package key
    (vLLM sends only those by uuid); naming anything that is not one of the request's packages is refused."""
    from refsight.errors import InvalidInputError

    engine, candidate = tiny_engine
    backend = engine.backend()
    reranker = VlmReranker(engine.context(), engine.packages)
    query = RerankQuery(image=candidate, criteria=CRITERIA, text="")
    cached_candidate = engine.packages.served_candidate(engine.context(), candidate).item
    reference = engine.reference("coffee")
    request = reranker.request(reference, cached_candidate, query)
    package = engine.reference_package(reference).package
    assert request.reference_keys == frozenset({package.key}) and package.key != cached_candidate.key
    bad = GenerationRequest(request.segments, max_new_tokens=1, reference_keys=frozenset({"not-a-package"}))
    with pytest.raises(InvalidInputError) as info:
        backend.score_yes_no([bad])
    assert info.value.input == "requests[0].reference_keys"
