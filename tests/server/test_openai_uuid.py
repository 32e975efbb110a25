"""vLLM's media ``uuid`` means what vLLM means, driven by the official openai SDK over a real socket,
on real models (tiny random Qwen2-VL on transformers, and its GGUF on llama.cpp).

A part with pixels and a uuid is those pixels (also remembered under the uuid, per tenant); a part
with ``image_url: null`` and a uuid is what was sent before under it, a 400 naming the uuid on a
miss; stored references are named by ``refsight://ref/<id>`` or this server's own image URL.
The two photos have different sizes, so their prompts have different image-token counts: a
``prompt_tokens`` that matches one photo's fresh request proves which pixels were answered about.
"""

from __future__ import annotations

import openai
import pytest
from runtimes import require_module

from live_server import LiveServer, b64, data_url, photo_png
from refsight.server import ServerConfig, create_app

KEY, OTHER = "uuid-tenant-key-0001", "uuid-tenant-key-0002"
CAT, COFFEE = photo_png("chelsea", (56, 56)), photo_png("coffee", (84, 56))


def _serve(store, model: str) -> LiveServer:
    return LiveServer(create_app(ServerConfig(store=store, model=model, keys={KEY: "one", OTHER: "two"}))).start()


# The GGUF half converts the tiny model to GGUF (llama-cpp-python: an optional runtime): left to the slow runs.
@pytest.fixture(scope="module", params=["tiny-qwen2-vl", pytest.param("tiny-qwen2-vl-gguf", marks=pytest.mark.slow)])
def live(request, tmp_path_factory) -> LiveServer:
    """The server on the HF backend, then on the llama.cpp backend (the same tests on both)."""
    if request.param.endswith("-gguf"):
        require_module("llama_cpp")
        from refsight.builtin_models.gguf import ensure_gguf

        ensure_gguf(request.param)  # built before the server starts, so start-up is only the load
    else:
        require_module("transformers")
    server = _serve(tmp_path_factory.mktemp("uuid-store"), request.param)
    with server.client(KEY) as c:
        assert c.post("/v1/references", json={"image": b64(CAT), "id": "chelsea"}).status_code == 201
    yield server
    server.stop()


def sdk(live: LiveServer, key: str = KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{live.url}/v1", api_key=key, max_retries=0, timeout=300)


def ask(live: LiveServer, image_part: dict, key: str = KEY):
    return sdk(live, key).chat.completions.create(
        model=live.service.model, max_tokens=6,
        messages=[{"role": "user", "content": [{"type": "text", "text": "What is this?"}, image_part]}],
    )


def pixels(data: bytes, uuid: str | None = None) -> dict:
    part = {"type": "image_url", "image_url": {"url": data_url(data)}}
    return part if uuid is None else {**part, "uuid": uuid}


def lookup(uuid: str) -> dict:
    return {"type": "image_url", "image_url": None, "uuid": uuid}


def answer(completion) -> tuple[str, int]:
    return completion.choices[0].message.content, completion.usage.prompt_tokens


def uuids(completion) -> list[dict]:
    return completion.model_extra["refsight"].get("media_uuids", [])


def test_the_same_uuid_with_other_pixels_answers_about_the_new_pixels(live):
    fresh_cat, fresh_coffee = answer(ask(live, pixels(CAT))), answer(ask(live, pixels(COFFEE)))
    assert fresh_cat[1] != fresh_coffee[1]  # the photos are told apart by their image tokens
    first = ask(live, pixels(CAT, "photo-1"))
    assert answer(first) == fresh_cat and uuids(first) == [{"uuid": "photo-1", "outcome": "stored"}]
    again = ask(live, pixels(CAT, "photo-1"))
    assert answer(again) == fresh_cat and uuids(again) == [{"uuid": "photo-1", "outcome": "unchanged"}]
    replaced = ask(live, pixels(COFFEE, "photo-1"))
    assert answer(replaced) == fresh_coffee and uuids(replaced) == [{"uuid": "photo-1", "outcome": "replaced"}]
    # The uuid now holds the new pixels: a lookup is the coffee, never the old cat.
    looked_up = ask(live, lookup("photo-1"))
    assert answer(looked_up) == fresh_coffee and uuids(looked_up) == [{"uuid": "photo-1", "outcome": "looked_up"}]


def test_a_uuid_named_like_a_stored_reference_is_still_the_pixels_sent(live):
    fresh_coffee = answer(ask(live, pixels(COFFEE)))
    by_uuid = ask(live, pixels(COFFEE, "chelsea"))  # "chelsea" is also a stored reference id
    assert answer(by_uuid) == fresh_coffee
    assert by_uuid.model_extra["refsight"]["references_cached"] == [True]  # the candidate's package, by pixels


def test_a_lookup_miss_is_a_400_naming_the_uuid_and_uuids_are_per_tenant(live):
    with pytest.raises(openai.BadRequestError) as info:
        ask(live, lookup("never-sent"))
    error = info.value.body
    assert error["code"] == "uuid_not_found" and "'never-sent'" in error["message"]
    assert error["param"] == "messages[0].content[1].uuid"
    ask(live, pixels(CAT, "mine"))
    with pytest.raises(openai.BadRequestError) as info:
        ask(live, lookup("mine"), key=OTHER)  # another tenant's uuid is a miss like any other
    assert info.value.body["code"] == "uuid_not_found"
    # An empty url with a uuid is a lookup too (what some clients send instead of null).
    assert uuids(ask(live, {"type": "image_url", "image_url": {"url": ""}, "uuid": "mine"}))[0]["outcome"] == "looked_up"


def test_stored_references_by_refsight_url_and_by_this_servers_url(live):
    fresh = answer(ask(live, pixels(CAT)))
    by_ref = ask(live, {"type": "image_url", "image_url": {"url": "refsight://ref/chelsea"}})
    by_url = ask(live, {"type": "image_url", "image_url": {"url": f"{live.url}/v1/references/chelsea/image"}})
    assert answer(by_ref) == answer(by_url) == fresh
    assert by_ref.model_extra["refsight"]["references_cached"] == [True] and not uuids(by_ref)
    with live.client(KEY) as c:
        image = c.get("/v1/references/chelsea/image")
    assert image.status_code == 200 and image.content == CAT and image.headers["content-type"] == "image/png"
    # Another host's URL of the same shape is a remote URL: never fetched, never taken for a reference.
    with pytest.raises(openai.BadRequestError) as info:
        ask(live, {"type": "image_url", "image_url": {"url": "http://example.com/v1/references/chelsea/image"}})
    assert info.value.body["code"] == "unsupported"
    with pytest.raises(openai.BadRequestError) as info:
        ask(live, {"type": "image_url", "image_url": {"url": "refsight://ref/chelsea"}, "uuid": "x"})
    assert info.value.body["param"] == "messages[0].content[1].uuid"


def test_models_retrieve_names_the_served_model(live):
    assert sdk(live).models.retrieve(live.service.model).id == live.service.model
    with pytest.raises(openai.NotFoundError):
        sdk(live).models.retrieve("not-" + live.service.model)


def test_a_streamed_answer_says_what_its_uuids_did(live):
    ask(live, pixels(COFFEE, "streamed"))
    stream = sdk(live).chat.completions.create(
        model=live.service.model, max_tokens=6, stream=True,
        messages=[{"role": "user", "content": [{"type": "text", "text": "What is this?"}, lookup("streamed")]}],
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == answer(ask(live, pixels(COFFEE)))[0]
    assert chunks[-1].model_extra["refsight"]["media_uuids"] == [{"uuid": "streamed", "outcome": "looked_up"}]
