"""``Engine`` on the vllm backend: schema-valid verdicts every time, and --no-cache parity.

Constrained JSON runs on vLLM's structured output (refsight's grammar for the
verdict schema), so even this random-weight model answers every criterion with JSON
that parses and validates on the first try.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.vllm

MODEL = "tiny-qwen2-vl-vllm"
RUBRICS = (
    "short fur; triangular ears; same colour",
    "- a cup on a saucer\n- steam rising",
    '[{"text": "same object", "weight": 2, "required": true}, {"text": "same background"}]',
)


@pytest.fixture(scope="module")
def engine(vllm_servers, photos, tmp_path_factory):
    from refsight import Engine
    from refsight.backends.options import BackendOptions

    server = vllm_servers.get(MODEL, 8)
    tmp = tmp_path_factory.mktemp("vllm-judge")
    for name in photos:
        photos[name].image.save(tmp / f"{name}.png")
    # The encoder named through BackendOptions, as the CLI's --encoder does.
    options = BackendOptions(encoder=MODEL)
    with Engine(tmp / "store", model=f"vllm:{server.url}", backend_options=options) as engine:
        for name in ("chelsea", "coffee", "astronaut"):
            engine.add(tmp / f"{name}.png", ref_id=name)
        engine.images = tmp
        yield engine


@pytest.mark.parametrize("rubric", RUBRICS)
def test_compare_gives_schema_valid_verdicts_every_time(engine, rubric):
    from refsight.judge.verdict import VERDICTS

    result = engine.compare(
        engine.images / "rocket.png", ref_ids=["chelsea", "coffee", "astronaut"], criteria=rubric,
        force_vlm=True, attributes=(),
    ).to_dict()
    assert result["random_weights"] is True
    assert len(result["results"]) == 3
    for ref in result["results"]:
        assert ref["reference_cached"] is True
        assert ref["criteria"]
        for verdict in ref["criteria"]:
            assert verdict["source"] == "vlm"
            assert verdict["verdict"] in VERDICTS
            assert 0.0 <= verdict["confidence"] <= 1.0
            # A parse or validation failure would be reported as "uncertain" with this reason.
            assert not verdict["evidence"].startswith("no valid answer"), verdict


def test_generate_with_and_without_cache_gives_the_same_tokens(engine):
    """--no-cache sends every image to vLLM as pixels; the cached path sends packages."""
    kwargs = dict(ref_ids=["chelsea", "coffee"], candidate=engine.images / "rocket.png", max_new_tokens=8)
    cached = engine.generate("Same animal?", **kwargs)
    fresh = engine.generate("Same animal?", use_cache=False, **kwargs)
    assert cached.references_cached[:2] == [True, True]
    assert fresh.references_cached == [False, False, False]
    assert cached.tokens == fresh.tokens


def test_return_logits_are_vllms_top_logprobs(engine, photos):
    """An OpenAI server returns no full logits: ``logits`` holds vLLM's top-k log-probabilities."""
    import torch

    from refsight.requests import GenerationRequest
    from refsight.backends.vllm.backend import TOP_LOGPROBS

    backend = engine.backend()
    generation = backend.generate(
        [GenerationRequest(["Describe", photos["chelsea"]], max_new_tokens=4)], return_logits=True
    )[0]
    logits = generation.logits
    assert logits.shape == (len(generation.token_ids), backend.vocab_size)
    assert (torch.isfinite(logits).sum(dim=1) == TOP_LOGPROBS).all()
    assert logits.argmax(dim=1).tolist() == generation.token_ids  # greedy: the top token is the one chosen
    assert (logits[torch.isfinite(logits)] <= 0).all()
