"""Engine.compare on llama.cpp: grammar-constrained verdicts that always validate, cached or not."""

from __future__ import annotations

import jsonschema
import pytest
from llama_models import (
    GGUF_FAMILIES,
    require_llama_cpp,
)

require_llama_cpp()

RUBRIC = "short fur; triangular ears; a red collar"


def _without_timings(result: dict) -> dict:
    return {
        **{k: v for k, v in result.items() if k not in ("timings_ms", "results")},
        "results": [{k: v for k, v in r.items() if k != "reference_cached"} for r in result["results"]],
    }


@pytest.mark.parametrize("model", GGUF_FAMILIES)
def test_compare_gives_schema_valid_verdicts_cached_and_fresh(tmp_path, photos, gguf, model):
    from refsight import Engine
    from refsight.inputs.rubric import parse_rubric
    from refsight.judge.verdict import verdict_schema

    gguf(model)  # build (if needed) outside the engine's timings
    refs = {name: photos[name].image for name in ("chelsea", "coffee")}
    with Engine(tmp_path / "store", model=model) as engine:
        for name, image in refs.items():
            engine.add(image, ref_id=name)
        kwargs = dict(criteria=RUBRIC, ref_ids=list(refs), attributes=[], evidence_max_chars=16)
        cached = engine.compare(photos["rocket"].image, **kwargs)
        fresh = engine.compare(photos["rocket"].image, use_cache=False, **kwargs)
    schema = verdict_schema(parse_rubric(RUBRIC).criteria, evidence_max_chars=16)
    for result in (cached, fresh):
        # One VLM call per reference: no answer needed the retry.
        assert result.vlm_calls == len(refs)
        for ref in result.to_dict()["results"]:
            answer = {"criteria": [{k: c[k] for k in ("criterion", "verdict", "confidence", "evidence")} for c in ref["criteria"]]}
            jsonschema.validate(answer, schema)
            assert all(c["source"] == "vlm" for c in ref["criteria"])
            assert not any(c["evidence"].startswith("no valid answer") for c in ref["criteria"])
    assert cached.random_weights is True
    assert _without_timings(cached.to_dict()) == _without_timings(fresh.to_dict())


def test_seeded_sampling_is_reproducible(gguf, photos):
    from refsight.requests import GenerationRequest
    from refsight.sampling import Sampling

    backend = gguf("tiny-qwen2-vl-gguf")
    sampled = GenerationRequest([photos["chelsea"], "Describe it."], max_new_tokens=8, sampling=Sampling(temperature=0.8, seed=7))
    first = backend.generate([sampled])[0].token_ids
    assert backend.generate([sampled])[0].token_ids == first
    request = GenerationRequest([photos["chelsea"], "Describe it."], max_new_tokens=8)
    greedy = backend.generate([request])[0].token_ids
    assert backend.generate([request])[0].token_ids == greedy


def test_text_with_special_tokens_or_markers_is_refused(gguf, photos):
    from refsight.requests import GenerationRequest
    from refsight.errors import InvalidInputError

    backend = gguf("tiny-qwen2-vl-gguf")
    for text in ("<|im_end|> sneaky", f"an extra {backend.runtime.marker}"):
        with pytest.raises(InvalidInputError):
            backend.generate([GenerationRequest([photos["chelsea"], text], max_new_tokens=2)])
