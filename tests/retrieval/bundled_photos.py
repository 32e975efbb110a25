"""The nine bundled real photos, for the retrieval tests (a uniquely named module: see tests/image_corpus.py)."""

from __future__ import annotations

import functools

import numpy as np
from PIL import Image

from refsight.images import ImageInput, load_image


#: The real photos shipped with scikit-image, scikit-learn and matplotlib (no download).
BUNDLED = ("chelsea", "astronaut", "coffee", "rocket", "motorcycle_left", "horse", "china", "flower", "grace_hopper")


def photo_array(name: str) -> np.ndarray:
    import skimage.data

    if name == "motorcycle_left":
        return skimage.data.stereo_motorcycle()[0]
    if name == "motorcycle_right":
        return skimage.data.stereo_motorcycle()[1]
    if name in ("china", "flower"):
        from sklearn.datasets import load_sample_image

        return load_sample_image(f"{name}.jpg")
    if name == "grace_hopper":
        import matplotlib.cbook

        with matplotlib.cbook.get_sample_data("grace_hopper.jpg") as f:
            return np.asarray(Image.open(f).convert("RGB"))
    arr = getattr(skimage.data, name)()
    if arr.dtype == bool:  # the horse is a binary silhouette
        arr = (~arr * 255).astype(np.uint8) if False else (arr * 255).astype(np.uint8)
    return arr


@functools.cache
def bundled_photo(name: str) -> ImageInput:
    """One bundled photo as an ImageInput (cached: decoding is the slow part)."""
    return load_image(Image.fromarray(photo_array(name)).convert("RGB"), name=name)
