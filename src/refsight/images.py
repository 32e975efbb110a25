"""Image intake: decode, validate, normalise and hash what the encoder will see.

Accepts a path, raw bytes or a PIL image. The result, :class:`ImageInput`, is an
orientation-corrected 8-bit RGB image and its content hash. Documented behaviour:

- EXIF orientation is applied, then dropped.
- Alpha (RGBA, LA, palette with transparency) is composited onto white.
- CMYK, greyscale, 1-bit and palette images become RGB; 16-bit images are
  scaled to 8 bits (not clipped).
- Animated images (GIF, WebP, APNG) use their first frame.
- Empty, truncated or non-image data, formats outside :data:`SUPPORTED_FORMATS`,
  and images over ``max_pixels`` (decompression bombs included, checked from the
  header before any pixels are decoded) raise :class:`~refsight.errors.ImageError`.

The content hash is sha256 over the width, height and RGB pixels, i.e. what the
encoder actually sees: a PNG and a lossless re-save of it (BMP, TIFF, WebP
lossless) share a hash, while the original bytes are still kept for the store.
"""

from __future__ import annotations

import hashlib
import io
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Union

from PIL import Image, ImageOps

from .errors import ImageError
from .inputs.reading import FileReadError, read_regular_file

__all__ = ["ImageInput", "IntakeLimits", "SUPPORTED_FORMATS", "load_image", "pixel_hash", "ImageSource"]

#: Pillow format names refsight decodes; anything else (PDF, EPS, ...) is refused.
SUPPORTED_FORMATS = ("JPEG", "PNG", "GIF", "WEBP", "BMP", "TIFF", "MPO")
# What we hand to ``Image.open(formats=...)``. MPO has no opener of its own (the JPEG
# plugin returns an MpoImageFile), and naming it there makes Pillow raise KeyError
# for every input that is not a JPEG.
_OPEN_FORMATS = tuple(f for f in SUPPORTED_FORMATS if f != "MPO")
# Signatures of the supported formats: data that starts like one of them but cannot
# be opened is truncated or corrupt, not "some other format". (BMP's "BM" is left
# out: it is too common a start of plain text.)
_MAGIC = (
    (b"\xff\xd8", "JPEG"),
    (b"\x89PNG\r\n\x1a\n", "PNG"),
    (b"GIF87a", "GIF"),
    (b"GIF89a", "GIF"),
    (b"II*\x00", "TIFF"),
    (b"MM\x00*", "TIFF"),
)

ImageSource = Union[str, os.PathLike, bytes, bytearray, memoryview, Image.Image, "ImageInput"]


@dataclass(frozen=True)
class IntakeLimits:
    """Limits checked before decoding; tune them per deployment.

    Pillow refuses images over twice ``PIL.Image.MAX_IMAGE_PIXELS`` (about 179 M
    pixels by default) on its own, so a ``max_pixels`` above that has no effect.
    """

    max_pixels: int = 50_000_000
    max_bytes: int = 64 * 1024 * 1024
    #: Longest side over shortest: VLM image processors refuse more (Qwen's, SmolVLM's: 200), and
    #: the refusal must come here, as a bad image, before any model work.
    max_aspect_ratio: float = 200.0


@dataclass(frozen=True, eq=False)
class ImageInput:
    """A decoded, validated, orientation-normalised RGB image and its content hash.

    The decoded pixels can be dropped once they are encoded (:meth:`release`): a request naming many
    large images then holds one decoded image at a time, not all of them (issue 38). :attr:`image`
    decodes the kept source bytes again when asked after that, the same pixels (the same hash).
    """

    sha256: str
    size: tuple[int, int]
    source_bytes: bytes = field(repr=False, default=b"")
    source_format: str | None = None
    name: str | None = None
    #: The decoded pixels while they are held (None once released); read :attr:`image`.
    pixels: Image.Image | None = field(repr=False, default=None)

    @property
    def image(self) -> Image.Image:
        """The RGB pixels, decoded again from the source bytes if they were released."""
        pixels = self.pixels
        if pixels is None:
            label = self.name or f"<{len(self.source_bytes)} bytes>"
            width, height = self.size
            # These bytes passed every limit once; only their own size is allowed now.
            limits = IntakeLimits(max_pixels=width * height, max_bytes=len(self.source_bytes),
                                  max_aspect_ratio=float("inf"))
            pixels = _normalise(label, _open_pixels(self.source_bytes, label, limits)[0])
            object.__setattr__(self, "pixels", pixels)  # frozen for callers; the cache of the pixels is ours
        return pixels

    def release(self) -> None:
        """Drop the decoded pixels (kept as the source bytes); a no-op for an image without source bytes."""
        if self.source_bytes:
            object.__setattr__(self, "pixels", None)


