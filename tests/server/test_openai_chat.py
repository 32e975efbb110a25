"""The OpenAI-compatible endpoint, driven by the official ``openai`` SDK over a real socket."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from live_server import LiveServer, b64, data_url, photo_png

KEY = "sdk-tenant-key-0001"
OTHER = "sdk-tenant-key-0002"


@pytest.fixture
def toy(make_server) -> LiveServer:
    return make_server(keys={KEY: "one", OTHER: "two"})


def sdk(live: LiveServer, key: str = KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{live.url}/v1", api_key=key, max_retries=0, timeout=120)


def test_text_and_data_url_image_parts(toy):
    completion = sdk(toy).chat.completions.create(
        model="toy",
        messages=[{"role": "user", "content": [
            {"type": "text", "text": "What is in this picture?"},
            {"type": "image_url", "image_url": {"url": data_url(photo_png()), "detail": "low"}},
        ]}],
        max_tokens=16,
    )
    assert completion.object == "chat.completion" and completion.model == "toy"
    assert completion.choices[0].message.role == "assistant"
    assert completion.choices[0].message.content == "[toy] 1 images: What is in this picture?"
    assert completion.usage.completion_tokens == 0
    extra = completion.model_extra["refsight"]
    assert extra["random_weights"] is True and "meaningless" in extra["notice"]
    assert extra["references_cached"] == [False]


def test_a_reference_named_by_id_only_or_by_this_servers_url(toy):
    with toy.client(KEY) as c:
        assert c.post("/v1/references", json={"image": b64(photo_png()), "id": "cat"}).status_code == 201
    client = sdk(toy)
    for part in ({"type": "image_url", "image_url": {"url": "refsight://ref/cat"}},
                 {"type": "image_url", "image_url": {"url": f"{toy.url}/v1/references/cat/image"}}):
        completion = client.chat.completions.create(
            model="toy", messages=[{"role": "system", "content": "be brief"},
                                   {"role": "user", "content": [{"type": "text", "text": "Reference:"}, part]}])
        assert completion.model_extra["refsight"]["references_cached"] == [True]
        assert completion.choices[0].message.content == "[toy] 1 images: system: be brief user: Reference:"
    # Another tenant cannot name it: a 404 exactly like a missing id.
    with pytest.raises(openai.NotFoundError) as info:
        sdk(toy, OTHER).chat.completions.create(
            model="toy", messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "refsight://ref/cat"}}]}])
    assert info.value.body["code"] == "reference_not_found"


def test_sdk_errors_map_to_the_sdk_exceptions(toy):
    messages = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.AuthenticationError):
        sdk(toy, "not-a-key-at-all").chat.completions.create(model="toy", messages=messages)
    # Another model name is served by the one model unless matching is strict (test_openai_fields).
    assert sdk(toy).chat.completions.create(model="gpt-4o", messages=messages).model == "toy"
    with pytest.raises(openai.BadRequestError) as info:
        sdk(toy).chat.completions.create(model="toy", messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}]}])
    assert info.value.body["code"] == "unsupported"
    assert [m.id for m in sdk(toy).models.list()] == ["toy"]


@pytest.fixture(scope="module")
def tiny_options() -> dict:
    """The shared real-model server (tests/server/conftest.py), with the tenant key the SDK sends."""
    return {"keys": {KEY: "one"}}


def _count_encodes(backend):
    counts = {"images": 0}
    original = backend.encode

    def counting(images):
        counts["images"] += len(images)
        return original(images)

    backend.encode = counting
    return counts, lambda: setattr(backend, "encode", original)


def test_tiny_qwen2_vl_serves_a_reference_by_id_from_its_package(tiny):
    reference, candidate = photo_png("chelsea", (56, 56)), photo_png("coffee", (56, 56))
    with tiny.client(KEY) as c:
        assert c.post("/v1/references", json={"image": b64(reference), "id": "cat"}).status_code == 201
    backend = tiny.service.engine.backend()
    counts, restore = _count_encodes(backend)
    try:
        def ask(reference_part):
            return sdk(tiny).chat.completions.create(model="tiny-qwen2-vl", max_tokens=8, messages=[{"role": "user", "content": [
                {"type": "text", "text": "Reference:"}, reference_part,
                {"type": "text", "text": "Candidate:"}, {"type": "image_url", "image_url": {"url": data_url(candidate)}},
                {"type": "text", "text": "Same animal?"}]}])

        by_id = ask({"type": "image_url", "image_url": {"url": "refsight://ref/cat"}})
        assert counts["images"] == 1  # only the fresh candidate ran the vision encoder
        by_bytes = ask({"type": "image_url", "image_url": {"url": data_url(reference)}})
        assert counts["images"] == 1  # the candidate's package stayed in memory: not encoded again
    finally:
        restore()
    assert by_id.model_extra["refsight"]["references_cached"] == [True, False]
    # the reference's bytes are served from the store; the candidate from the memory tier
    assert by_bytes.model_extra["refsight"]["references_cached"] == [True, True]
    assert by_id.choices[0].message.content == by_bytes.choices[0].message.content
    assert by_id.usage.completion_tokens >= 1
    assert by_id.model_extra["refsight"]["random_weights"] is True


def test_tiny_qwen2_vl_response_format_json_schema_is_constrained(tiny):
    schema = {"type": "object", "properties": {"animal": {"type": "string", "maxLength": 12}, "same": {"type": "boolean"}},
              "required": ["animal", "same"], "additionalProperties": False}
    completion = sdk(tiny).chat.completions.create(
        model="tiny-qwen2-vl", max_tokens=48,
        messages=[{"role": "user", "content": [{"type": "text", "text": "Answer in JSON."}]}],
        response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}},
    )
    jsonschema.validate(json.loads(completion.choices[0].message.content), schema)
