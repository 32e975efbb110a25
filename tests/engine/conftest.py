"""Fixtures for engine-level tests: a pixel embedder (the model cache is the session's, from tests/conftest.py)."""

from __future__ import annotations


import pytest
from fake_pipeline import PixelEmbedder


@pytest.fixture
def pixel_embedder() -> PixelEmbedder:
    return PixelEmbedder()
