"""An uncompilable ``json_schema`` is an InvalidInputError naming its path, before any model work (issue 25, item 4).

One shared check (``refsight.inputs.json_schema``) runs for every runtime, then the runtime's
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
    from refsight.requests import GenerationRequest

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
    from refsight.requests import GenerationRequest

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
    from refsight.requests import GenerationRequest

    with pytest.raises(InvalidInputError) as info:
        vllm_transport.check_batch([GenerationRequest(["x"], json_schema=BROKEN[0][0])])
    assert info.value.input == "json_schema.properties.a.$ref"


# -- the grammar's size (issue 49, group 2): the shared check alone, no model ------------------------
# A counted repeat is written out by every compiler (llama.cpp's converter took 26 s and 2 GB for
# "^a{100000000}$"), so each count, each pattern's expansion and the whole schema's are bounded,
# wherever a pattern stands and however a compiler could read its braces.

def _doubling(levels: int) -> dict:
    """$defs d0 .. dN, each referring to the next twice: 2**N copies for a compiler that writes references out."""
    defs = {f"d{i}": {"type": "object", "properties": {"a": {"$ref": f"#/$defs/d{i + 1}"}, "b": {"$ref": f"#/$defs/d{i + 1}"}}}
            for i in range(levels)}
    return {"$defs": {**defs, f"d{levels}": {"type": "string", "maxLength": 10}}, "$ref": "#/$defs/d0"}


def _string(pattern: str) -> dict:
    return {"type": "object", "properties": {"name": {"type": "string", "pattern": pattern}}}


GRAMMAR_BOMBS = [
    (_string("^a{100000000}$"), "format.properties.name.pattern", "repeats 100000000 times"),
    (_string("^[a-z]{100000000}$"), "format.properties.name.pattern", "repeats 100000000 times"),
    (_string("^a{1001}$"), "format.properties.name.pattern", "repeats 1001 times"),
    (_string("^a{1001,}$"), "format.properties.name.pattern", "repeats 1001 times"),
    (_string("^a{0,1001}$"), "format.properties.name.pattern", "repeats 1001 times"),
    (_string("^(a{1000}){1000}$"), "format.properties.name.pattern", "expands to more than 10000"),
    (_string("^(?:(ab){100}c){100}$"), "format.properties.name.pattern", "expands to more than 10000"),
    (_string("^(a{1000,}){10,}$"), "format.properties.name.pattern", "expands to more than 10000"),
    (_string("^(x|[a-z]{1000}){11}$"), "format.properties.name.pattern", "expands to more than 10000"),
    (_string("^" + "[a-z]{1000}" * 11 + "$"), "format.properties.name.pattern", "add up to more than 10000"),
    # Braces other readers take as counts: spaces, underscores, other digits; a class llama.cpp ends at "[]".
    (_string("^a{ 100000000 }$"), "format.properties.name.pattern", "write a repeat count as"),
    (_string("^a{1_000_000}$"), "format.properties.name.pattern", "write a repeat count as"),
    (_string("^a{\u0661\u0660\u0660\u0660\u0660}$"), "format.properties.name.pattern", "write a repeat count as"),
    (_string("^[]a{99999}]$"), "format.properties.name.pattern", "repeats 99999 times"),
    (_string("^[]" + "a{1000}" * 11 + "]$"), "format.properties.name.pattern", "add up to more than 10000"),
    # Every place a schema (so a pattern) may stand.
    ({"patternProperties": {"^a{5000}$": {}}}, "format.patternProperties.^a{5000}$", "repeats 5000"),
    ({"patternProperties": {"^a$": {"pattern": "^a{5000}$"}}}, "format.patternProperties.^a$.pattern", "repeats 5000"),
    ({"propertyNames": {"pattern": "^a{5000}$"}}, "format.propertyNames.pattern", "repeats 5000"),
    ({"not": {"pattern": "^a{5000}$"}}, "format.not.pattern", "repeats 5000"),
    ({"if": {"pattern": "^a{5000}$"}}, "format.if.pattern", "repeats 5000"),
    ({"contains": {"pattern": "^a{5000}$"}}, "format.contains.pattern", "repeats 5000"),
    ({"dependentSchemas": {"a": {"pattern": "^a{5000}$"}}}, "format.dependentSchemas.a.pattern", "repeats 5000"),
    ({"additionalProperties": {"pattern": "^a{5000}$"}}, "format.additionalProperties.pattern", "repeats 5000"),
    ({"items": [{"pattern": "^a{5000}$"}]}, "format.prefixItems[0].pattern", "repeats 5000"),
    ({"$ref": "#/components/x", "components": {"x": {"pattern": "^a{5000}$"}}}, "format.components.x.pattern", "repeats 5000"),
    # Text costs by the character: a long pattern is refused before it is parsed, names and values add up.
    (_string("^" + "a" * 10_001 + "$"), "format.properties.name.pattern", "a pattern may be at most 10000"),
    ({"properties": {f"p{i}": {"pattern": "^" + "(ab|c)" * 400 + "$"} for i in range(50)}}, "format", "as written"),
    ({"enum": [f"{i:04d}" + "x" * 996 for i in range(101)]}, "format", "as written"),
    ({"properties": {f"{i:04d}" + "n" * 996: {} for i in range(101)}}, "format", "as written"),
    # The whole grammar: lengths add up, and a reference counts its target each time it is used.
    ({"properties": {f"p{i}": {"type": "string", "maxLength": 1000} for i in range(101)}}, "format", "more than 100000"),
    ({"$defs": {"s": {"type": "string", "maxLength": 1000}},
      "properties": {f"p{i}": {"$ref": "#/$defs/s"} for i in range(101)}}, "format", "more than 100000"),
    (_doubling(17), "format", "with its references written out"),
]


@pytest.mark.parametrize("schema, path, reason", GRAMMAR_BOMBS, ids=[f"{i}-{p}" for i, (_, p, _) in enumerate(GRAMMAR_BOMBS)])
def test_a_grammar_bomb_is_refused_naming_the_field_before_any_compiler(schema, path, reason):
    from refsight.requests import check_json_schema

    with pytest.raises(InvalidInputError) as info:
        check_json_schema(schema, "format")
    assert info.value.input == path and reason in info.value.reason, str(info.value)


def test_real_patterns_and_large_but_bounded_schemas_pass():
    from refsight.inputs.json_schema import MAX_SCHEMA_SIZE, schema_size

    for pattern in ("^\\d{4}-\\d{2}-\\d{2}$", "^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$",
                    "^[A-Za-z0-9._%+-]{1,64}@[A-Za-z0-9.-]{1,255}\\.[A-Za-z]{2,63}$", "^[a-z]{1000}$", "^[a-z]{1000,}$",
                    "^(ab){10}(cd|ef){0,100}$", "^\\{5000\\}$", "^{name}$", "^a{,}$", "^[^\"\\\\]{0,1000}$"):
        assert schema_size(_string(pattern)) < 2_000, pattern
    # Counts of schemas add: 1,000 strings of 1,000 characters are one string rule used 1,000 times.
    assert schema_size({"type": "array", "minItems": 1000, "items": {"type": "string", "minLength": 1000}}) < 3_000
    # A definition counts where it is used, not where it is written; a chain of them adds up once per use.
    assert schema_size({"$defs": {"unused": {"type": "string", "maxLength": 1000}}, "type": "string"}) < 10
    assert schema_size(_doubling(10)) < MAX_SCHEMA_SIZE
    assert schema_size({"properties": {f"p{i}": {"type": "string", "maxLength": 1000} for i in range(99)}}) < MAX_SCHEMA_SIZE


def test_a_request_keeps_its_schema_in_the_form_every_compiler_takes():
    # Draft-07's tuple form becomes 2020-12's once, when the request is built: no backend rewrites it again.
    tuple_form = {"type": "array", "items": [{"type": "string"}, {"type": "integer"}], "additionalItems": False}
    request = _request(tuple_form)
    assert request.json_schema == {
        "type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}], "items": False,
    }
    assert tuple_form["items"] == [{"type": "string"}, {"type": "integer"}]  # the caller's schema is not changed
    modern = request.json_schema
    assert _request(modern).json_schema is modern  # a modern schema is kept itself: nothing is copied
