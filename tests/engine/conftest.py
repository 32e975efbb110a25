"""Fixtures for engine-level tests: a pixel embedder (the model cache is the session's, from tests/conftest.py)."""

from __future__ import annotations


import numpy as np
import pytest

from refsight.retrieval import Embedder


class PixelEmbedder(Embedder):
    """A 4x4 thumbnail as the vector: cheap and deterministic, for orchestration tests only."""

    name = "pixels-4x4"

    @property
    def dim(self) -> int:
        return 48

    def fingerprint(self) -> dict:
        return {"model": "pixels-4x4", "revision": "1"}

    def _embed_images(self, images):
        return np.stack([np.asarray(i.image.resize((4, 4)), np.float32).reshape(-1) + 1.0 for i in images])

    def _embed_texts(self, texts, instruction):
        # No text side: a zero vector, so a "both" recall query ranks by the image alone.
        return np.zeros((len(texts), self.dim), np.float32)


@pytest.fixture
def pixel_embedder() -> PixelEmbedder:
    return PixelEmbedder()
