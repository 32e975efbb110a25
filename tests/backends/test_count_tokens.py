"""Backend.count_text_tokens (issue 18 row 5): the HF backends count with their own tokenizer."""

from __future__ import annotations

import pytest
from runtimes import require_module

from refsight.backends.toy import ToyBackend


@pytest.mark.parametrize("name", ["tiny-qwen2-vl", "tiny-smolvlm"])
def test_hf_backends_count_exactly_with_their_tokenizer(load, name):
    backend = load(name)
    text = "Compare the candidate image with the reference images. Ünïcödé too: 猫"
    expected = len(backend.tokenizer(text, add_special_tokens=False)["input_ids"])
    assert backend.count_text_tokens(text) == expected > 0
    assert backend.count_text_tokens("") == 0
    # Linear in the text: a prompt ten times longer counts about ten times the tokens.
    assert backend.count_text_tokens((text + " ") * 10) >= 9 * expected


def test_the_default_is_a_cheap_estimate():
    toy = ToyBackend("toy")
    assert toy.count_text_tokens("") == 0
    assert toy.count_text_tokens("abcd") == 1 and toy.count_text_tokens("abcde") == 2
    assert toy.count_text_tokens("猫" * 4) == 3  # UTF-8 bytes, not characters


@pytest.mark.slow  # converts the tiny models to GGUF (llama-cpp-python: an optional runtime)
@pytest.mark.parametrize("name", ["tiny-qwen2-vl-gguf", "tiny-smolvlm-gguf"])
def test_the_llamacpp_backend_counts_with_its_vocabulary(name):
    require_module("llama_cpp", "pip install 'refsight[llamacpp]'")
    from refsight.backends.registry import get_backend

    backend = get_backend(name)
    text = "Compare the candidate image with the reference images."
    assert backend.count_text_tokens(text) == len(backend.runtime.tokenize(text, False)) > 0
    assert backend.count_text_tokens("") == 0