def pixel_hash(image: Image.Image) -> str:
    """sha256 of an RGB image's size and pixels."""
    if image.mode != "RGB":
        raise ValueError(f"pixel_hash needs an RGB image, got {image.mode}")
    h = hashlib.sha256()
    h.update(f"rgb8:{image.width}x{image.height}:".encode())
    h.update(image.tobytes())
    return h.hexdigest()


def load_image(source: ImageSource, *, limits: IntakeLimits = IntakeLimits(), name: str | None = None) -> ImageInput:
    """Decode ``source`` into an :class:`ImageInput`, or raise :class:`ImageError`.

    ``name`` is what errors call the input (defaults to the path, or ``<N bytes>``).
    """
    if isinstance(source, ImageInput):
        return source
    if isinstance(source, Image.Image):
        label = name or "<PIL image>"
        _check_pixels(label, source.size, limits)
        try:
            # A lazily opened image decodes here; its failures are the caller's bad input.
            source.load()
        except (OSError, ValueError, SyntaxError, EOFError) as e:
            raise ImageError(label, f"cannot decode image: {e or type(e).__name__}") from None
        return _finish(_normalise(label, source), None, source.format, label)
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        label = name or str(path)
        try:
            # Regular files only, opened without blocking and read no further than the
            # limit: /dev/zero, a FIFO or a /proc file cannot hang or exhaust memory.
            data = read_regular_file(path, limits.max_bytes)
        except FileReadError as e:
            raise ImageError(label, e.reason) from None
    elif isinstance(source, (bytes, bytearray, memoryview)):
        data = bytes(source)
        label = name or f"<{len(data)} bytes>"
    else:
        raise ImageError(repr(source)[:80], f"cannot read an image from a {type(source).__name__}")
    return _decode(data, label, limits)


def _decode(data: bytes, label: str, limits: IntakeLimits) -> ImageInput:
    img, fmt = _open_pixels(data, label, limits)
    return _finish(_normalise(label, img), data, fmt, label)


def _open_pixels(data: bytes, label: str, limits: IntakeLimits) -> tuple[Image.Image, str | None]:
    """The first frame of ``data`` decoded as stored (not yet normalised) and its format; ImageError else."""
    if not data:
        raise ImageError(label, "empty file (0 bytes)")
    if len(data) > limits.max_bytes:
        raise ImageError(label, f"{len(data)} bytes, over the {limits.max_bytes}-byte limit")
    with warnings.catch_warnings():
        # Pillow only warns below twice its own bomb limit; we decide ourselves.
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        try:
            img = Image.open(io.BytesIO(data), formats=_OPEN_FORMATS)
        except Image.DecompressionBombError as e:
            raise ImageError(label, f"decompression bomb refused: {e}") from None
        except Image.UnidentifiedImageError:
            raise ImageError(label, _unidentified_reason(data)) from None
        except (OSError, ValueError, SyntaxError) as e:
            raise ImageError(label, f"cannot decode image header: {e}") from None
        fmt = img.format
        # The header gives the size before any pixel is decoded: refuse bombs here.
        _check_pixels(label, img.size, limits)
        try:
            img.seek(0)  # first frame of an animation
            img.load()
        except Image.DecompressionBombError as e:
            raise ImageError(label, f"decompression bomb refused: {e}") from None
        except (OSError, ValueError, SyntaxError, EOFError) as e:
            reason = str(e) or type(e).__name__
            if "truncated" in reason.lower() or isinstance(e, EOFError):
                reason = f"truncated or incomplete image data ({reason})"
            raise ImageError(label, f"cannot decode {fmt} image: {reason}") from None
    return img, fmt


