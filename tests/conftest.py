"""Shared fixtures: small real photos and the corpus of bad image files (see image_corpus.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest
from PIL import Image

from image_corpus import build_bad_image_corpus, load_photo


@pytest.fixture
def real_photo() -> Callable[..., Image.Image]:
    """Factory: ``real_photo("coffee", size=(64, 48))`` returns a small real RGB photo."""
    return load_photo


@pytest.fixture
def bad_image_corpus(tmp_path: Path) -> dict[str, Path]:
    """:func:`build_bad_image_corpus` written into a fresh temporary directory."""
    return build_bad_image_corpus(tmp_path / "corpus")
