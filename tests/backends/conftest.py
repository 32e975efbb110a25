"""Fixtures for the transformers backends: real photos at several sizes.

The session's model cache and the ``load`` fixture (each tiny model built and loaded once
per session) come from ``tests/conftest.py``.
"""

from __future__ import annotations

import pytest

from backend_models import TINY_FAMILIES  # noqa: F401  (re-exported)

#: Bundled real photos (refsight.samples) and the (width, height) each is shrunk to; the
#: sizes differ so grids, tile layouts and prompt lengths differ between images.
PHOTO_SIZES = {"chelsea": (96, 72), "coffee": (88, 64), "astronaut": (80, 80), "rocket": (64, 96)}


@pytest.fixture(scope="session")
def photos():
    """name -> ImageInput of a small real photo."""
    from refsight.inputs.images import load_image
    from refsight.samples import load_sample

    out = {}
    for name, size in PHOTO_SIZES.items():
        out[name] = load_image(load_sample(name, size), name=name)
    return out
