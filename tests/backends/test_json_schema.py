"""An uncompilable ``json_schema`` is an InvalidInputError naming its path, before any model work (issue 25, item 4).

One shared check (``refsight.backends.schema``) runs for every runtime, then the runtime's
own compiler (xgrammar here, for the transformers backends and for vLLM's grammar); whatever
either refuses reaches the caller as ``InvalidInputError`` on ``json_schema``, never as a
generation failure. The hypothesis tests feed each compiler a few hundred generated schemas.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings

from refsight.errors import InvalidInputError
from schema_cases import BROKEN, schemas


@pytest.fixture(scope="module")
def backend(load):
    return load("tiny-qwen2-vl")


def _request(schema, *segments, max_new_tokens=8):
    from refsight.backends.base import GenerationRequest

    return GenerationRequest([*segments, "Answer in JSON."], max_new_tokens=max_new_tokens, json_schema=schema)


@pytest.mark.parametrize("schema, path", BROKEN, ids=[p for _, p in BROKEN])
def test_broken_schemas_are_refused_naming_the_path_before_any_encode(backend, photos, schema, path, monkeypatch):
    encoded = []
    monkeypatch.setattr(backend, "encode", lambda images: encoded.append(len(images)) or [])
    with pytest.raises(InvalidInputError) as info:
        backend.generate([_request(schema, photos["chelsea"])])
    assert info.value.input == path, str(info.value)
    assert encoded == []  # the fresh image was never encoded: no model work at all


def test_the_judges_schema_and_other_valid_schemas_still_constrain(backend, photos):
    import json

    schema = {
        "type": "object",
        "properties": {"verdict": {"enum": ["yes", "no"]}, "ref": {"$ref": "#/$defs/small"}},
        "required": ["verdict", "ref"],
        "additionalProperties": False,
        "$defs": {"small": {"type": "integer", "minimum": 0, "maximum": 9}},
    }
    text = backend.generate([_request(schema, photos["chelsea"], max_new_tokens=64)])[0].text
    assert json.loads(text)["verdict"] in ("yes", "no")


def _compiled_or_refused(backend, schema) -> str:
    from refsight.backends.base import GenerationRequest

    try:
        backend.check_batch([GenerationRequest(["Answer."], json_schema=schema)])
    except InvalidInputError:
        return "refused"
    return "compiled"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(schema=schemas())
def test_generated_schemas_are_compiled_or_refused_by_the_transformers_backend(backend, schema):
    assert _compiled_or_refused(backend, schema) in ("compiled", "refused")


@pytest.fixture(scope="module")
def vllm_transport(backend):
    """The vLLM backend's own schema path (its EBNF grammar), built around the HF encoder; no server is contacted."""
    from refsight.backends.vllm.backend import VLLMBackend
    from refsight.backends.vllm.client import VLLMClient

    return VLLMBackend("vllm:http://127.0.0.1:9", client=VLLMClient("vllm", "http://127.0.0.1:9"), served_model="x", encoder=backend)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(schema=schemas())
def test_generated_schemas_are_compiled_or_refused_by_the_vllm_grammar(vllm_transport, schema):
    assert _compiled_or_refused(vllm_transport, schema) in ("compiled", "refused")


def test_the_vllm_grammar_refuses_the_issue_example_by_path(vllm_transport):
    from refsight.backends.base import GenerationRequest

    with pytest.raises(InvalidInputError) as info:
        vllm_transport.check_batch([GenerationRequest(["x"], json_schema=BROKEN[0][0])])
    assert info.value.input == "json_schema.properties.a.$ref"
