"""The reranker's yes/no scoring on llama.cpp (every built-in GGUF family).

P("yes") is the softmax over the "yes"/"no" logits at the answer position, the HF
backend's rule (tests/backends/test_score_yes_no.py): it equals that softmax over the
logits greedy generation sees at its first step, repeats exactly, and is the same
from cached packages as from fresh pixels (llama.cpp's own path).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from llama_models import GGUF_FAMILIES, require_llama_cpp

require_llama_cpp()
pytestmark = pytest.mark.slow  # converts every built-in family to GGUF (llama-cpp-python: an optional runtime)

CRITERIA = ("short fur", "pointed ears")
REFS = ("chelsea", "coffee", "astronaut")


@pytest.mark.parametrize("name", GGUF_FAMILIES)
def test_scores_cached_equal_fresh_deterministic_and_first_step_softmax(gguf, photos, name):
    from refsight.requests import GenerationRequest
    from refsight.compare.rerank import rerank_segments

    backend = gguf(name)
    candidate = photos["rocket"]
    references = [photos[r] for r in REFS]
    packages = backend.encode(references)
    cand_package = backend.encode([candidate])[0]

    def requests(refs, cand):
        return [GenerationRequest(rerank_segments(r, cand, CRITERIA), max_new_tokens=1) for r in refs]

    before = backend.encode_calls
    cached = backend.score_yes_no(requests(packages, cand_package))
    assert backend.encode_calls == before  # cached packages never reach the vision encoder
    again = backend.score_yes_no(requests(packages, cand_package))
    fresh = backend.score_yes_no(requests(references, candidate))
    assert cached == again
    assert cached == fresh
    assert all(0.0 < s < 1.0 for s in cached) and len(set(cached)) == len(REFS)

    yes, no = backend.answer_token_ids()
    logits = backend.generate(requests(packages[:1], cand_package), return_logits=True)[0].logits[0].numpy()
    pair = np.exp(logits[[yes, no]].astype(np.float64) - logits[[yes, no]].max())
    assert math.isclose(cached[0], pair[0] / pair.sum(), rel_tol=0, abs_tol=1e-12)


def test_answer_tokens_are_each_words_first_token(gguf):
    backend = gguf("tiny-qwen2-vl-gguf")
    yes, no = backend.answer_token_ids()
    assert backend.runtime.tokenize("yes", False)[0] == yes
    assert backend.runtime.tokenize("no", False)[0] == no
    assert yes != no


def test_a_stored_prefix_state_gives_the_same_score(gguf, photos, tmp_path):
    """A references-first yes/no prompt restores its prefix state and scores exactly as without it."""
    from refsight.requests import GenerationRequest
    from refsight.judge.prompts import reference_prefix
    from refsight.cache.prefix_states import PrefixStateCache
    from refsight.store import open_store

    backend = gguf("tiny-qwen2-vl-gguf")
    packages = backend.encode([photos[r] for r in REFS])
    prefix = reference_prefix(packages)

    def request(criterion, cache):
        segments = [*prefix, "Candidate:", photos["rocket"], f"\nDoes the candidate show {criterion}? Answer yes or no."]
        return GenerationRequest(segments, max_new_tokens=1, prefix_segments=len(prefix), prefix_cache=cache)

    with open_store(tmp_path / "store") as store:
        cache = PrefixStateCache(store)
        plain = backend.score_yes_no([request(c, None) for c in CRITERIA])
        before = backend.runtime.state_restores
        cached = backend.score_yes_no([request(c, cache) for c in CRITERIA])
        assert backend.runtime.state_restores - before == len(CRITERIA) - 1  # the first builds the state
    assert cached == plain
