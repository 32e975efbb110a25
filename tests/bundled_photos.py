"""The bundled real photos, for the retrieval tests (a uniquely named module: see tests/image_corpus.py)."""

from __future__ import annotations

import functools

import numpy as np

from refsight.inputs.images import ImageInput, load_image
from refsight.samples import SAMPLE_NAMES, load_sample

#: The real photos shipped as refsight package data (``refsight.samples``).
BUNDLED = SAMPLE_NAMES


def photo_array(name: str) -> np.ndarray:
    """One bundled photo as an RGB uint8 array."""
    return np.asarray(load_sample(name))


@functools.cache
def bundled_photo(name: str) -> ImageInput:
    """One bundled photo as an ImageInput (cached: decoding is the slow part)."""
    return load_image(load_sample(name), name=name)
