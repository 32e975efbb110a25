"""/v1/embeddings, llama-server's /embeddings, Ollama's /api/embed, /v1/rerank and vLLM's /score on a real server.

Shapes are held field by field to what vLLM, llama-server, Jina and Cohere document and answer (their protocol files
and llama.cpp's own server tests: ``tools/server/tests/unit/test_embedding.py``, ``test_rerank.py`` and the
vision embeddings of ``test_vision_api.py``, whose requests are sent here unchanged). One toy server (the ConSE
embedder, real weights) serves every test but the last, which rerank and embed with the served tiny-qwen2-vl.
"""

from __future__ import annotations

import base64
import struct

import numpy as np
import pytest

from live_server import LiveServer, b64, data_url, photo_png
from runtimes import require_module
from refsight import InvalidInputError
from refsight.server import ServerConfig, create_app
from refsight.server.service import Service

CAT, COFFEE = photo_png("chelsea"), photo_png("coffee")
LIFE = "I believe the meaning of life is"


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    store, media = tmp_path_factory.mktemp("store"), tmp_path_factory.mktemp("media")
    (media / "cat.png").write_bytes(CAT)
    server = LiveServer(create_app(ServerConfig(model="toy", store=store, keys={}, media_path=media))).start()
    with server.client() as c:
        assert c.post("/v1/references", json={"image": b64(CAT), "id": "chelsea"}).status_code == 201
    yield server
    server.stop()


@pytest.fixture(scope="module")
def c(live):
    with live.client() as client:
        yield client


def _vectors(reply) -> np.ndarray:
    assert reply.status_code == 200, reply.text
    return np.array([item["embedding"] for item in reply.json()["data"]], np.float32)


def test_the_openai_and_vllm_shape_base64_usage_and_the_rule_of_model(c):
    reply = c.post("/v1/embeddings", json={"input": LIFE, "model": "text-embedding-3-small"})
    body = reply.json()
    assert set(body) == {"id", "object", "created", "model", "data", "usage", "refsight"}
    assert body["id"].startswith("embd-") and body["object"] == "list" and isinstance(body["created"], int)
    assert body["model"] == "conse"  # another name is served by the default embedder, and the reply says which
    (item,) = body["data"]
    assert set(item) == {"object", "index", "embedding"} and item["object"] == "embedding" and item["index"] == 0
    assert len(item["embedding"]) == 1664 and abs(np.linalg.norm(item["embedding"]) - 1) < 1e-3
    assert body["usage"] == {"prompt_tokens": 9, "total_tokens": 9}  # llama-server's count for this text, BERT's
    assert body["refsight"] == {"embedder": "efficientnet-lite0-conse", "random_weights": False,
                                "images_cached": [], "ignored": []}
    coded = c.post("/v1/embeddings", json={"input": [LIFE, LIFE], "encoding_format": "base64"}).json()
    assert coded["usage"]["prompt_tokens"] == 2 * 9 and coded["data"][1]["encoding_format"] == "base64"
    floats = struct.unpack("<1664f", base64.b64decode(coded["data"][0]["embedding"]))
    assert np.allclose(floats, item["embedding"], atol=1e-6)
    assert c.get("/v1/models").json()["data"][0]["embedder"] == "conse"
    refused = c.post("/v1/embeddings", json={"input": "hi", "model": "toy"})  # the served model: toy gives no states
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "model"


# llama-server's test_embedding_mixed_input, its ids [12, 34, 56] as words of MiniLM's vocabulary (its [unused]
# tokens have no text to read back: refused by name, below, as /completion refuses such ids).
IDS = [7592, 2088, 2003]


@pytest.mark.parametrize("given,count", [
    ("", None), ("string", 1), (IDS, 1), ([*IDS[:2], "string", IDS[2]], 1), (["string1", "string2"], 2),
    (["string1", IDS], 2), ([IDS, [IDS[0], "string", *IDS[1:]]], 2), ({"prompt_string": "string"}, 1),
    ({"content": [{"type": "text", "text": "string"}]}, 1),
    (["string1", {"prompt_string": "string2"}, {"content": [{"type": "text", "text": "string3"}]}], 3),
])
def test_llama_servers_mixed_inputs(c, given, count):
    reply = c.post("/v1/embeddings", json={"input": given})
    if count is None:  # an empty text: llama-server's "Input content cannot be empty"
        assert reply.status_code == 400 and reply.json()["error"]["type"] == "invalid_request_error"
        return
    assert len(_vectors(reply)) == count


