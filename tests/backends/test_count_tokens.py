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


def test_a_text_counted_again_is_remembered_and_a_long_one_is_not(load, monkeypatch):
    """The server's prompt limit and the engine's prompt budget count a request's text twice: once is enough."""
    from refsight.backends.hf import base

    backend = load("tiny-qwen2-vl")
    calls = []
    tokenizer = backend.tokenizer

    def counting(text, **kwargs):
        calls.append(text)
        return tokenizer(text, **kwargs)

    monkeypatch.setattr(backend, "tokenizer", counting)
    monkeypatch.delitem(backend.__dict__, "_remembered_counts", raising=False)  # a fresh memory (tests share it)
    text = "Same colour? A remembered prompt."
    assert backend.count_text_tokens(text) == backend.count_text_tokens(text) and calls == [text]
    long = "x " * (base.COUNTED_TEXT_CHARS // 2 + 1)
    assert backend.count_text_tokens(long) == backend.count_text_tokens(long) and calls == [text, long, long]


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
