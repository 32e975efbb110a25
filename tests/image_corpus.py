"""Real photos and a corpus of bad and awkward image files, built in code.

Shared by the tests through a module with a unique name (``conftest`` modules of
different folders all import as ``conftest`` and would shadow each other); the
fixtures over these helpers live in ``tests/conftest.py``.
"""

from __future__ import annotations

import functools
import io
import struct
import zlib
from pathlib import Path

import numpy as np
from PIL import Image

#: Photos from refsight's bundled sample data (package data of ``refsight.samples``).
PHOTO_NAMES = ("chelsea", "coffee", "astronaut", "rocket")

#: Corpus entries that intake must refuse with ImageError (default limits).
CORPUS_REJECTED = frozenset(
    {"truncated_jpeg", "zero_bytes", "text_as_jpeg", "bomb_header_png", "unsupported_ico", "directory", "missing"}
)
#: Corpus entries that intake must accept and turn into 8-bit RGB.
CORPUS_ACCEPTED = frozenset(
    {
        "cmyk_jpeg",
        "png16_grey",
        "png16_rgb",
        "palette_transparent_png",
        "rgba_png",
        "la_png",
        "grey_png",
        "bilevel_png",
        "animated_gif",
        "exif6_jpeg",
        "exif8_jpeg",
    }
)

#: Side of the 100000x100000 image the bomb header claims.
BOMB_SIDE = 100_000


@functools.lru_cache(maxsize=None)
def _photo_array(name: str) -> np.ndarray:
    from refsight.samples import load_sample

    if name not in PHOTO_NAMES:
        raise ValueError(f"unknown photo {name!r}; choose from {PHOTO_NAMES}")
    array = np.asarray(load_sample(name))
    array.setflags(write=False)  # cached and shared: nobody may edit it in place
    return array


def load_photo(name: str = "chelsea", size: tuple[int, int] | None = (96, 64)) -> Image.Image:
    """A real RGB photo from ``refsight.samples`` as a fresh PIL image, resized to ``size`` (None: full size)."""
    image = Image.fromarray(np.array(_photo_array(name)), mode="RGB")
    if size is not None:
        image = image.resize(size, Image.Resampling.BILINEAR)
    return image


def encode(image: Image.Image, fmt: str, **params) -> bytes:
    """``image`` saved to bytes in ``fmt`` with Pillow."""
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **params)
    return buffer.getvalue()


def png_chunk(kind: bytes, data: bytes) -> bytes:
    """One PNG chunk with a correct CRC (so only the size can make a decoder refuse it)."""
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def raw_png(width: int, height: int, bit_depth: int, colour_type: int, rows: list[bytes]) -> bytes:
    """A PNG built by hand from already-packed scanlines (filter byte 0 added here)."""
    header = struct.pack(">IIBBBBB", width, height, bit_depth, colour_type, 0, 0, 0)
    body = zlib.compress(b"".join(b"\x00" + row for row in rows))
    return b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", header) + png_chunk(b"IDAT", body) + png_chunk(b"IEND", b"")


def bomb_png(side: int = BOMB_SIDE) -> bytes:
    """A 100-odd byte PNG whose valid IHDR claims ``side``×``side`` RGB pixels."""
    header = struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + png_chunk(b"IHDR", header)
        + png_chunk(b"IDAT", zlib.compress(b"\x00" * 64))
        + png_chunk(b"IEND", b"")
    )


def png16_grey_array() -> np.ndarray:
    """A 16-bit ramp covering 0..65535, so a clip to 255 and a scale by 1/257 differ everywhere."""
    return np.linspace(0, 65535, 48 * 32).round().astype(np.uint16).reshape(32, 48)


def png16_rgb_array() -> np.ndarray:
    """An HxWx3 16-bit array with distinct high and low bytes per channel."""
    rng = np.random.default_rng(16)
    return rng.integers(0, 65536, size=(16, 24, 3), dtype=np.uint16)


def _exif_jpeg(photo: Image.Image, orientation: int) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation  # Orientation tag
    return encode(photo, "JPEG", quality=95, exif=exif)


