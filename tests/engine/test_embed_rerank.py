"""Engine.embed and Engine.rerank over real models: the ConSE embedder (real weights) and tiny-qwen2-vl (random).

An image's vector is kept by content and embedder fingerprint (a restart, a reference of the same pixels and a repeat
all read it, never the encoder); the policies that keep nothing keep no vector; the VLM reranker reads stored
references from their packages and scores as the fresh path does.
"""

from __future__ import annotations

import io

import numpy as np
import pytest

from refsight import Engine, InvalidInputError, ReferenceSegment
from refsight.embedders import get_embedder
from refsight.embedders.base import l2_normalise
from refsight.inputs.images import load_image
from refsight.ranking import EmbedRequest, RerankRequest
from refsight.retrieval.vectors import vector_key
from refsight.samples import load_sample


def _png(name: str, size=(96, 72)) -> bytes:
    buffer = io.BytesIO()
    load_sample(name, size).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return tmp_path_factory.mktemp("ranking-store")


@pytest.fixture(scope="module")
def engine(store):
    with Engine(store, model="toy") as engine:
        engine.add(_png("chelsea"), ref_id="chelsea")
        yield engine


def test_an_image_is_embedded_once_ever_its_vector_kept_by_content_and_fingerprint(engine, store):
    photo = _png("rocket")
    first = engine.embed(EmbedRequest([photo]))
    again = engine.embed(EmbedRequest([[photo]]))
    assert first.images_cached == (False,) and again.images_cached == (True,)
    conse = get_embedder("conse")
    direct = conse.embed_images([load_image(photo)])  # the embedder called directly, no store
    assert np.allclose(first.vectors, direct, atol=1e-6) and np.array_equal(first.vectors, again.vectors)
    key = vector_key(conse.digest)  # one row, under the embedder's fingerprint digest and the pixels' hash
    assert set(engine.retrieval.vector_db().get_vectors(key, [load_image(photo).sha256])) == {load_image(photo).sha256}
    with Engine(store, model="toy") as restarted:  # another process of the same store: the row, no encoder
        after = restarted.embed(EmbedRequest([photo]))
    assert after.images_cached == (True,) and np.array_equal(after.vectors, first.vectors)


def test_a_reference_and_the_same_pixels_share_one_vector_with_recall(engine):
    by_reference = engine.embed(EmbedRequest([ReferenceSegment("chelsea")]))
    by_pixels = engine.embed(EmbedRequest([_png("chelsea")]))
    assert by_pixels.images_cached == (True,)
    assert np.array_equal(by_reference.vectors, by_pixels.vectors)
    recall = engine.retrieval.reference_vectors([engine.book.get("chelsea", namespace="default")])
    assert np.allclose(recall, by_reference.vectors)


def test_inputs_of_several_parts_cuts_and_token_ids(engine):
    conse = get_embedder("conse")
    photo = _png("coffee")
    mixed, text, image = engine.embed(EmbedRequest([["a cup of ", photo], "a cup of ", photo])).vectors
    assert np.allclose(mixed, l2_normalise((text + image)[None])[0], atol=1e-6)  # the normalised sum of its parts
    cut = engine.embed(EmbedRequest([photo], dimensions=384))
    assert cut.vectors.shape == (1, 384) and np.allclose(cut.vectors[0], l2_normalise(image[None, :384])[0], atol=1e-6)
    with pytest.raises(InvalidInputError, match="dimensions") as info:
        engine.embed(EmbedRequest(["hi"], dimensions=100))
    assert "384, 1664" in info.value.reason
    ids = conse.text_tokens("hello world")
    assert ids[0] == 101 and ids[-1] == 102  # [CLS] ... [SEP]
    as_ids, as_text = engine.embed(EmbedRequest([ids, "hello world"])).vectors
    assert np.allclose(as_ids, as_text) and np.allclose(engine.embed(EmbedRequest([ids[1:-1]])).vectors[0], as_text)
    with pytest.raises(InvalidInputError, match=r"inputs\[0\]: a token id outside the vocabulary of 30522"):
        engine.embed(EmbedRequest([[128000, 9906]]))  # OpenAI's cl100k ids (LangChain's tiktoken): not MiniLM's
    piece = conse.text_encoder.counter.token_to_id("##ing")  # half a word: its text reads back as another token
    with pytest.raises(InvalidInputError, match=r"inputs\[1\]: these token ids do not read back"):
        engine.embed(EmbedRequest(["fine", [piece]]))
    long = "This is a test " * 200
    with pytest.raises(InvalidInputError, match=r"inputs\[1\]: 802 tokens, over the 256"):
        engine.embed(EmbedRequest(["short", long]))
    assert engine.embed(EmbedRequest(["short", long], truncate=True)).prompt_tokens == 3 + 256
    for bad, message in (([], "1 to 2048"), ([" "], "empty"), ([[True]], "no token id")):
        with pytest.raises(InvalidInputError, match=message):
            EmbedRequest(bad)


