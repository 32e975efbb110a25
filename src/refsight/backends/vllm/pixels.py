"""Pixel packages and image parts: how ``vllm:`` sends images to a server that runs its own vision encoder.

When the server has a vision encoder (it takes ``image_url`` parts), vLLM encodes every
image on its own hardware and refsight runs no vision tower. What refsight stores for an
image is then its **pixel package** (a ``uint8`` ``[height, width, 3]`` tensor named
``pixels``), under a fingerprint of its own (:func:`pixel_fingerprint`: the served weights'
model, revision and preprocessing, the package kind, ``backend="vllm"``, ``dtype="uint8"``),
so its key names exactly the pixels vLLM will encode and never collides with an HF
embedding package. Two kinds:

- **grid pixels** (Qwen2-VL, Qwen2.5-VL, Qwen3-VL: :func:`encode_pixels`): the image resized
  onto the encoder's patch grid with PIL, with its grid; vLLM's own resize of it is a no-op;
- **source pixels** (every other family: :func:`encode_source_pixels`): the image as refsight
  decoded it (RGB, EXIF orientation applied, alpha on white), not resized. Those families'
  processors resize, crop and tile by their own rules (fixed squares, shortest edge + centre
  crop, any-res tiles, longest edge), in vLLM with torchvision where refsight has PIL: only the
  served processor can say what an image becomes, so vLLM gets the image itself, exactly what
  the all-pixels path gives it. The uuid makes the one processing and encode count.

A request's image parts (:class:`ImageParts`, one per attempt):

- a **reference** (a package of the request's reference prefix, or one the request names in
  ``reference_keys``: the reranker's, whose candidate comes first) travels by ``uuid`` =
  :func:`reference_uuid` of its package key (content + fingerprint + scope: never a name a
  client chose), uuid-only (``"image_url": null``) when this backend already gave the server
  those pixels (:class:`HeldUuids`), its pixels + uuid otherwise; vLLM's caches, and
  refsight's encoder-cache connector behind them (:mod:`.connector`), serve it by that uuid;
  its pixels' PNG is made once (:class:`PixelUrls`), not per request;
- anything else (the candidate) travels as pixels with no uuid: vLLM encodes it, and the
  connector never persists it (only ``refsight-`` uuids are);
- a package holding embeddings (made for a server without a vision encoder) is an
  ``image_embeds`` part, as before (:mod:`.messages`).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from ...errors import CorruptPackageError
from ...inputs.images import ImageInput
from ...package import EncoderFingerprint, VisualPackage
from ..hf.grid import grid_tokens, merge_size, resize_to_grid

__all__ = [
    "UUID_PREFIX", "GRID_PIXELS", "SOURCE_PIXELS", "HeldUuids", "ImageParts", "ImageTokenCounter", "PixelUrls",
    "encode_pixels", "encode_source_pixels", "is_cache_miss", "pixel_fingerprint", "pixel_image", "reference_uuid",
    "validate_pixels", "validate_source_pixels",
]

#: What every uuid refsight gives vLLM starts with: the connector persists only these.
UUID_PREFIX = "refsight-"
#: The tensor of a pixel package.
PIXELS = "pixels"
#: Pixel packages of the Qwen families: the image resized onto its patch grid, as refsight's encoder resizes it.
GRID_PIXELS = "grid_pixels"
#: Pixel packages of every other family: the image as refsight decoded it (RGB, EXIF applied), not resized.
SOURCE_PIXELS = "source_pixels"
#: How many uuids a backend remembers as held by its server (least recently used forgotten).
HELD_LIMIT = 65536
#: Bytes of reference PNG data URLs a backend keeps (a 448² reference is about 0.4 MB).
URL_CACHE_BYTES = 256 * 1024 * 1024


def reference_uuid(package_key: str) -> str:
    """The uuid vLLM knows a reference by: ``refsight-`` + its package key (64 hex digits)."""
    return UUID_PREFIX + package_key


def pixel_fingerprint(encoder: EncoderFingerprint, package: str = GRID_PIXELS) -> EncoderFingerprint:
    """The fingerprint of pixel packages for the served weights: what changes the pixels vLLM encodes.

    ``package``: :data:`GRID_PIXELS` (Qwen) or :data:`SOURCE_PIXELS` (every other family). The
    encoder's preprocessing settings are in it either way: they are the served processor's, and
    the reference uuids (derived from package keys) must change when the features would.
    """
    return EncoderFingerprint(
        backend="vllm",
        model_id=encoder.model_id,
        revision=encoder.revision,
        dtype="uint8",
        preprocessing={"package": package, "encoder": dict(encoder.preprocessing)},
    )


def encode_pixels(encoder: Any, images: Sequence[ImageInput], fingerprint: EncoderFingerprint) -> list[VisualPackage]:
    """Pixel packages of ``images``: each resized onto its grid (PIL, as the HF encoder does), no vision tower."""
    import numpy as np
    import torch

    patch = int(encoder.image_processor.patch_size)
    packages = []
    for image in images:
        began = time.perf_counter()
        resized = resize_to_grid(encoder, image.image).convert("RGB")
        pixels = torch.from_numpy(np.array(resized, dtype=np.uint8))
        height, width = int(pixels.shape[0]), int(pixels.shape[1])
        metadata = {
            "image_grid_thw": [1, height // patch, width // patch],
            "num_tokens": grid_tokens(encoder, *image.image.size),
            "merge_size": merge_size(encoder),
        }
        packages.append(VisualPackage(
            tensors={PIXELS: pixels}, metadata=metadata, image_sha256=image.sha256, fingerprint=fingerprint,
            encode_ms=(time.perf_counter() - began) * 1000,
        ))
    return packages


def encode_source_pixels(
    images: Sequence[ImageInput], fingerprint: EncoderFingerprint, count: "ImageTokenCounter",
) -> list[VisualPackage]:
    """Source-pixel packages: each image's RGB pixels as refsight decoded them (no resize, no vision tower).

    For the families whose processor resizes, crops or tiles by its own rules, the served
    processor is the only one that knows what it will make of an image: vLLM gets the image
    itself, exactly as the all-pixels path would give it, so the two cannot differ. The
    placeholder's token count (``num_tokens``) is the family processor's, from the size alone.
    """
    import numpy as np
    import torch

    packages = []
    for image in images:
        began = time.perf_counter()
        pixels = torch.from_numpy(np.array(image.image.convert("RGB"), dtype=np.uint8))
        metadata = {"size": [int(pixels.shape[1]), int(pixels.shape[0])], "num_tokens": count(image.image.size)}
        packages.append(VisualPackage(
            tensors={PIXELS: pixels}, metadata=metadata, image_sha256=image.sha256, fingerprint=fingerprint,
            encode_ms=(time.perf_counter() - began) * 1000,
        ))
    return packages


def _pixels_shape(package: VisualPackage, fingerprint: EncoderFingerprint) -> tuple[int, int, int]:
    """The checks every pixel package passes (this server's fingerprint, one ``uint8 [h, w, c]`` tensor): its shape."""
    if package.fingerprint != fingerprint:
        raise CorruptPackageError(package.key, "made for another model or preprocessing than this vLLM server's")
    pixels = package.tensors.get(PIXELS)
    if set(package.tensors) != {PIXELS} or pixels is None or str(pixels.dtype) != "torch.uint8" or pixels.dim() != 3:
        raise CorruptPackageError(package.key, "a pixel package holds one uint8 [height, width, 3] tensor 'pixels'")
    height, width, channels = (int(s) for s in pixels.shape)
    return height, width, channels


def validate_source_pixels(package: VisualPackage, fingerprint: EncoderFingerprint) -> None:
    """A source-pixel package's checks: its fingerprint, one ``uint8 [h, w, 3]`` tensor of the size its metadata says."""
    height, width, channels = _pixels_shape(package, fingerprint)
    if channels != 3 or [int(x) for x in package.metadata.get("size") or ()] != [width, height]:
        raise CorruptPackageError(package.key, f"pixels {height}x{width}x{channels} do not match the size {package.metadata.get('size')}")
    tokens = package.metadata.get("num_tokens")
    if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 0:
        raise CorruptPackageError(package.key, f"num_tokens {tokens!r} is not a token count")


class ImageTokenCounter:
    """One image's placeholder in the family's processor, by image size (cached; thread-safe): its image
    tokens (a call) and all its prompt tokens (:meth:`prompt_tokens`, what the prompt limit counts).

    Every family served with source pixels lays an image out from its size alone (resize,
    crop, tiles), so the layout is taken once per size from a blank image of that size: the
    processor's own expansion. (0, 0) for an encoder this cannot ask.
    """

    def __init__(self, encoder: Any, limit: int = 4096) -> None:
        self.encoder = encoder
        self._limit = limit
        self._counts: OrderedDict[tuple[int, int], tuple[int, int]] = OrderedDict()
        self._lock = threading.Lock()

    def __call__(self, size: tuple[int, int]) -> int:
        """The image tokens (those the features replace) of an image of ``size`` = (width, height)."""
        return self._layout(size)[0]

    def prompt_tokens(self, size: tuple[int, int]) -> int:
        """Every prompt token of the placeholder (image tokens and the family's markers around them), as the
        transformers backend counts a package's placeholder."""
        return self._layout(size)[1]

    def _layout(self, size: tuple[int, int]) -> tuple[int, int]:
        key = (int(size[0]), int(size[1]))
        with self._lock:
            if key in self._counts:
                self._counts.move_to_end(key)
                return self._counts[key]
        counts = self._count(key)
        with self._lock:
            self._counts[key] = counts
            while len(self._counts) > self._limit:
                self._counts.popitem(last=False)
        return counts

    def _count(self, size: tuple[int, int]) -> tuple[int, int]:
        from PIL import Image

        encoder = self.encoder
        blank = Image.new("RGB", size)
        processor = getattr(encoder, "processor", None)
        image_token = getattr(encoder, "image_token", None)
        if processor is not None and image_token:  # a transformers family (the generic backend)
            # No special tokens: the expansion of the one image token is the placeholder, nothing else.
            ids = processor(text=[image_token], images=[blank], return_tensors="pt",
                            add_special_tokens=False)["input_ids"][0].tolist()
            marked = encoder.image_token_ids
            return sum(1 for i in ids if i in marked), len(ids)
        return 0, 0


def validate_pixels(package: VisualPackage, fingerprint: EncoderFingerprint, patch: int) -> None:
    """A pixel package's checks: its fingerprint, one ``uint8 [h, w, 3]`` tensor, a grid that matches it."""
    height, width, channels = _pixels_shape(package, fingerprint)
    grid = [int(x) for x in package.metadata.get("image_grid_thw") or ()]
    merge = int(package.metadata.get("merge_size") or 1)
    if channels != 3 or grid != [1, height // patch, width // patch] or height % patch or width % patch:
        raise CorruptPackageError(package.key, f"pixels {height}x{width}x{channels} do not fit the grid {grid}")
    if int(package.metadata.get("num_tokens", -1)) != grid[1] * grid[2] // merge**2:
        raise CorruptPackageError(package.key, "num_tokens does not match the grid")


def pixel_image(package: VisualPackage) -> Any:
    """The PIL image of a pixel package (the exact pixels stored)."""
    from PIL import Image

    return Image.fromarray(package.tensors[PIXELS].numpy(), mode="RGB")


def is_cache_miss(message: str) -> bool:
    """Whether vLLM refused a uuid-only part it does not hold (HTTP 400 ``Cache miss for image ...``)."""
    return "Cache miss for" in message


class HeldUuids:
    """The uuids this backend's server was given pixels for (bounded, least recently used forgotten; thread-safe)."""

    def __init__(self, limit: int = HELD_LIMIT) -> None:
        self._limit = limit
        self._uuids: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.Lock()

    def __contains__(self, uuid: object) -> bool:
        with self._lock:
            return uuid in self._uuids

    def add(self, uuids: Iterable[str]) -> None:
        """Note ``uuids`` as held (most recently used)."""
        with self._lock:
            for uuid in uuids:
                self._uuids[uuid] = None
                self._uuids.move_to_end(uuid)
            while len(self._uuids) > self._limit:
                self._uuids.popitem(last=False)

    def forget(self, uuids: Iterable[str]) -> None:
        """The server said it no longer holds ``uuids``."""
        with self._lock:
            for uuid in uuids:
                self._uuids.pop(uuid, None)


class PixelUrls:
    """Each reference package's PNG data URL, made once (bounded in bytes, least recently used forgotten; thread-safe).

    A reference travels with its pixels the first time, on every request to a server that
    keeps nothing by uuid, and after a "Cache miss": encoding its PNG each time cost more
    than vLLM's own processing of it.
    """

    def __init__(self, max_bytes: int = URL_CACHE_BYTES) -> None:
        self.max_bytes = max_bytes
        self._urls: OrderedDict[str, str] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, package: VisualPackage) -> str:
        """The data URL of ``package``'s pixels."""
        from .messages import png_data_url

        with self._lock:
            url = self._urls.get(package.key)
            if url is not None:
                self._urls.move_to_end(package.key)
                return url
        url = png_data_url(pixel_image(package))  # outside the lock: other requests go on meanwhile
        with self._lock:
            if package.key not in self._urls and len(url) <= self.max_bytes:
                self._urls[package.key] = url
                self._bytes += len(url)
                while self._bytes > self.max_bytes:
                    _, dropped = self._urls.popitem(last=False)
                    self._bytes -= len(dropped)
        return url


@dataclass
class ImageParts:
    """The image parts of one attempt at one request (a callable: segment -> OpenAI content part).

    ``references``: the package keys of the request's references (sent by uuid); ``urls``:
    their pixels' data URLs; ``held``: what the server is expected to hold; ``resend``: pixels for every reference
    (the retry after a "Cache miss"). After the attempt, :attr:`uuid_only` and :attr:`sent`
    say which uuids went without and with pixels.
    """

    encoder: Any
    references: frozenset[str]
    held: HeldUuids
    urls: PixelUrls
    resend: bool = False
    #: A fresh image is resized onto the encoder's grid first (Qwen); else sent as decoded.
    to_grid: bool = True
    uuid_only: list[str] = field(default_factory=list)
    sent: list[str] = field(default_factory=list)

    def __call__(self, segment: Any) -> dict[str, Any]:
        """The content part of one image segment (a package or a fresh image)."""
        from .messages import embeds_part, png_data_url

        if isinstance(segment, ImageInput):
            image = resize_to_grid(self.encoder, segment.image) if self.to_grid else segment.image
            return {"type": "image_url", "image_url": {"url": png_data_url(image)}}
        if PIXELS not in segment.tensors:
            return embeds_part(segment, self.encoder)
        if segment.key not in self.references:
            return {"type": "image_url", "image_url": {"url": png_data_url(pixel_image(segment))}}
        uuid = reference_uuid(segment.key)
        if not self.resend and uuid in self.held:
            self.uuid_only.append(uuid)
            return {"type": "image_url", "image_url": None, "uuid": uuid}
        self.sent.append(uuid)
        return {"type": "image_url", "image_url": {"url": self.urls.get(segment)}, "uuid": uuid}

    def succeeded(self) -> None:
        """The server answered: every uuid of this attempt is now held."""
        self.held.add([*self.uuid_only, *self.sent])