def build_bad_image_corpus(directory: Path | str) -> dict[str, Path]:
    """Write the intake corpus into ``directory``; returns ``{name: path}``.

    Names in :data:`CORPUS_REJECTED` must be refused (``missing`` is a path that is
    never created, ``directory`` is a folder); names in :data:`CORPUS_ACCEPTED` are
    awkward but valid and must come out as RGB. All images are derived from a real photo.
    """
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    photo = load_photo("chelsea", (64, 48))
    files: dict[str, bytes] = {}

    jpeg = encode(photo, "JPEG", quality=90)
    files["truncated_jpeg.jpg"] = jpeg[: len(jpeg) // 2]
    files["zero_bytes.jpg"] = b""
    files["text_as_jpeg.jpg"] = b"This is a text file, not a photo.\nSecond line.\n"
    files["bomb_header_png.png"] = bomb_png()
    files["unsupported_ico.ico"] = encode(photo, "ICO", sizes=[(32, 32)])

    files["cmyk_jpeg.jpg"] = encode(photo.convert("CMYK"), "JPEG", quality=95)
    files["png16_grey.png"] = encode(Image.fromarray(png16_grey_array()), "PNG")
    rgb16 = png16_rgb_array()
    files["png16_rgb.png"] = raw_png(
        rgb16.shape[1], rgb16.shape[0], 16, 2, [row.astype(">u2").tobytes() for row in rgb16]
    )
    files["palette_transparent_png.png"] = encode(_palette_with_transparency(), "PNG")
    files["rgba_png.png"] = encode(_rgba(photo), "PNG")
    files["la_png.png"] = encode(_rgba(photo).convert("LA"), "PNG")
    files["grey_png.png"] = encode(photo.convert("L"), "PNG")
    files["bilevel_png.png"] = encode(photo.convert("1"), "PNG")
    files["animated_gif.gif"] = _animated_gif()
    files["exif6_jpeg.jpg"] = _exif_jpeg(photo, 6)
    files["exif8_jpeg.jpg"] = _exif_jpeg(photo, 8)

    corpus: dict[str, Path] = {}
    for filename, data in files.items():
        path = root / filename
        path.write_bytes(data)
        corpus[filename.rsplit(".", 1)[0]] = path
    (root / "directory.jpg").mkdir(exist_ok=True)
    corpus["directory"] = root / "directory.jpg"
    corpus["missing"] = root / "missing.jpg"
    assert set(corpus) == CORPUS_REJECTED | CORPUS_ACCEPTED
    return corpus




#: Palette entries of the transparent-palette image: index 0 is transparent red.
PALETTE_TRANSPARENT_INDEX = 0


def _palette_with_transparency() -> Image.Image:
    # Left half uses index 0 (red, fully transparent), right half index 1 (opaque blue).
    image = Image.new("P", (32, 16), 0)
    image.putpalette([255, 0, 0, 0, 0, 255] + [0, 0, 0] * 254)
    image.paste(1, (16, 0, 32, 16))
    image.info["transparency"] = PALETTE_TRANSPARENT_INDEX
    return image


def _rgba(photo: Image.Image) -> Image.Image:
    # Alpha is 0 on the left third, 255 on the right third, 128 in between; the
    # transparent pixels are black so "alpha dropped" and "composited on white" differ.
    rgba = photo.convert("RGBA")
    width, height = rgba.size
    alpha = np.zeros((height, width), np.uint8)
    alpha[:, width // 3 : 2 * width // 3] = 128
    alpha[:, 2 * width // 3 :] = 255
    pixels = np.array(rgba)
    pixels[:, : width // 3, :3] = 0
    pixels[..., 3] = alpha
    return Image.fromarray(pixels, mode="RGBA")


#: Colours of the animated GIF's frames, in order.
GIF_FRAME_COLOURS = ((200, 30, 30), (30, 30, 200), (30, 200, 30))


def _animated_gif() -> bytes:
    frames = [Image.new("RGB", (20, 12), colour) for colour in GIF_FRAME_COLOURS]
    return encode(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=100, loop=0)
