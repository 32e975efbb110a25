"""Fixtures for the judge tests: real photos, a byte-level BPE trained here, a tiny random LM,
and a scripted fake backend (for orchestration only: what it answers is the test's input).
"""

from __future__ import annotations


import pytest

EOS = "<|endoftext|>"
PAD = "<|pad|>"


@pytest.fixture(scope="module")
def one_thread():
    """Run torch on one thread: the host is shared, and tiny models gain nothing from more."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def byte_tokenizer():
    """A byte-level BPE ``PreTrainedTokenizerFast`` trained in-process (ids 0, 1 = eos, pad)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=420,
        special_tokens=[EOS, PAD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = [
        '{"criteria": [{"criterion": "is a cat", "verdict": "match", "confidence": 0.75, "evidence": "same fur"}]}',
        "the cat has orange fur, pointed ears and white paws; uncertain mismatch",
        "Judge the candidate against the reference image under these criteria.",
    ]
    tokenizer.train_from_iterator(corpus * 5, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=EOS, pad_token=PAD)


@pytest.fixture(scope="session")
def tiny_lm(byte_tokenizer):
    """A tiny Qwen2 causal LM with random weights (seeded); its logits are wider than the vocabulary."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=len(byte_tokenizer) + 12,  # padded like real checkpoints: ids the tokenizer never uses
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=8192,
        eos_token_id=byte_tokenizer.eos_token_id,
        pad_token_id=byte_tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    return Qwen2ForCausalLM(config).eval()
