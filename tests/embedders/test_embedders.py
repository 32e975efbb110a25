"""Embedders: the real offline ConSE embedder on real photos, tiny CLIP/SigLIP, the VLM adapter."""

from __future__ import annotations

import numpy as np
import pytest
from runtimes import require_runtime
from PIL import Image, ImageEnhance

from refsight.errors import InvalidInputError, ModelLoadError
from refsight.inputs.images import load_image
from refsight.embedders import ClipEmbedder, EfficientNetConSEEmbedder, VlmEmbedder
from refsight.retrieval import Embedder, default_embedder

from bundled_photos import BUNDLED, bundled_photo


@pytest.fixture(scope="module")
def emb() -> EfficientNetConSEEmbedder:
    return default_embedder()


@pytest.fixture(scope="module")
def doc_vectors(emb) -> np.ndarray:
    return emb.embed_images([bundled_photo(n) for n in BUNDLED])


@pytest.mark.parametrize(
    "query,expected",
    [("a cat", "chelsea"), ("a cup of coffee", "coffee"), ("a rocket", "rocket"), ("a tabby cat", "chelsea"),
     ("a horse", "horse"), ("a flower", "flower")],
)
def test_text_query_ranks_the_right_photo_first(emb, doc_vectors, query, expected):
    scores = doc_vectors @ emb.embed_texts([query])[0]
    assert BUNDLED[int(np.argmax(scores))] == expected, dict(zip(BUNDLED, scores.round(3)))


def test_vectors_are_unit_float32_of_the_declared_dim(emb, doc_vectors):
    assert doc_vectors.shape == (len(BUNDLED), emb.dim) == (7, 1664)
    assert doc_vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(doc_vectors, axis=1), 1.0, atol=1e-5)
    t = emb.embed_texts(["a cat", "a dog"], instruction="ignored by MiniLM")
    np.testing.assert_allclose(np.linalg.norm(t, axis=1), 1.0, atol=1e-5)
    assert np.all(t[:, 384:] == 0)  # text lives in the ConSE block only