def _unidentified_reason(data: bytes) -> str:
    for magic, fmt in _MAGIC:
        if data.startswith(magic):
            return f"truncated or corrupt {fmt} data (the header cannot be read)"
    if data.startswith(b"%PDF-"):  # Pillow writes PDFs but cannot read them
        return f"unsupported image format PDF; supported: {', '.join(SUPPORTED_FORMATS)}"
    try:
        # Pillow knows the format but we do not allow it (PDF, EPS, ICO ...)?
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            other = Image.open(io.BytesIO(data))
        return f"unsupported image format {other.format}; supported: {', '.join(SUPPORTED_FORMATS)}"
    except Exception:
        pass
    head = data[:64]
    if all(32 <= b < 127 or b in (9, 10, 13) for b in head):
        return "not an image (the data looks like text)"
    return "not a recognised image format"


def _check_pixels(label: str, size: tuple[int, int], limits: IntakeLimits) -> None:
    w, h = size
    if w <= 0 or h <= 0:
        raise ImageError(label, f"image has no pixels ({w}x{h})")
    if w * h > limits.max_pixels:
        raise ImageError(label, f"{w}x{h} = {w * h} pixels, over the {limits.max_pixels}-pixel limit")
    if max(w, h) > limits.max_aspect_ratio * min(w, h):
        raise ImageError(label, f"{w}x{h} has an aspect ratio over {limits.max_aspect_ratio:g}:1, which VLMs refuse")


def _normalise(label: str, img: Image.Image) -> Image.Image:
    try:
        img = ImageOps.exif_transpose(img) or img
    except Exception:  # a broken EXIF block must not reject an otherwise good image
        pass
    mode = img.mode
    if mode in ("I;16", "I;16B", "I;16L", "I;16N", "I"):
        img = _to_8bit(img)
        mode = img.mode
    if mode == "F":
        raise ImageError(label, "floating-point images are not supported")
    has_alpha = "A" in img.getbands() or "transparency" in img.info or mode in ("RGBa", "La", "PA")
    try:
        if has_alpha:
            rgba = img.convert("RGBA")
            background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
            return Image.alpha_composite(background, rgba).convert("RGB")
        return img.convert("RGB")
    except (ValueError, OSError) as e:  # modes Pillow cannot turn into RGB (LAB, HSV ...)
        raise ImageError(label, f"cannot convert a {mode} image to RGB: {e}") from None


def _to_8bit(img: Image.Image) -> Image.Image:
    import numpy as np

    arr = np.asarray(img).astype(np.int64)
    # "I;16*" is 16-bit by definition: always scale, whatever the values, so a dark
    # 16-bit image stays dark (a value test would turn 255/65535 into white).
    # Plain "I" carries no bit depth; Pillow uses it for 16-bit data, and values
    # above 255 can only mean a wider range, so scale those and keep 8-bit ones.
    if img.mode != "I" or arr.max(initial=0) > 255:
        arr = np.clip(arr, 0, 65535) >> 8  # 16-bit range onto 8 bits, not a clip
    return Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8), mode="L")


def _finish(img: Image.Image, data: bytes | None, fmt: str | None, label: str) -> ImageInput:
    if data is None:
        # An in-memory image has no original file: keep a lossless PNG of what we saw,
        # so the reference can still be re-encoded for another model later.
        buffer = io.BytesIO()
        img.save(buffer, format="PNG")
        data, fmt = buffer.getvalue(), fmt or "PNG"
    return ImageInput(sha256=pixel_hash(img), size=img.size, source_bytes=data, source_format=fmt, name=label,
                      pixels=img)
