"""Instruction-aware VLM embeddings by last-token pooling (``vlm:MODEL`` in the registry).

``refsight.backends`` (and with it torch) is imported only when a backend is named by string.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from refsight.errors import InvalidInputError, ModelLoadError
from refsight.inputs.images import ImageInput
from refsight.embedders._errors import embedder_errors
from refsight.embedders.base import Embedder

__all__ = ["VlmEmbedder", "load_vlm"]



class VlmEmbedder(Embedder):
    """Last-token pooling of a VLM's final hidden state over an instruction plus image or text.

    The recipe of VLM2Vec and Qwen3-VL-Embedding: the decoder reads the chat-formatted
    ``<instruction> <image or text>`` and the final-layer hidden state of the last prompt token
    is the embedding. Works with any transformers backend of :mod:`refsight.backends.hf`
    (it uses only their public prompt/encode methods): images go through ``backend.encode``,
    and :meth:`embed_packages` takes already cached visual packages, so a reference's vision
    tower output is reused instead of re-encoding the image. A backend may instead provide its
    own ``embed_last_token(items, instruction)`` and ``embedding_dim``.

    ``refsight.backends`` is imported only when a backend is named by string.
    """

    default_instruction = "Represent the given image for retrieving similar images."
    default_text_instruction = "Find an image that matches the given text."
    #: An input of text and images is read in one pass, as the recipe reads a query.
    joint = True

    def __init__(self, backend: Any, *, instruction: str | None = None):
        if isinstance(backend, str):
            from refsight.backends import get_backend

            with embedder_errors(backend, ModelLoadError, "cannot load the VLM"):
                backend = get_backend(backend)
        self._custom = callable(getattr(backend, "embed_last_token", None))
        generic = all(hasattr(backend, a) for a in ("encode", "build_prompt", "multimodal_inputs", "model", "tokenizer"))
        if not (self._custom or generic):
            raise ModelLoadError(getattr(backend, "name", str(backend)),
                                 "backend has neither embed_last_token() nor the transformers prompt methods; it cannot embed")
        self.backend = backend
        self.name = f"vlm:{backend.name}"
        self.image_instruction = instruction or self.default_instruction
        if self._custom:
            self._dim = int(backend.embedding_dim)
        else:
            cfg = backend.model.config
            self._dim = int(getattr(getattr(cfg, "text_config", cfg), "hidden_size"))
        self.batch_size = 4
        self.random_weights = bool(getattr(backend, "random_weights", False))

    @property
    def dim(self) -> int:
        """The language model's hidden size."""
        return self._dim

    def fingerprint(self) -> dict[str, Any]:
        """The backend's encoder fingerprint plus the pooling recipe and image instruction."""
        fp = self.backend.fingerprint()
        return {
            "embedder": "vlm-last-token/v1",
            "backend": fp.to_dict() if hasattr(fp, "to_dict") else fp,
            "image_instruction": self.image_instruction,
        }

    def text_tokens(self, text: str) -> list[int] | None:
        """The VLM's token ids of ``text`` (the backend's tokenizer); None for a backend that embeds by itself."""
        tokenize = getattr(self.backend, "tokenize", None)
        return None if self._custom or tokenize is None else tokenize(text, add_special=False, parse_special=False)

    def token_text(self, tokens: Sequence[int]) -> str:
        """The text of ``tokens`` in the VLM's vocabulary."""
        if self._custom or not hasattr(self.backend, "detokenize"):
            return super().token_text(tokens)
        size = len(self.backend.tokenizer)
        if any(not 0 <= t < size for t in tokens):
            raise InvalidInputError("input", f"a token id outside the vocabulary of {size} ({self.name}'s)")
        return self.backend.detokenize(list(tokens))

    def embed_rows(self, rows: Sequence[Sequence[Any]]) -> np.ndarray:
        """Unit vectors of inputs read whole: each row its texts and images (packages, or pixels encoded now) in
        order, after the image instruction (an input that holds an image is read as the recipe reads an image)."""
        if self._custom:
            raise ModelLoadError(self.name, "this backend embeds images itself; send each image alone")
        with embedder_errors(self.name, what="embed inputs"):
            rows = [[self.backend.encode([p])[0] if isinstance(p, ImageInput) else p for p in row] for row in rows]
            return self._batched(rows, lambda chunk: self._pool([[self.image_instruction, *row] for row in chunk]))

    def embed_packages(self, packages: Sequence[Any]) -> np.ndarray:
        """Unit vectors for references from their cached visual packages (no vision tower run)."""
        packages = list(packages)
        if self._custom:
            raise ModelLoadError(self.name, "this backend embeds images itself; pass images instead")
        with embedder_errors(self.name, what="embed packages"):
            return self._batched(packages, lambda chunk: self._pool([[self.image_instruction, p] for p in chunk]))

    def _embed_images(self, images: list[ImageInput]) -> np.ndarray:
        with embedder_errors(self.name, what="embed images"):
            if self._custom:
                return np.asarray(self.backend.embed_last_token(images, self.image_instruction), np.float32)
            return self._pool([[self.image_instruction, p] for p in self.backend.encode(images)])

    def _embed_texts(self, texts: list[str], instruction: str | None) -> np.ndarray:
        instruction = instruction or self.default_text_instruction
        with embedder_errors(self.name, what="embed texts"):
            if self._custom:
                return np.asarray(self.backend.embed_last_token(texts, instruction), np.float32)
            return self._pool([[instruction, t] for t in texts])

    def _pool(self, rows: list[list[Any]]) -> np.ndarray:
        import torch

        b = self.backend
        texts = [b.build_prompt(row) for row in rows]
        packages = [seg for row in rows for seg in row if not isinstance(seg, str)]
        # left padding (the backends set it) puts every row's last prompt token at position -1
        b.tokenizer.padding_side = "left"
        enc = b.tokenizer(texts, padding=True, return_tensors="pt", add_special_tokens=False)
        extra = b.multimodal_inputs(packages, enc["input_ids"]) if packages else {}
        with torch.inference_mode():
            out = b.model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"], **extra,
                          output_hidden_states=True, use_cache=False)
        return out.hidden_states[-1][:, -1, :].float().numpy()


def load_vlm(name: str) -> VlmEmbedder:
    """Registry factory for ``vlm:MODEL``: last-token pooling over the backend named ``MODEL``."""
    return VlmEmbedder(name.partition(":")[2])
