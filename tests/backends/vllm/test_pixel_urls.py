"""A reference's PNG data URL is made once and is exactly its pixels (no vLLM needed)."""

from __future__ import annotations

import base64
import io

import numpy as np
import torch
from PIL import Image

from refsight.backends.vllm.pixels import PIXELS, PixelUrls
from refsight.package import EncoderFingerprint, VisualPackage

FINGERPRINT = EncoderFingerprint(backend="vllm", model_id="m", revision="r", dtype="uint8", preprocessing={})


def _package(seed: int, side: int = 56) -> VisualPackage:
    pixels = np.random.default_rng(seed).integers(0, 256, (side, side, 3), dtype=np.uint8)
    return VisualPackage(tensors={PIXELS: torch.from_numpy(pixels)}, metadata={}, image_sha256=f"{seed:064x}",
                         fingerprint=FINGERPRINT)


def _decoded(url: str) -> np.ndarray:
    assert url.startswith("data:image/png;base64,")
    return np.array(Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))))


def test_a_reference_url_is_made_once_and_holds_exactly_its_pixels():
    urls = PixelUrls()
    package = _package(1)
    first = urls.get(package)
    assert urls.get(package) is first  # the same string: no second PNG encode
    assert np.array_equal(_decoded(first), package.tensors[PIXELS].numpy())  # lossless


def test_the_cache_stays_within_its_bytes_forgetting_the_least_recently_used():
    packages = [_package(seed) for seed in range(4)]
    one = len(PixelUrls().get(packages[0]))
    urls = PixelUrls(max_bytes=int(one * 2.5))
    kept = [urls.get(p) for p in packages[:2]]
    urls.get(packages[0])  # used again: the older one is now packages[1]
    urls.get(packages[2])
    assert urls.get(packages[0]) is kept[0]
    assert urls.get(packages[1]) is not kept[1]  # forgotten, made again (equal text)
    assert urls.get(packages[1]) == kept[1]
