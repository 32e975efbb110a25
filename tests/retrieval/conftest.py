"""Fixtures for retrieval tests: the bundled real photos as ImageInput, and a temp store root."""

from __future__ import annotations

import pytest

from bundled_photos import BUNDLED, bundled_photo  # noqa: F401  (re-exported for fixtures)
from refsight.inputs.images import ImageInput


@pytest.fixture(scope="session")
def photos() -> dict[str, ImageInput]:
    """All bundled photos by name."""
    return {n: bundled_photo(n) for n in BUNDLED}
