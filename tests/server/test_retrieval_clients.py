"""The clients people index and rerank with, unchanged, against refsight serve (one live toy server, the ConSE
embedder): the OpenAI SDK's ``embeddings.create``, LangChain's ``OpenAIEmbeddings``, LlamaIndex's ``OpenAIEmbedding``,
Cohere's SDK (v1 and v2 rerank), and a round trip through Chroma: the bundled photos' vectors stored in Chroma,
a new photo of the cat (mirrored, cropped: ``refsight samples``' ``new.jpg``) recalls the cat, and refsight judges
only the recalled finalists (``/v1/compare`` with their ids)."""

from __future__ import annotations

import numpy as np
import pytest

from live_server import LiveServer, b64, data_url
from refsight.demo import write_samples
from refsight.samples import SAMPLE_NAMES, sample_path
from refsight.server import ServerConfig, create_app
from runtimes import require_module

TEXTS = ["a tabby cat asleep", "a cup of coffee", "a rocket on its launch pad"]


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    store = tmp_path_factory.mktemp("store")
    server = LiveServer(create_app(ServerConfig(model="toy", store=store, keys={}, ingest_attributes=()))).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def floats(live):
    """The vectors of :data:`TEXTS` as ``/v1/embeddings`` gives them in JSON floats: what every client must get."""
    with live.client() as c:
        reply = c.post("/v1/embeddings", json={"input": TEXTS, "encoding_format": "float"})
    return np.array([item["embedding"] for item in reply.json()["data"]])


def _sdk(live: LiveServer):
    return require_module("openai").OpenAI(base_url=f"{live.url}/v1", api_key="unused-without-keys")


def test_the_openai_sdk_embeddings_create(live, floats):
    reply = _sdk(live).embeddings.create(model="text-embedding-3-small", input=TEXTS)  # the SDK asks for base64
    assert np.allclose([item.embedding for item in reply.data], floats, atol=1e-6)
    assert reply.model == "conse" and reply.usage.prompt_tokens == reply.usage.total_tokens > 0
    cut = _sdk(live).embeddings.create(model="conse", input=TEXTS[0], dimensions=384, encoding_format="float")
    assert len(cut.data[0].embedding) == 384


def test_langchain_and_llamaindex_embeddings(live, floats):
    # LangChain's one setting for any server but OpenAI's own (its docs say so for vLLM, Ollama, OpenRouter): without
    # it, LangChain tokenizes with tiktoken (whose vocabulary file it downloads) and sends OpenAI's token ids.
    langchain = require_module("langchain_openai").OpenAIEmbeddings(
        model="conse", base_url=f"{live.url}/v1", api_key="unused", check_embedding_ctx_length=False)
    assert np.allclose(langchain.embed_documents(TEXTS), floats, atol=1e-6)
    assert np.allclose(langchain.embed_query(TEXTS[1]), floats[1], atol=1e-6)
    llama_index = require_module("llama_index.embeddings.openai").OpenAIEmbedding(
        model_name="text-embedding-3-small", api_base=f"{live.url}/v1", api_key="unused")  # unchanged
    assert np.allclose(llama_index.get_text_embedding_batch(TEXTS), floats, atol=1e-6)


def test_cohere_rerank_v1_and_v2(live):
    cohere = require_module("cohere")
    documents = ["a dog on a beach", "a tabby cat asleep on a sofa", "a rocket"]
    for client in (cohere.ClientV2(api_key="unused", base_url=live.url), cohere.Client(api_key="unused", base_url=live.url)):
        reply = client.rerank(model="conse", query="a cat", documents=documents, top_n=2)
        assert len(reply.results) == 2 and reply.results[0].index == 1  # the cat first, the best two
        assert reply.results[0].relevance_score > reply.results[1].relevance_score


def test_a_chroma_round_trip_recalls_the_cat_and_refsight_judges_the_finalists(live, tmp_path):
    chromadb = require_module("chromadb")
    samples = {path.name: path for path in write_samples(tmp_path)}
    sdk = _sdk(live)
    with live.client() as c:
        for name in SAMPLE_NAMES:  # the photos are refsight's references too: it judges them later, by id
            assert c.post("/v1/references", json={"image": b64(sample_path(name).read_bytes()), "id": name}).status_code == 201

    def image(path) -> dict:
        return {"content": [{"type": "image_url", "image_url": {"url": data_url(path.read_bytes(), "image/jpeg")}}]}

    indexed = sdk.embeddings.create(model="conse", input=[image(sample_path(name)) for name in SAMPLE_NAMES])
    photos = chromadb.EphemeralClient().get_or_create_collection(
        "refsight-photos", embedding_function=None, metadata={"hnsw:space": "cosine"})
    photos.add(ids=list(SAMPLE_NAMES), embeddings=[item.embedding for item in indexed.data])
    new = sdk.embeddings.create(model="conse", input=[image(samples["new.jpg"])]).data[0].embedding
    finalists = photos.query(query_embeddings=[new], n_results=3)["ids"][0]
    assert finalists[0] == "chelsea"
    again = sdk.embeddings.create(model="conse", input=[image(sample_path(name)) for name in SAMPLE_NAMES])
    assert again.model_extra["refsight"]["images_cached"] == [True] * len(SAMPLE_NAMES)  # re-indexing: no encoder
    with live.client() as c:
        judged = c.post("/v1/compare", json={"candidate": b64(samples["new.jpg"].read_bytes()),
                                             "criteria": "the same cat", "ref_ids": finalists})
    assert judged.status_code == 200, judged.text
    assert sorted(row["ref_id"] for row in judged.json()["results"]) == sorted(finalists)