@pytest.mark.parametrize("body", [
    {"input": []}, {"input": True}, {"input": "hello", "encoding_format": 1}, {"input": {"content": "string"}},
    {"input": {"content": [{"type": "unknown"}]}}, {"input": "hi", "dimensions": "384"},
    {"input": {"content": [{"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}]}},
    {"input": "hi", "embed_dtype": "float16"}, {"input": "hi", "embd_normalize": -1}, {"input": "hi", "dimensions": 100},
    {"input": "hi", "content": "hi"}, {"input": [130000]}, {"input": [12, 34, 56]}, {"input": "This is a test " * 200},
])
def test_what_cannot_be_served_is_a_400_naming_the_field(c, body):
    reply = c.post("/v1/embeddings", json=body)
    assert reply.status_code == 400 and reply.json()["error"]["type"] == "invalid_request_error", reply.text
    assert reply.json()["error"]["param"].split("[")[0] in body  # the field (a library error: its item too)


def test_texts_as_strings_parts_and_ids_are_one_vector_unknown_fields_named(c):
    same = _vectors(c.post("/v1/embeddings", json={"input": [
        "hello world", {"content": [{"type": "text", "text": "hello "}, {"type": "text", "text": "world"}]},
        [101, 7592, 2088, 102]]}))
    assert np.allclose(same[0], same[1]) and np.allclose(same[0], same[2])
    cut = c.post("/v1/embeddings", json={"input": "hello world", "dimensions": 384, "user": "u", "hnsw": 1})
    assert np.allclose(_vectors(cut)[0], same[0][:384] / np.linalg.norm(same[0][:384]), atol=1e-6)
    assert cut.json()["refsight"]["ignored"] == ["hnsw"]
    long = c.post("/v1/embeddings", json={"input": "This is a test " * 200, "truncate_prompt_tokens": -1})
    assert long.json()["usage"]["prompt_tokens"] == 256


def test_images_in_every_form_are_one_vector_and_repeats_come_from_the_store(c):
    marker = c.get("/props").json()["media_marker"]
    forms = [
        {"content": [{"type": "image_url", "image_url": {"url": data_url(CAT)}}]},
        {"prompt_string": marker, "multimodal_data": [b64(CAT)]},
        {"content": [{"type": "image_url", "image_url": {"url": "refsight://ref/chelsea"}}]},
        {"prompt_string": marker, "multimodal_data": ["refsight://ref/chelsea"]},
        {"content": [{"type": "image_url", "image_url": {"url": "file://cat.png"}}]},  # --media-path
    ]
    reply = c.post("/v1/embeddings", json={"input": forms})
    vectors = _vectors(reply)
    assert all(np.allclose(v, vectors[0]) for v in vectors)
    assert reply.json()["refsight"]["images_cached"] == [False] * 5  # one new image: computed once for all five
    again = c.post("/v1/embeddings", json={"input": forms}).json()["refsight"]["images_cached"]
    assert again == [True] * 5  # then from the store, in every form
    chat = c.post("/v1/embeddings", json={"messages": [{"role": "user", "content": [
        {"type": "text", "text": "What is this: "}, {"type": "image_url", "image_url": {"url": data_url(CAT)}}]}],
        "add_generation_prompt": True})  # vLLM's chat form; its template fields change nothing here
    parts = c.post("/v1/embeddings", json={"input": {"content": [
        {"type": "text", "text": "What is this: "}, {"type": "image_url", "image_url": {"url": data_url(CAT)}}]}})
    assert np.allclose(_vectors(chat), _vectors(parts)) and chat.json()["refsight"]["ignored"] == ["add_generation_prompt"]
    remote = c.post("/v1/embeddings", json={"input": {"content": [
        {"type": "image_url", "image_url": {"url": "http://127.0.0.1:9/cat.png"}}]}})
    assert remote.status_code == 400 and "not fetched" in remote.json()["error"]["message"]


def test_llama_servers_vision_embeddings_requests_unchanged(c):
    marker = c.get("/props").json()["media_marker"]
    prompt = f"What is this: {marker}\n"
    reply = c.post("/embeddings", json={"content": [
        {"prompt_string": prompt, "multimodal_data": [b64(CAT)]}, {"prompt_string": prompt, "multimodal_data": [b64(CAT)]},
        {"prompt_string": prompt.replace(marker, "")}]})
    assert reply.status_code == 200
    body = reply.json()
    assert [item["index"] for item in body] == [0, 1, 2] and len(body[0]["embedding"]) == 1  # one pooled vector
    assert body[0]["embedding"] == body[1]["embedding"] != body[2]["embedding"]
    oai = _vectors(c.post("/v1/embeddings", json={"input": [
        {"content": [{"type": "text", "text": "What is this: "}, {"type": "image_url", "image_url": {"url": data_url(CAT)}},
                     {"type": "text", "text": "\n"}]},
        {"prompt_string": prompt, "multimodal_data": [b64(CAT)]}, "What is this: \n"]}))
    assert np.allclose(oai[0], oai[1]) and not np.allclose(oai[0], oai[2])
    assert np.allclose(oai[0], body[0]["embedding"][0])  # the same vector on both routes
    legacy = c.post("/embedding", json={"content": "hello"}).json()
    assert len(legacy) == 1 and len(legacy[0]["embedding"][0]) == 1664
    assert c.post("/v1/embeddings", json={"content": "hello"}).json()[0]["index"] == 0  # content: llama-server's shape


def test_rerank_in_jina_cohere_vllm_and_tei_shapes(c):
    documents = ["a dog on a beach", "a tabby cat", {"content": [{"type": "image_url",
                                                                    "image_url": {"url": "refsight://ref/chelsea"}}]}]
    reply = c.post("/v1/rerank", json={"model": "conse", "query": "a cat", "documents": documents, "top_n": 2})
    body = reply.json()
    assert set(body) == {"id", "object", "model", "usage", "results", "refsight"} and body["model"] == "conse"
    assert [r["index"] for r in body["results"]] == [1, 2]  # best first, top_n of them: the cat above the dog
    assert set(body["results"][0]) == {"index", "relevance_score", "document"}
    assert body["results"][0]["document"] == {"text": "a tabby cat"} and body["usage"]["total_tokens"] > 0
    everything = c.post("/rerank", json={"model": "conse", "query": "a cat", "documents": documents, "top_n": 0})
    image = next(r for r in everything.json()["results"] if r["index"] == 2)
    assert image["document"] == {"multi_modal": [{"type": "image_url", "image_url": {"url": "refsight://ref/chelsea"}}]}
    bare = c.post("/v2/rerank", json={"model": "conse", "query": "a cat", "documents": documents[:2],
                                      "return_documents": False}).json()
    assert all(set(r) == {"index", "relevance_score"} for r in bare["results"])
    tei = c.post("/reranking", json={"model": "conse", "query": "a cat", "texts": documents[:2], "return_text": True})
    assert [(r["index"], r["text"]) for r in tei.json()] == [(1, "a tabby cat"), (0, "a dog on a beach")]
    for bad in ([], None, 123, [1, 2, 3]):  # llama-server's test_invalid_rerank_req
        refused = c.post("/rerank", json={"model": "conse", "query": "a cat", "documents": bad})
        assert refused.status_code == 400 and "error" in refused.json()
    no_score = c.post("/v1/rerank", json={"query": "a cat", "documents": ["a dog"]})  # toy has no P(yes)
    assert no_score.status_code == 400 and no_score.json()["error"]["param"] == "model"
    refused = c.post("/v1/rerank", json={"model": "conse", "query": "q", "documents": ["d"], "max_tokens_per_doc": 9})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "max_tokens_per_doc"


def test_vllms_score_one_to_many_and_pairwise(c):
    one = c.post("/score", json={"model": "conse", "text_1": "a cat", "text_2": ["a dog", "a tabby cat"]}).json()
    assert set(one) == {"id", "object", "created", "model", "data", "usage", "refsight"}
    assert [(d["index"], d["object"]) for d in one["data"]] == [(0, "score"), (1, "score")]
    assert one["data"][1]["score"] > one["data"][0]["score"] and one["usage"]["completion_tokens"] == 0
    pairs = c.post("/v1/score", json={"model": "conse", "queries": ["a cat", "a dog"], "documents": ["a cat", "a dog"]})
    assert all(abs(d["score"] - 1) < 1e-5 for d in pairs.json()["data"])
    refused = c.post("/score", json={"model": "conse", "text_1": ["a", "b"], "text_2": ["x", "y", "z"]})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "text_1"


def test_ollama_embed_takes_images_and_gives_the_same_vectors(c, live):
    client = require_module("ollama").Client(host=live.url)
    texts = client.embed(model="conse", input=["hello world", LIFE])
    openai = _vectors(c.post("/v1/embeddings", json={"input": ["hello world", LIFE]}))
    assert np.allclose(texts.embeddings, openai, atol=1e-6) and texts.prompt_eval_count == 4 + 9
    both = c.post("/api/embed", json={"model": "conse", "input": "hello world", "images": [b64(CAT), "refsight://ref/chelsea"]})
    vectors = both.json()["embeddings"]
    assert len(vectors) == 3 and np.allclose(vectors[1], vectors[2]) and both.json()["refsight"]["images_cached"][1]
    legacy = c.post("/api/embeddings", json={"model": "conse", "prompt": "hello world"}).json()
    assert np.allclose(legacy["embedding"], openai[0], atol=1e-6)
    assert c.post("/api/embed", json={"model": "conse", "input": []}).json()["embeddings"] == []
    missing = c.post("/api/embed", json={"model": "nomic-embed-text", "input": "x"})
    assert missing.status_code == 404 and "not found" in missing.json()["error"]


def test_images_are_bounded_per_input_and_their_pixels_per_request(make_server):
    server = make_server(max_images_per_request=2, max_request_pixels=3 * 64 * 48)
    image = {"type": "image_url", "image_url": {"url": data_url(CAT)}}
    with server.client() as c:
        assert c.post("/v1/embeddings", json={"input": [{"content": [image]}] * 3}).status_code == 200  # 2 an input
        crowded = c.post("/v1/embeddings", json={"input": {"content": [image] * 3}})
        assert crowded.status_code == 400 and crowded.json()["error"]["code"] == "too_many_images"
        heavy = c.post("/v1/embeddings", json={"input": [{"content": [image]}] * 4})  # 4 of 64x48 > 3 of them
        assert heavy.status_code == 400 and heavy.json()["error"]["code"] == "too_many_pixels"
        documents = [{"content": [image]}] * 4
        assert c.post("/v1/rerank", json={"model": "conse", "query": "a cat", "documents": documents}).json()[
            "error"]["code"] == "too_many_pixels"


def test_pooling_none_is_not_served_and_last_needs_a_model_that_embeds(tmp_path):
    with pytest.raises(InvalidInputError, match="pooling"):
        ServerConfig(model="toy", pooling="none", keys={}).validate({})
    service = Service(ServerConfig(model="toy", store=tmp_path, keys={}, pooling="last"), share_packages=True)
    try:
        with pytest.raises(InvalidInputError, match="pooling: last: toy cannot embed"):
            service.open()  # at start, not a 400 for every request
    finally:
        service.close()


def test_the_served_vlm_reranks_by_p_yes_and_embeds(make_server):
    server = make_server(model="tiny-qwen2-vl", pooling="last")  # llama-server's --pooling last: it embeds too
    with server.client() as c:
        assert c.post("/v1/references", json={"image": b64(CAT), "id": "chelsea"}).status_code == 201
        documents = [{"content": [{"type": "image_url", "image_url": {"url": "refsight://ref/chelsea"}}]},
                     {"content": [{"type": "image_url", "image_url": {"url": data_url(COFFEE)}}]}, "a tabby cat"]
        body = c.post("/v1/rerank", json={"query": "a cat", "documents": documents}).json()
        assert body["model"] == "tiny-qwen2-vl" and body["refsight"]["reranker"] == "vlm-yes-no"
        assert body["refsight"]["random_weights"] is True and all(0 < r["relevance_score"] < 1 for r in body["results"])
        image = {"content": [{"type": "image_url", "image_url": {"url": data_url(COFFEE)}}]}
        reply = c.post("/v1/embeddings", json={"input": [image, "a cup"]})  # no model: the served one (--pooling last)
        assert reply.json()["model"] == "tiny-qwen2-vl" and reply.json()["refsight"]["random_weights"] is True
        assert _vectors(reply).shape == (2, 64)
