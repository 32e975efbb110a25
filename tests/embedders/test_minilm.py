"""all-MiniLM-L6-v2 loads offline from its PyPI package and embeds sensibly."""

from __future__ import annotations

import numpy as np
import pytest

from refsight.errors import InvalidInputError, ModelLoadError
from refsight.embedders.minilm import TextEncoder, load_minilm


@pytest.fixture(scope="module")
def enc() -> TextEncoder:
    return load_minilm()


def test_vectors_are_unit_384_float32(enc):
    v = enc.encode(["a cat", "tabby cat", "rocket"])
    assert v.shape == (3, 384) and v.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)


def test_cat_is_closer_to_tabby_than_to_rocket(enc):
    cat, tabby, rocket = enc.encode(["a cat", "tabby cat", "rocket"])
    assert cat @ tabby > cat @ rocket + 0.2


def test_padding_does_not_change_a_sentence_embedding(enc):
    alone = enc.encode(["a cup of coffee"])[0]
    padded = enc.encode(["a cup of coffee", "a much longer sentence that forces padding of the first one"])[0]
    np.testing.assert_allclose(alone, padded, atol=1e-5)


def test_matches_the_sentence_transformers_reference(enc):
    """Known value: the published model gives cos(a cat, tabby cat) ≈ 0.682 (sentence-transformers)."""
    cat, tabby = enc.encode(["a cat", "tabby cat"])
    assert float(cat @ tabby) == pytest.approx(0.6819, abs=2e-3)


def test_cached_and_fingerprinted(enc):
    assert load_minilm() is enc
    fp = enc.fingerprint
    assert fp["model"] == "sentence-transformers/all-MiniLM-L6-v2" and len(fp["weights_sha256"]) == 64
    assert fp["pooling"] == "mean"


def test_bad_inputs(enc, tmp_path):
    with pytest.raises(InvalidInputError, match="texts"):
        enc.encode("a cat")
    with pytest.raises(InvalidInputError, match=r"texts\[1\]"):
        enc.encode(["a cat", 3])
    assert enc.encode([]).shape == (0, 384)
    with pytest.raises(ModelLoadError):
        TextEncoder(tmp_path)


def test_the_plain_torch_forward_matches_transformers_bert_model(enc):
    """refsight.embedders.bert runs BertModel's computation without importing transformers (a text search's start-up)."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    from refsight.embedders.minilm import MAX_TOKENS, model_dir

    texts = ["a photo of a cat", "", "Ünïcödé 猫 😀 " * 3, "word " * 400, "a cup of coffee on a saucer"]
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir()), local_files_only=True)
    model = AutoModel.from_pretrained(str(model_dir()), local_files_only=True).eval()
    batch = tokenizer(texts, padding=True, truncation=True, max_length=MAX_TOKENS, return_tensors="pt")
    with torch.inference_mode():
        states = model(**batch).last_hidden_state
    ours = enc.model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    keep = batch["attention_mask"].bool()  # padded positions are never pooled
    torch.testing.assert_close(ours[keep], states[keep], atol=1e-5, rtol=1e-5)
    # and the tokens: the tokenizers library with the recipe's truncation and padding, as AutoTokenizer
    ids = [e.ids for e in enc.tokenizer.encode_batch(texts)]
    assert ids == batch["input_ids"].tolist()
