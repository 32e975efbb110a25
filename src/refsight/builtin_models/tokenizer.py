"""Small tokenizers trained in-process for the built-in random-weight models.

No tokenizer can be downloaded here, so the tiny models carry a byte-level BPE
trained on a fixed English corpus with the ``tokenizers`` library (the demo's
``shape-smolvlm-256m`` a larger vocabulary, :mod:`.shape_vocab`), plus the
special tokens of the model family (``<|image_pad|>``, ``<image>``, ``<row_1_col_1>``
...). Training is deterministic: the same corpus and vocabulary size give the same
``tokenizer.json``, so two builds of a tiny model have the same tokens.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from .shape_vocab import Vocabulary

__all__ = ["QWEN_SPECIAL_TOKENS", "smolvlm_special_tokens", "train_tokenizer"]

#: Qwen2-VL / Qwen2.5-VL / Qwen3-VL special tokens, in the order of their real vocabularies.
QWEN_SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
)


def smolvlm_special_tokens(max_rows: int = 6, max_cols: int = 6) -> tuple[str, ...]:
    """SmolVLM's special tokens, including one ``<row_i_col_j>`` per possible tile."""
    tiles = tuple(f"<row_{r}_col_{c}>" for r in range(1, max_rows + 1) for c in range(1, max_cols + 1))
    return (
        "<|endoftext|>",
        "<|im_start|>",
        "<end_of_utterance>",
        "<fake_token_around_image>",
        "<image>",
        "<global-img>",
        *tiles,
    )


# A fixed corpus: enough words for the BPE to learn merges of everyday English and JSON.
_CORPUS = """
The reference image shows a tabby cat sitting on a wooden chair near the window.
Compare the candidate image with the reference images and answer each criterion.
Is the product the same colour? Does the label match? Are there scratches, dents or stains?
A cup of coffee on a saucer, a rocket on the launch pad, an astronaut in a white suit.
{"criterion": "colour", "verdict": "pass", "confidence": 0.9, "reason": "same colour"}
{"criterion": "shape", "verdict": "fail", "confidence": 0.4, "reason": "different shape"}
true false null yes no pass fail unsure match mismatch same different similar
Describe the image. What is in the picture? How many objects are there? Which one is larger?
The quick brown fox jumps over the lazy dog. 0 1 2 3 4 5 6 7 8 9 10 100 1000
User: Assistant: system user assistant You are a helpful assistant.
"""


def train_tokenizer(
    special_tokens: Sequence[str],
    *,
    vocab_size: int = 512,
    eos_token: str,
    pad_token: str,
    bos_token: str | None = None,
    chat_template: str | None = None,
    vocabulary: Vocabulary | None = None,
):
    """Train a byte-level BPE on the fixed corpus and wrap it as a transformers tokenizer.

    Special tokens come first in the vocabulary (ids 0..n-1) so their ids are stable
    whatever the corpus learns. ``vocabulary`` (the ``shape-*`` models', see
    :mod:`.shape_vocab`) replaces the fixed corpus and ``vocab_size``. Returns a
    ``PreTrainedTokenizerFast`` ready for ``save_pretrained``.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    # A vocabulary's merges cross words (no pre-split); the tiny models' corpus keeps GPT-2's word split.
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=vocabulary is None)
    tokenizer.decoder = decoders.ByteLevel()
    limits = {} if vocabulary is None else {"max_token_length": vocabulary.max_token_length}
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size if vocabulary is None else vocabulary.size,
        special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
        **limits,
    )
    corpus = _CORPUS if vocabulary is None else vocabulary.corpus
    lines = [line for line in corpus.splitlines() if line.strip()]
    # Repeat the corpus so every merge the vocabulary allows is learned the same way each time.
    tokenizer.train_from_iterator(lines * 4, trainer=trainer)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token=eos_token,
        pad_token=pad_token,
        bos_token=bos_token,
        additional_special_tokens=[t for t in special_tokens if t not in {eos_token, pad_token, bos_token}],
    )
    if chat_template is not None:
        wrapped.chat_template = chat_template
    return wrapped