def test_the_cosine_reranker_scores_each_pair(engine):
    request = RerankRequest(["a cat"], ["a dog", "a tabby cat", ReferenceSegment("chelsea")], reranker="conse")
    result = engine.rerank(request)
    vectors = engine.embed(EmbedRequest(["a cat", "a dog", "a tabby cat", ReferenceSegment("chelsea")])).vectors
    assert np.allclose(result.scores, vectors[1:] @ vectors[0], atol=1e-6)
    assert result.reranker == "embedding-cosine" and not result.random_weights
    assert [i for i, _ in result.ranked(2)] == [1, 0]
    pairs = engine.rerank(RerankRequest(["a cat", "a dog"], ["a tabby cat", "a puppy"], reranker=None))
    assert np.allclose(pairs.scores, [vectors[0] @ vectors[2], float(engine.embed(EmbedRequest(
        ["a dog", "a puppy"])).vectors.prod(axis=0).sum())], atol=1e-6)
    with pytest.raises(InvalidInputError, match="queries"):
        RerankRequest(["a", "b"], ["x", "y", "z"])
    with pytest.raises(InvalidInputError, match="reranker: toy gives no yes/no score"):
        engine.rerank(RerankRequest(["a cat"], ["a dog"]))


def test_policies_that_keep_nothing_keep_no_vector(tmp_path):
    photo = _png("astronaut")
    with Engine(tmp_path / "off", model="toy", remember_images="off") as engine:
        engine.add(_png("horse"), ref_id="horse")
        assert [engine.embed(EmbedRequest([photo])).images_cached for _ in range(2)] == [(False,), (False,)]
        engine.embed(EmbedRequest([ReferenceSegment("horse")]))  # a reference's vector is kept whatever the policy
        assert engine.embed(EmbedRequest([ReferenceSegment("horse")])).images_cached == (True,)
    with Engine(tmp_path / "tenants", model="toy", share_packages=False) as engine:
        assert engine.embed(EmbedRequest([photo], namespace="a")).images_cached == (False,)
        assert engine.embed(EmbedRequest([photo], namespace="b")).images_cached == (False,)  # b never sees a's row
        assert engine.embed(EmbedRequest([photo], namespace="a")).images_cached == (True,)
        assert engine.embed(EmbedRequest([photo], namespace="a", use_cache=False)).images_cached == (False,)


def test_the_vlm_embeds_and_reranks_stored_references_from_their_packages(tmp_path):
    with Engine(tmp_path / "vlm", model="tiny-qwen2-vl") as engine:
        engine.add(_png("chelsea"), ref_id="chelsea")
        engine.add(_png("coffee"), ref_id="coffee")
        documents = [ReferenceSegment("chelsea"), ReferenceSegment("coffee"), _png("rocket"), "a tabby cat"]
        hits = engine.stats().hits
        cached = engine.rerank(RerankRequest([["a cat", _png("horse")]], documents))
        assert engine.stats().hits - hits >= 2  # both references from their stored packages, no encoder
        fresh = engine.rerank(RerankRequest([["a cat", _png("horse")]], documents, use_cache=False))
        assert np.allclose(cached.scores, fresh.scores, atol=1e-4)  # pixels through the runtime: the same scores
        assert cached.reranker == "vlm-yes-no" and cached.random_weights and all(0 < s < 1 for s in cached.scores)
        name = "vlm:tiny-qwen2-vl"
        first = engine.embed(EmbedRequest([_png("rocket"), ["a photo of", ReferenceSegment("chelsea")]], embedder=name))
        assert first.embedder == name and first.random_weights and first.vectors.shape == (2, 64)
        again = engine.embed(EmbedRequest([_png("rocket")], embedder=name))
        assert again.images_cached == (True,) and np.array_equal(again.vectors[0], first.vectors[0])
        assert np.allclose(first.vectors[0], engine.ranking.embeddings.embedder(
            engine.context(), name).embed_images([load_image(_png("rocket"))])[0], atol=1e-5)
        ids = engine.backend().tokenize("a tabby cat", add_special=False, parse_special=False)
        as_ids, as_text = engine.embed(EmbedRequest([ids, "a tabby cat"], embedder=name)).vectors  # the VLM's ids
        assert np.allclose(as_ids, as_text)
