"""Fixtures for the transformers backends: a private model cache, tiny models, real photos.

``REFSIGHT_MODEL_CACHE`` points at a session temp dir (set before any model is
built, inherited by the subprocesses the tests start), so tests never touch the
user's cache. Each tiny model is built and loaded once per session.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from backend_models import TINY_FAMILIES  # noqa: F401  (re-exported)

#: Real photos from scikit-image and the (width, height) each is shrunk to; the
#: sizes differ so grids, tile layouts and prompt lengths differ between images.
PHOTO_SIZES = {"chelsea": (96, 72), "coffee": (88, 64), "astronaut": (80, 80), "rocket": (64, 96)}


@pytest.fixture(scope="session", autouse=True)
def model_cache():
    """A session-private ``REFSIGHT_MODEL_CACHE`` (subprocesses inherit it).

    Not under pytest's basetemp: a concurrent pytest run prunes old basetemp
    directories, which would pull the models out from under this session.
    """
    with tempfile.TemporaryDirectory(prefix="refsight-models-") as path, pytest.MonkeyPatch.context() as mp:
        mp.setenv("REFSIGHT_MODEL_CACHE", path)
        yield Path(path)


@pytest.fixture(scope="session")
def photos():
    """name -> ImageInput of a small real photo."""
    from skimage import data

    from refsight.images import load_image

    out = {}
    for name, size in PHOTO_SIZES.items():
        array = np.asarray(getattr(data, name)())
        out[name] = load_image(Image.fromarray(array).convert("RGB").resize(size, Image.BICUBIC), name=name)
    return out


_loaded: dict[tuple, object] = {}


def tiny(name: str, **options):
    """The tiny backend ``name`` with ``options``, loaded once per session."""
    from refsight.backends.tiny import load_tiny

    # Options may hold mappings (processor_kwargs): key by their JSON text.
    key = (name, json.dumps(options, sort_keys=True))
    if key not in _loaded:
        _loaded[key] = load_tiny(name, **options)
    return _loaded[key]


@pytest.fixture(scope="session")
def load():
    """``load(name, **options)`` -> a session-cached tiny backend."""
    return tiny