def _variants(image: Image.Image) -> list[Image.Image]:
    w, h = image.size
    return [
        image.crop((w // 8, h // 8, w - w // 8, h - h // 8)),
        image.transpose(Image.Transpose.FLIP_LEFT_RIGHT),
        ImageEnhance.Color(image).enhance(0.3).resize((w // 2, h // 2)),
    ]


@pytest.mark.slow  # embeds every photo with two embedders
def test_image_queries_find_their_source_and_features_beat_conse_alone(emb, doc_vectors):
    """The measurement behind the design: penultimate features separate photos better than ConSE."""
    queries, truth = [], []
    for i, name in enumerate(BUNDLED):
        for v in _variants(bundled_photo(name).image):
            queries.append(v)
            truth.append(i)
    # one forward pass per query; the image vector is rebuilt from its parts (checked below)
    feats_q, probs_q = emb.classifier.features_and_probabilities(queries)
    conse_q = emb.conse(probs_q)
    a, b = np.sqrt(emb.conse_weight), np.sqrt(1 - emb.conse_weight)
    q = np.concatenate([a * conse_q, b * feats_q], axis=1)
    np.testing.assert_allclose(emb.embed_images([load_image(queries[0])])[0], q[0], atol=1e-5)
    blended = q @ doc_vectors.T
    assert [int(np.argmax(row)) for row in blended] == truth

    conse_d, feats_d = doc_vectors[:, :384] / a, doc_vectors[:, 384:] / b

    def margin(s):  # score of the right photo minus the best wrong one, averaged
        return np.mean([s[j, t] - np.delete(s[j], t).max() for j, t in enumerate(truth)])

    m_conse = margin(conse_q @ conse_d.T)
    m_feat = margin(feats_q @ feats_d.T)
    assert m_feat > m_conse
    assert margin(blended) > m_conse


def test_shipped_label_vectors_match_a_fresh_encoding(emb):
    from refsight.embedders.efficientnet_lite import imagenet_labels
    from refsight.embedders.conse import _label_vectors

    shipped = _label_vectors(emb.label_template)
    idx = [0, 281, 282, 504, 657, 967, 999]
    fresh = emb.text_encoder.encode([emb.label_template.format(imagenet_labels()[i]) for i in idx])
    np.testing.assert_allclose(shipped[idx], fresh, atol=1e-5)


def test_fingerprint_digest_is_stable_and_tracks_the_recipe(emb):
    assert emb.digest == EfficientNetConSEEmbedder().digest
    other = EfficientNetConSEEmbedder(conse_weight=0.5)
    assert other.digest != emb.digest
    fp = emb.fingerprint()
    assert fp["image_model"]["preprocessing"]["crop"] == 224 and fp["top_t"] == 10


def test_bad_inputs_name_the_input(emb):
    with pytest.raises(InvalidInputError, match="texts"):
        emb.embed_texts("a cat")
    with pytest.raises(InvalidInputError, match=r"texts\[0\]"):
        emb.embed_texts(["  "])
    with pytest.raises(InvalidInputError, match=r"images\[0\]"):
        emb.embed_images([Image.new("RGB", (4, 4))])
    with pytest.raises(InvalidInputError, match="conse_weight"):
        EfficientNetConSEEmbedder(conse_weight=0)
    assert emb.embed_images([]).shape == (0, 1664)


# -- CLIP / SigLIP on tiny random models ----------------------------------------------------


def _tiny_tokenizer(path, *, pad="<pad>", eos="</s>"):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(["a cat a rocket a cup of coffee photo of the"] * 3,
                            trainers.WordLevelTrainer(special_tokens=["<unk>", pad, eos, "<s>"]))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", pad_token=pad, eos_token=eos, bos_token="<s>")
    fast.save_pretrained(path)


@pytest.mark.parametrize("kind", ["clip", "siglip"])
def test_tiny_clip_and_siglip_load_from_a_directory_and_embed(tmp_path, kind):
    import torch
    import transformers

    torch.manual_seed(0)
    text = dict(vocab_size=32, hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4,
                max_position_embeddings=80)
    vision = dict(hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4, image_size=32, patch_size=8)
    if kind == "clip":
        cfg = transformers.CLIPConfig(text_config=dict(text, eos_token_id=2, pad_token_id=1, bos_token_id=3),
                                      vision_config=vision, projection_dim=24)
        model = transformers.CLIPModel(cfg)
        transformers.CLIPImageProcessorPil(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}).save_pretrained(tmp_path)
    else:
        cfg = transformers.SiglipConfig(text_config=text, vision_config=vision)
        model = transformers.SiglipModel(cfg)
        transformers.SiglipImageProcessorPil(size={"height": 32, "width": 32}).save_pretrained(tmp_path)
    model.save_pretrained(tmp_path)
    _tiny_tokenizer(tmp_path)

    emb = ClipEmbedder(tmp_path)
    assert isinstance(emb, Embedder) and emb.dim == (24 if kind == "clip" else 32)
    imgs = [bundled_photo("chelsea"), bundled_photo("coffee")]
    v = emb.embed_images(imgs)
    t = emb.embed_texts(["a cat", "a cup of coffee", "a rocket"])
    assert v.shape == (2, emb.dim) and t.shape == (3, emb.dim)
    np.testing.assert_allclose(np.linalg.norm(np.vstack([v, t]), axis=1), 1.0, atol=1e-5)
    # matches a direct call of the model (the wrapper adds nothing but batching and norm)
    with torch.inference_mode():
        px = emb.image_processor([bundled_photo("chelsea").image], return_tensors="pt")["pixel_values"]
        direct = model.eval().get_image_features(pixel_values=px)
    direct = getattr(direct, "pooler_output", direct)[0].numpy()
    np.testing.assert_allclose(v[0], direct / np.linalg.norm(direct), atol=1e-5)
    assert emb.fingerprint()["revision"] and emb.digest == ClipEmbedder(tmp_path).digest


def test_clip_embedder_refuses_other_models_and_missing_dirs(tmp_path):
    import transformers

    transformers.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=37).save_pretrained(tmp_path)
    with pytest.raises(ModelLoadError, match="not a CLIP"):
        ClipEmbedder(tmp_path)
    with pytest.raises(ModelLoadError):
        ClipEmbedder(tmp_path / "nope")


def test_vlm_embedder_refuses_a_backend_that_cannot_pool():
    class NoPooling:
        name = "no-pooling"

    with pytest.raises(ModelLoadError, match="cannot embed"):
        VlmEmbedder(NoPooling())


def test_vlm_embedder_on_tiny_qwen2_vl_reuses_cached_packages():
    from refsight.errors import UnknownModelError

    try:
        emb = VlmEmbedder("tiny-qwen2-vl")
    except (UnknownModelError, ModelLoadError) as exc:  # the backend is another module's job
        require_runtime("the tiny-qwen2-vl backend (transformers)", str(exc))
    small = [load_image(bundled_photo(n).image.resize((64, 48))) for n in ("chelsea", "coffee")]
    v = emb.embed_images(small)
    assert v.shape == (2, emb.dim) and v.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    # from the cached visual packages: identical vectors, no vision tower needed
    np.testing.assert_allclose(emb.embed_packages(emb.backend.encode(small)), v, atol=1e-5)
    np.testing.assert_allclose(emb.embed_images(small[:1])[0], v[0], atol=1e-4)  # padding-independent
    t = emb.embed_texts(["a cat", "a cup of coffee"])
    assert t.shape == (2, emb.dim) and not np.allclose(t[0], t[1])
    # the instruction is part of the input, so it changes the vector
    assert not np.allclose(emb.embed_texts(["a cat"], instruction="Describe the fur.")[0], t[0])
    assert emb.fingerprint()["embedder"] == "vlm-last-token/v1"
