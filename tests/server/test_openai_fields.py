"""The fields llama.cpp and vLLM clients send, over a real socket with the openai SDK and raw HTTP:
``model`` optional, ``models.retrieve``, sampling fields honoured or refused by name (the policy's tables, field by
field and dialect by dialect: ``test_dialect_fields.py``)."""

from __future__ import annotations

import openai
import pytest

from live_server import LiveServer, assert_error
from refsight.server.intake.generation_body import DEFAULT_MAX_TOKENS
from refsight.server.intake.generation_fields import NEUTRAL

HI = [{"role": "user", "content": "hi"}]


def sdk(live: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{live.url}/v1", api_key="none", max_retries=0, timeout=300)


@pytest.fixture
def toy(make_server) -> LiveServer:
    return make_server(served_model_names=("gpt-4o-mini", "toy-alias"))


def test_another_model_name_is_served_by_the_one_model_and_the_reply_says_which(toy):
    # llama-server ignores `model`: clients written for OpenAI send "gpt-3.5-turbo" and keep working.
    with toy.client() as c:
        for route in ("/v1/chat/completions", "/chat/completions"):  # the raw-prompt routes: test_llama_server_shapes
            reply = c.post(route, json={"model": "gpt-3.5-turbo", "messages": HI})
            assert reply.status_code == 200, reply.text
            assert reply.json()["model"] == "gpt-4o-mini"
        # A lookup is no request to serve: GET /v1/models/{id} stays exact.
        assert_error(c.get("/v1/models/gpt-3.5-turbo"), 404, "model_not_found")


def test_model_is_optional_and_retrievable_by_each_of_its_names(make_server):
    toy = make_server(served_model_names=("gpt-4o-mini", "toy-alias"), strict_model_names=True)
    with toy.client() as c:
        reply = c.post("/v1/chat/completions", json={"messages": HI})
        assert reply.status_code == 200 and reply.json()["model"] == "gpt-4o-mini"
        for name in ("toy", "toy-alias", "gpt-4o-mini"):
            assert c.post("/v1/chat/completions", json={"model": name, "messages": HI}).status_code == 200
        assert_error(c.post("/v1/chat/completions", json={"model": "other", "messages": HI}), 404, "model_not_found")
    client = sdk(toy)
    assert client.models.retrieve("toy-alias").id == "gpt-4o-mini"
    assert [m.id for m in client.models.list()] == ["gpt-4o-mini"]
    with pytest.raises(openai.NotFoundError) as info:
        client.models.retrieve("llama-3")
    assert info.value.body["code"] == "model_not_found"


def test_neutral_values_are_taken_and_a_backend_refuses_what_it_cannot_honour_by_name(toy):
    with toy.client() as c:
        def chat(**fields):
            return c.post("/v1/chat/completions", json={"messages": HI, **fields})

        assert chat(**{name: rule.values[0] for name, rule in NEUTRAL.items() if rule.values}).status_code == 200
        assert chat(logit_bias=[], top_k=-1, seed=-1).status_code == 200  # llama-server's empty list is no bias either
        assert_error(chat(ignore_eos=True), 400, "unsupported")["param"] == "ignore_eos"
        assert assert_error(chat(n_probs=3), 400, "unsupported")["param"] == "n_probs"  # the toy has no logits
        error = assert_error(chat(lora=[{"id": 0, "scale": 1.0}]), 400, "unsupported")
        assert error["param"] == "lora" and error["message"].startswith("lora: LoRA adapters are not supported")
        # The toy echo honours no sampling field: each is refused by name, never ignored.
        for name, value in (("top_k", 5), ("min_p", 0.1), ("repeat_penalty", 1.1), ("repetition_penalty", 1.2)):
            error = assert_error(chat(**{name: value}), 400, "unsupported")
            assert error["param"] in (name, "repetition_penalty")
        assert_error(chat(repeat_penalty=1.1, repetition_penalty=1.2), 400, "invalid_input")
        assert_error(chat(n_predict=0), 400, "unsupported")
        assert_error(chat(n_predict=5, max_tokens=6), 400, "invalid_input")
        assert chat(n_predict=5, max_tokens=5).status_code == 200
        assert assert_error(chat(n_predict=5000), 400, "invalid_input")["param"] == "n_predict"
        assert_error(chat(json_schema={"type": "object"}, response_format={"type": "json_object"}), 400, "invalid_input")


def test_a_real_model_honours_the_llama_cpp_and_vllm_sampling_fields(tiny):
    client = sdk(tiny)

    def ask(**extra):
        return client.chat.completions.create(model="tiny-qwen2-vl", messages=HI, extra_body=extra, max_tokens=None)

    default = ask()
    assert default.usage.completion_tokens <= DEFAULT_MAX_TOKENS
    by_n_predict = ask(n_predict=4)
    assert by_n_predict.usage.completion_tokens <= 4
    assert by_n_predict.choices[0].message.content == client.chat.completions.create(
        model="tiny-qwen2-vl", messages=HI, max_tokens=4).choices[0].message.content
    # top_k and min_p keep the most likely token: greedy answers do not change.
    assert ask(n_predict=4, top_k=3, min_p=0.2).choices[0].message.content == by_n_predict.choices[0].message.content
    sampled = [ask(n_predict=6, temperature=1.0, seed=7, top_k=5, min_p=0.05, repetition_penalty=1.3) for _ in range(2)]
    assert sampled[0].choices[0].message.content == sampled[1].choices[0].message.content  # seeded: repeatable
    assert ask(n_predict=4, repeat_penalty=1.5).usage.completion_tokens <= 4
    # llama-server's json_schema constrains the answer as response_format does.
    schema = {"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["a"], "additionalProperties": False}
    import json

    assert set(json.loads(ask(n_predict=24, json_schema=schema).choices[0].message.content)) == {"a"}
