"""Image intake: decode, validate, normalise and hash what the encoder will see.

Accepts a path, raw bytes or a PIL image. The result, :class:`ImageInput`, is an
orientation-corrected 8-bit RGB image and its content hash. Documented behaviour:

- EXIF orientation is applied, then dropped.
- Alpha (RGBA, LA, palette with transparency) is composited onto white.
- CMYK, greyscale, 1-bit and palette images become RGB; 16-bit images are
  scaled to 8 bits (not clipped); floating-point images are refused from the header.
- Animated images (GIF, WebP, APNG) use their first frame.
- Empty, truncated or non-image data, formats outside :data:`SUPPORTED_FORMATS`,
  and images over ``max_pixels`` (decompression bombs included, checked from the
  header before any pixels are decoded) raise :class:`~refsight.errors.ImageError`.

Memory per image is bounded before any pixel is decoded: every supported pixel mode is
stored in at most 4 bytes a pixel (:data:`_STORED_BYTES`; 16-bit samples are read as 16-bit
grey, or reduced to 8 bits while decoding), and the conversion to RGB, the 16-bit scaling and
the hash work on bands of about a million pixels, so an image costs its decoded pixels plus
its RGB result (at most 8 bytes a pixel: 320 MB for 40 M pixels), whatever its mode.

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
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Union

from PIL import Image

from ..errors import ImageError
from .reading import FileReadError, read_regular_file
from .text import printable_text

__all__ = ["ImageInput", "IntakeLimits", "SUPPORTED_FORMATS", "load_image", "pixel_hash", "source_label", "ImageSource"]

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

#: Bytes a pixel takes once Pillow has decoded it, per mode (its storage: one byte, two for 16-bit
#: grey, else four, RGB included). A mode not listed (floating-point "F" ...) is refused from the header.
_STORED_BYTES = {
    "1": 1, "L": 1, "P": 1, "I;16": 2, "I;16L": 2, "I;16B": 2, "I;16N": 2,
    "I": 4, "LA": 4, "La": 4, "PA": 4, "RGB": 4, "RGBA": 4, "RGBa": 4, "RGBX": 4, "CMYK": 4, "YCbCr": 4,
    "LAB": 4, "HSV": 4,
}
#: Pixels converted (and hashed) at a time: each band's working copies are a few MB whatever the image.
_BAND_PIXELS = 1 << 20
#: EXIF orientation → the transposition that undoes it (what ``ImageOps.exif_transpose`` applies).
_ORIENTATIONS = {
    2: Image.Transpose.FLIP_LEFT_RIGHT, 3: Image.Transpose.ROTATE_180, 4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE, 6: Image.Transpose.ROTATE_270, 7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}
#: Where Pillow finds an orientation (EXIF, and XMP): dropped from an image once it is applied.
_ORIENTATION_KEYS = ("exif", "Raw profile type exif", "XML:com.adobe.xmp", "xmp")

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
    for band in _bands(image):  # the same digest as the whole image's bytes, without a copy of them all
        h.update(band.tobytes())
    return h.hexdigest()


def load_image(source: ImageSource, *, limits: IntakeLimits = IntakeLimits(), name: str | None = None) -> ImageInput:
    """Decode ``source`` into an :class:`ImageInput`, or raise :class:`ImageError`.

    ``name`` is what errors call the input (defaults to :func:`source_label`'s).
    """
    if isinstance(source, ImageInput):
        return source
    label = name or source_label(source)
    if isinstance(source, Image.Image):
        _check_pixels(label, source.size, limits)
        try:
            # A lazily opened image decodes here; its failures are the caller's bad input.
            source.load()
        except (OSError, ValueError, SyntaxError, EOFError) as e:
            raise ImageError(label, f"cannot decode image: {e or type(e).__name__}") from None
        return _finish(_normalise(label, source, owned=False), None, source.format, label)
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        try:
            # Regular files only, opened without blocking and read no further than the
            # limit: /dev/zero, a FIFO or a /proc file cannot hang or exhaust memory.
            data = read_regular_file(path, limits.max_bytes)
        except FileReadError as e:
            raise ImageError(label, e.reason) from None
    elif isinstance(source, (bytes, bytearray, memoryview)):
        data = bytes(source)
    else:
        raise ImageError(repr(source)[:80], f"cannot read an image from a {type(source).__name__}")
    return _decode(data, label, limits)


def source_label(source: object) -> str:
    """How an image source is named in messages: its path, its size, or its kind (always printable text:
    a path from the command line may hold undecodable bytes, which stay a valid path to read)."""
    if isinstance(source, (str, os.PathLike)):
        return printable_text(str(Path(source)))
    if isinstance(source, (bytes, bytearray, memoryview)):
        return f"<{memoryview(source).nbytes} bytes>"
    if isinstance(source, Image.Image):
        return "<PIL image>"
    return printable_text(str(getattr(source, "name", None) or type(source).__name__))


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
        # The header gives the size and the mode before any pixel is decoded: refuse bombs here.
        _check_pixels(label, img.size, limits)
        _check_mode(label, img.mode)
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


def _check_mode(label: str, mode: str) -> None:
    """Refuse, from the header, a pixel mode whose decoded size is not known to be at most 4 bytes a pixel."""
    if mode == "F":
        raise ImageError(label, "floating-point images are not supported")
    if mode not in _STORED_BYTES:
        raise ImageError(label, f"pixel mode {mode} is not supported")


def _bands(img: Image.Image) -> Iterator[Image.Image]:
    """``img`` as horizontal bands of about :data:`_BAND_PIXELS` pixels, top to bottom (each a copy)."""
    width, height = img.size
    rows = max(1, _BAND_PIXELS // max(width, 1))
    for top in range(0, height, rows):
        yield img.crop((0, top, width, min(height, top + rows)))


def _normalise(label: str, img: Image.Image, *, owned: bool = True) -> Image.Image:
    """``img`` as 8-bit RGB, alpha on white, EXIF orientation applied; converted band by band.

    ``owned``: ``img`` was decoded here, so an RGB one may be returned as it is (else a copy is).
    """
    _check_mode(label, img.mode)
    try:
        transpose = _ORIENTATIONS.get(img.getexif().get(0x0112, 1))
    except Exception:  # a broken EXIF block must not reject an otherwise good image
        transpose = None
    convert = _band_converter(label, img)
    if convert is None:
        rgb = img if owned or transpose is not None else img.copy()
    else:
        rgb = Image.new("RGB", img.size)
        top = 0
        for band in _bands(img):
            rgb.paste(convert(band), (0, top))
            top += band.height
    if transpose is None:
        return rgb
    # Per-pixel conversions commute with the transposition: made on the RGB result, one copy of it.
    rotated = rgb.transpose(transpose)
    for key in _ORIENTATION_KEYS:  # applied: the pixels carry no orientation any more
        rotated.info.pop(key, None)
    return rotated


def _band_converter(label: str, img: Image.Image) -> Callable[[Image.Image], Image.Image] | None:
    """What turns one band of ``img`` into RGB (None: ``img`` is RGB already)."""
    mode = img.mode
    if mode.startswith("I"):
        # "I;16*" is 16-bit by definition: always scale, whatever the values, so a dark
        # 16-bit image stays dark (a value test would turn 255/65535 into white).
        # Plain "I" carries no bit depth; Pillow uses it for 16-bit data, and values
        # above 255 can only mean a wider range, so scale those and keep 8-bit ones.
        scale = mode != "I" or img.getextrema()[1] > 255
        return lambda band: _to_8bit(band, scale).convert("RGB")
    has_alpha = "A" in img.getbands() or "transparency" in img.info or mode in ("RGBa", "La", "PA")
    if not has_alpha and mode == "RGB":
        return None

    def convert(band: Image.Image) -> Image.Image:
        try:
            if not has_alpha:
                return band.convert("RGB")
            rgba = band.convert("RGBA")
            background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
            return Image.alpha_composite(background, rgba).convert("RGB")
        except (ValueError, OSError) as e:  # modes Pillow cannot turn into RGB (LAB, HSV ...)
            raise ImageError(label, f"cannot convert a {mode} image to RGB: {e}") from None

    return convert


def _to_8bit(band: Image.Image, scale: bool) -> Image.Image:
    import numpy as np

    arr = np.asarray(band).astype(np.int64)
    if scale:
        arr = np.clip(arr, 0, 65535) >> 8  # 16-bit range onto 8 bits, not a clip
    return Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8))  # 2-D uint8: mode L


def _finish(img: Image.Image, data: bytes | None, fmt: str | None, label: str) -> ImageInput:
    if data is None:
        # An in-memory image has no original file: keep a lossless PNG of what we saw,
        # so the reference can still be re-encoded for another model later.
        buffer = io.BytesIO()
        img.save(buffer, format="PNG")
        data, fmt = buffer.getvalue(), fmt or "PNG"
    return ImageInput(sha256=pixel_hash(img), size=img.size, source_bytes=data, source_format=fmt, name=label,
                      pixels=img)
