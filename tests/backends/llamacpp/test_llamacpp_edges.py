"""Sampling edges and uncompilable JSON schemas on llama.cpp (issue 25, items 3 and 4; real GGUFs).

llama.cpp divides float32 logits by the temperature: below ~1e-38 that overflowed to inf and
the draw returned garbage tokens; such temperatures now decode greedily, and a ``top_p`` far
below any token's probability keeps the most likely token. A schema the shared check or
llama.cpp's converter / GBNF parser refuses is an InvalidInputError naming ``json_schema``
(with the path where the shared check knows it), before any prompt is evaluated.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from llama_models import require_llama_cpp

from refsight.requests import GenerationRequest
from refsight.sampling import Sampling
from refsight.errors import InvalidInputError
from schema_cases import BROKEN, schemas

require_llama_cpp()

MODEL = "tiny-qwen2-vl-gguf"


@pytest.fixture(scope="module")
def backend(gguf):
    return gguf(MODEL)


def _request(photos, sampling=None, schema=None, max_new_tokens=6):
    segments = [photos["chelsea"], "Describe it."]
    return GenerationRequest(segments, max_new_tokens=max_new_tokens, sampling=sampling or Sampling(), json_schema=schema)


@pytest.mark.parametrize(
    "sampling",
    [
        Sampling(temperature=1e-300, seed=1),
        Sampling(temperature=1e-40, seed=2),
        Sampling(temperature=1e-44, seed=3),
        Sampling(temperature=1e-12, seed=4),
        Sampling(temperature=2.0, top_p=1e-300, seed=5),
        Sampling(temperature=2.0, top_p=5e-324, seed=6),
    ],
    ids=lambda s: f"t={s.temperature:g},p={s.top_p:g}",
)
def test_tiny_temperatures_and_top_p_decode_greedily(backend, photos, sampling):
    greedy = backend.generate([_request(photos)])[0].token_ids
    assert backend.generate([_request(photos, sampling)])[0].token_ids == greedy
    pieces: list[str] = []
    streamed = backend.generate_stream(_request(photos, sampling), on_text=pieces.append)
    assert streamed.token_ids == greedy and "".join(pieces) == streamed.text


def test_the_edges_of_every_range_generate(backend, photos):
    for sampling in (
        Sampling(temperature=2.0, top_p=1.0, frequency_penalty=2.0, presence_penalty=2.0, seed=2**63 - 1),
        Sampling(temperature=2.0, top_p=1e-300, frequency_penalty=-2.0, presence_penalty=-2.0, seed=0),
        Sampling(temperature=5e-324, top_p=5e-324, frequency_penalty=-2.0, presence_penalty=2.0),
    ):
        generation = backend.generate([_request(photos, sampling, max_new_tokens=4)])[0]
        assert 1 <= len(generation.token_ids) <= 4


@pytest.mark.parametrize("schema, path", BROKEN, ids=[p for _, p in BROKEN])
def test_broken_schemas_are_refused_naming_the_path_before_the_prompt_runs(backend, photos, schema, path):
    before = (backend.runtime.decoded_tokens, backend.encode_calls)
    with pytest.raises(InvalidInputError) as info:
        backend.generate([_request(photos, schema=schema)])
    assert info.value.input == path, str(info.value)
    assert (backend.runtime.decoded_tokens, backend.encode_calls) == before


def test_a_schema_only_llama_cpp_refuses_is_an_input_error_too(backend, photos):
    # A pattern the shared check accepts but llama-cpp-python's converter does not (it wants ^...$).
    with pytest.raises(InvalidInputError) as info:
        backend.generate([_request(photos, schema={"type": "string", "pattern": "[a-z]+"})])
    assert info.value.input == "json_schema"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(schema=schemas())
def test_generated_schemas_are_compiled_or_refused(backend, schema):
    try:
        backend.check_batch([GenerationRequest(["Answer."], json_schema=schema)])
    except InvalidInputError:
        pass
