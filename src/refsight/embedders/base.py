"""The embedder interface: images and texts → unit vectors in one space, so text can find images.

Retrieval needs only this interface; the implementations (ConSE, CLIP/SigLIP, VLM pooling)
live in :mod:`refsight.embedders` and are named through :func:`refsight.embedders.get_embedder`.

Every embedder has a fingerprint (model, revision, preprocessing) and a ``digest`` of it;
cached vectors and indexes are keyed by that digest, so changing anything that changes the
vectors gives a fresh cache rather than silently mixing spaces. Outputs are always
L2-normalised float32 ``[n, dim]``.
"""

from __future__ import annotations

import abc
import functools
import hashlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from refsight.errors import InvalidInputError, ModelLoadError
from refsight.inputs.images import ImageInput
from refsight.package import canonical_json

__all__ = ["Embedder", "l2_normalise"]


class Embedder(abc.ABC):
    """Maps images and texts into one vector space; subclasses implement the two ``_embed_*``."""

    #: short human-readable name, reported by search results
    name: str = "embedder"
    #: vectors per model call
    batch_size: int = 16
    #: The leading dimensions at which a vector, cut there and renormalised, keeps its meaning (the Matryoshka
    #: property; OpenAI's ``dimensions``): empty, only the whole vector.
    truncations: tuple[int, ...] = ()
    #: Most tokens of a text the model reads (it cuts the rest); None: no bound of its own.
    max_tokens: int | None = None
    #: True: an input of several parts (texts and images) is read in one pass (a VLM reading them together);
    #: False: it is the normalised sum of its text's vector and each image's.
    joint: bool = False
    #: Whether the weights are random (the vectors carry no meaning: tests and offline demos).
    random_weights: bool = False

    @property
    @abc.abstractmethod
    def dim(self) -> int:
        """Dimension of every vector this embedder returns."""

    @abc.abstractmethod
    def fingerprint(self) -> dict[str, Any]:
        """Everything that changes the vectors: model, revision/weights hash, preprocessing."""

    @functools.cached_property
    def digest(self) -> str:
        """Stable short hash of :meth:`fingerprint`; names the cache rows and index folders."""
        return hashlib.sha256(canonical_json(self.fingerprint()).encode()).hexdigest()[:24]

    @abc.abstractmethod
    def _embed_images(self, images: list[ImageInput]) -> np.ndarray:
        """Embed one batch of images (not necessarily normalised)."""

    @abc.abstractmethod
    def _embed_texts(self, texts: list[str], instruction: str | None) -> np.ndarray:
        """Embed one batch of texts (not necessarily normalised)."""

    def text_tokens(self, text: str) -> list[int] | None:
        """The token ids the model reads for ``text`` (its special tokens included); None: it cannot say."""
        return None

    def token_text(self, tokens: Sequence[int]) -> str:
        """The text of ``tokens`` in the model's vocabulary (its special tokens left out), for inputs sent as ids."""
        raise InvalidInputError("input", f"{self.name} reads no token ids; send the text")

    def embed_images(self, images: Sequence[ImageInput]) -> np.ndarray:
        """Unit float32 vectors [n, dim] for reference or query images."""
        if isinstance(images, ImageInput):
            raise InvalidInputError("images", "expected a list of ImageInput, got a single image")
        images = list(images)
        for i, im in enumerate(images):
            if not isinstance(im, ImageInput):
                raise InvalidInputError(f"images[{i}]", f"expected an ImageInput (use refsight.inputs.images.load_image), got {type(im).__name__}")
        return self._batched(images, self._embed_images)

    def embed_texts(self, texts: Sequence[str], instruction: str | None = None) -> np.ndarray:
        """Unit float32 vectors [n, dim] for text queries; ``instruction`` is used where the model supports it."""
        if isinstance(texts, str):
            raise InvalidInputError("texts", "expected a list of strings, got a single string")
        texts = list(texts)
        for i, t in enumerate(texts):
            if not isinstance(t, str) or not t.strip():
                raise InvalidInputError(f"texts[{i}]", "a text query must be a non-empty string")
        if instruction is not None and not isinstance(instruction, str):
            raise InvalidInputError("instruction", f"must be a string or None, got {type(instruction).__name__}")
        return self._batched(texts, lambda chunk: self._embed_texts(chunk, instruction))

    def _batched(self, items: list, fn) -> np.ndarray:
        if not items:
            return np.zeros((0, self.dim), np.float32)
        parts = [np.asarray(fn(items[s : s + self.batch_size]), np.float32) for s in range(0, len(items), self.batch_size)]
        out = np.concatenate(parts)
        if out.shape != (len(items), self.dim):
            raise ModelLoadError(self.name, f"produced shape {out.shape}, expected {(len(items), self.dim)}")
        return l2_normalise(out)


def l2_normalise(x: np.ndarray) -> np.ndarray:
    """Rows of ``x`` scaled to unit length, as float32 (an all-zero row stays zero)."""
    # epsilon: an all-zero vector stays zero instead of becoming NaN
    return (x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)).astype(np.float32)
