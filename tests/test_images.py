"""Image intake: the bad-image corpus, mode conversions, orientation, limits and the content hash."""

from __future__ import annotations

import hashlib
import io
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from image_corpus import (
    BOMB_SIDE,
    CORPUS_ACCEPTED,
    CORPUS_REJECTED,
    GIF_FRAME_COLOURS,
    bomb_png,
    encode,
    png16_grey_array,
    png16_rgb_array,
)
from refsight.errors import ImageError, InvalidInputError, RefsightError
from refsight.inputs.images import SUPPORTED_FORMATS, ImageInput, IntakeLimits, load_image, pixel_hash


def rgb(result: ImageInput) -> np.ndarray:
    """The decoded pixels as an HxWx3 uint8 array (and a check that they are 8-bit RGB)."""
    assert isinstance(result, ImageInput)
    assert result.image.mode == "RGB"
    array = np.asarray(result.image)
    assert array.dtype == np.uint8 and array.ndim == 3 and array.shape[2] == 3
    return array


# -- the corpus: refused inputs ---------------------------------------------------------

REJECTION_REASONS = {
    "truncated_jpeg": "truncated",
    "zero_bytes": "empty",
    "text_as_jpeg": "not an image",
    "bomb_header_png": "bomb",
    "unsupported_ico": "unsupported image format",
    "directory": "directory",
    "missing": "no such file",
}


def test_rejection_table_covers_the_corpus():
    assert set(REJECTION_REASONS) == CORPUS_REJECTED


@pytest.mark.parametrize("name", sorted(CORPUS_REJECTED))
def test_bad_corpus_entry_is_refused_naming_input_and_reason(bad_image_corpus, name):
    path = bad_image_corpus[name]
    with pytest.raises(ImageError) as caught:
        load_image(path)
    error = caught.value
    assert isinstance(error, InvalidInputError) and isinstance(error, RefsightError)
    assert error.input == str(path)
    assert str(path) in str(error)
    assert REJECTION_REASONS[name] in error.reason.lower()
    assert error.reason in str(error)


@pytest.mark.parametrize("name", sorted(CORPUS_REJECTED - {"directory", "missing"}))
def test_bad_bytes_are_refused_with_the_given_name(bad_image_corpus, name):
    data = bad_image_corpus[name].read_bytes()
    with pytest.raises(ImageError) as caught:
        load_image(data, name="upload-7")
    assert str(caught.value).startswith("upload-7: ")
    assert REJECTION_REASONS[name] in caught.value.reason.lower()


def test_unnamed_bytes_are_described_by_their_length():
    with pytest.raises(ImageError, match=r"^<11 bytes>: not an image"):
        load_image(b"hello world")


@pytest.mark.parametrize("cut", [2, 20, 300])
def test_jpeg_cut_inside_its_header_is_called_truncated(real_photo, cut):
    data = encode(real_photo(), "JPEG")[:cut]
    with pytest.raises(ImageError, match="(?i)truncated"):
        load_image(data)


def test_truncated_png_is_refused(real_photo):
    data = encode(real_photo(), "PNG")
    with pytest.raises(ImageError, match="(?i)truncated|cannot decode"):
        load_image(data[: len(data) - 200])


def test_bomb_header_is_refused_before_any_pixel_is_decoded():
    data = bomb_png()
    assert len(data) < 200
    start = time.perf_counter()
    with pytest.raises(ImageError) as caught:
        load_image(data)
    # 10^10 pixels would take minutes and ~30 GB to decode; refusing from the header is instant.
    assert time.perf_counter() - start < 1.0
    assert str(BOMB_SIDE * BOMB_SIDE) in caught.value.reason


def test_bomb_header_under_a_raised_pixel_limit_is_still_refused():
    side = 20_000  # 4e8 pixels: above Pillow's own hard limit as well
    with pytest.raises(ImageError, match="(?i)bomb|pixel"):
        load_image(bomb_png(side), limits=IntakeLimits(max_pixels=10**12))


def test_real_image_over_the_pixel_limit_is_refused(real_photo):
    photo = real_photo("coffee", size=(60, 40))
    for source in (encode(photo, "PNG"), photo):
        with pytest.raises(ImageError, match=r"60x40 = 2400 pixels, over the 2399-pixel limit"):
            load_image(source, limits=IntakeLimits(max_pixels=2399))
    assert load_image(photo, limits=IntakeLimits(max_pixels=2400)).size == (60, 40)


def test_pixel_limit_is_checked_from_the_header_before_decoding(real_photo):
    # A truncated file fails only when pixels are decoded; the limit error wins, so
    # the limit was checked from the header first.
    data = encode(real_photo("rocket", size=(200, 150)), "PNG")
    truncated = data[: len(data) // 2]
    with pytest.raises(ImageError, match="over the 1000-pixel limit"):
        load_image(truncated, limits=IntakeLimits(max_pixels=1000))
    with pytest.raises(ImageError, match="(?i)truncated|cannot decode"):
        load_image(truncated)


def test_file_over_max_bytes_is_refused(tmp_path, real_photo):
    data = encode(real_photo(), "PNG")
    path = tmp_path / "big.png"
    path.write_bytes(data)
    limits = IntakeLimits(max_bytes=len(data) - 1)
    with pytest.raises(ImageError) as caught:
        load_image(path, limits=limits)
    assert str(path) in str(caught.value)
    assert f"over the {len(data) - 1}-byte limit" in caught.value.reason
    with pytest.raises(ImageError, match=f"over the {len(data) - 1}-byte limit"):
        load_image(data, limits=limits)
    assert load_image(path, limits=IntakeLimits(max_bytes=len(data))).size == real_photo().size


@pytest.mark.parametrize("fmt", ["ICO", "PPM", "TGA", "PCX", "PDF"])
def test_formats_pillow_knows_but_we_do_not_accept_are_refused(real_photo, fmt):
    assert fmt not in SUPPORTED_FORMATS
    data = encode(real_photo("astronaut", size=(32, 32)), fmt)
    with pytest.raises(ImageError, match=f"unsupported image format {fmt}"):
        load_image(data)


def test_binary_garbage_is_not_an_image():
    garbage = bytes(range(256)) * 4
    with pytest.raises(ImageError, match="not a recognised image format"):
        load_image(garbage)


@pytest.mark.parametrize("source", [42, None, 3.5, ["a.png"], object()])
def test_unreadable_source_types_are_refused(source):
    with pytest.raises(ImageError, match=f"cannot read an image from a {type(source).__name__}"):
        load_image(source)


def test_path_with_nul_byte_is_refused_as_image_error(tmp_path):
    with pytest.raises(ImageError, match="cannot read file"):
        load_image(str(tmp_path / "a\0b.png"))


def test_lazily_opened_truncated_pil_image_is_refused(real_photo):
    data = encode(real_photo(), "JPEG")
    lazy = Image.open(io.BytesIO(data[: len(data) // 2]))
    with pytest.raises(ImageError, match="^<PIL image>: cannot decode"):
        load_image(lazy)


def test_floating_point_image_is_refused():
    image = Image.fromarray(np.zeros((4, 4), np.float32))
    assert image.mode == "F"
    with pytest.raises(ImageError, match="floating-point"):
        load_image(image)


# -- the corpus: accepted awkward inputs --------------------------------------------------


@pytest.mark.parametrize("name", sorted(CORPUS_ACCEPTED))
def test_awkward_corpus_entry_becomes_rgb(bad_image_corpus, name):
    path = bad_image_corpus[name]
    result = load_image(path)
    rgb(result)
    assert result.source_bytes == path.read_bytes()  # the original bytes are kept unchanged
    assert result.sha256 == pixel_hash(result.image)
    assert result.name == str(path)


@pytest.mark.parametrize("name", sorted(CORPUS_ACCEPTED))
def test_released_pixels_decode_again_to_the_same_image(bad_image_corpus, name):
    # Issue 38: a request drops each decoded image once it is encoded; asked again, it is the same image.
    result = load_image(bad_image_corpus[name])
    before = rgb(result).copy()
    result.release()
    assert result.pixels is None and result.size == (before.shape[1], before.shape[0])  # the size needs no pixels
    assert np.array_equal(rgb(result), before) and pixel_hash(result.image) == result.sha256
    assert result.pixels is not None  # decoded once, then held until released again


def test_an_in_memory_image_is_released_to_its_lossless_copy():
    image = Image.new("RGB", (40, 30), (200, 10, 90))
    result = load_image(image)
    result.release()
    assert result.source_format == "PNG" and np.array_equal(np.asarray(result.image), np.asarray(image))


def test_cmyk_jpeg_is_converted_close_to_the_photo(bad_image_corpus, real_photo):
    path = bad_image_corpus["cmyk_jpeg"]
    assert Image.open(path).mode == "CMYK"
    result = rgb(load_image(path)).astype(int)
    original = np.asarray(real_photo("chelsea", size=(64, 48))).astype(int)
    # JPEG is lossy, but inverted or channel-swapped CMYK would be off by ~100.
    assert np.abs(result - original).mean() < 12


def test_16bit_grey_png_is_scaled_not_clipped(bad_image_corpus):
    assert Image.open(bad_image_corpus["png16_grey"]).mode.startswith("I")
    result = rgb(load_image(bad_image_corpus["png16_grey"]))
    expected = (png16_grey_array().astype(np.int64) >> 8).astype(np.uint8)
    for channel in range(3):
        np.testing.assert_array_equal(result[..., channel], expected)
    # A clip would saturate everything above 255/65535, i.e. almost the whole ramp.
    assert (result[..., 0] == 255).mean() < 0.01
    assert result[..., 0].min() == 0 and result[..., 0].max() == 255


def test_dark_16bit_png_stays_dark(tmp_path):
    # Values 0..255 out of 65535 are near-black; a "looks 8-bit" guess would make them white.
    dark = np.arange(256, dtype=np.uint16).reshape(16, 16)
    result = rgb(load_image(encode(Image.fromarray(dark), "PNG")))
    assert result.max() == 0


def test_16bit_rgb_png_keeps_the_high_byte(bad_image_corpus):
    result = rgb(load_image(bad_image_corpus["png16_rgb"])).astype(np.int64)
    expected = png16_rgb_array().astype(np.int64) >> 8
    # Pillow's own 16->8 bit reduction may round instead of truncating; never clip.
    assert np.abs(result - expected).max() <= 1


def test_palette_transparency_is_composited_on_white(bad_image_corpus):
    path = bad_image_corpus["palette_transparent_png"]
    source = Image.open(path)
    assert source.mode == "P" and "transparency" in source.info
    result = rgb(load_image(path))
    assert (result[:, :16] == 255).all()  # transparent red -> white, not red
    assert (result[:, 16:] == (0, 0, 255)).all()  # opaque blue stays blue


def test_rgba_is_composited_on_white(bad_image_corpus):
    source = np.asarray(Image.open(bad_image_corpus["rgba_png"])).astype(int)
    result = rgb(load_image(bad_image_corpus["rgba_png"])).astype(int)
    third = source.shape[1] // 3
    assert (result[:, :third] == 255).all()  # alpha 0: white, although the colour is black
    np.testing.assert_array_equal(result[:, 2 * third + 1 :], source[:, 2 * third + 1 :, :3])
    blended = (source[:, third + 1 : 2 * third - 1, :3] * 128 + 255 * 127) / 255
    assert np.abs(result[:, third + 1 : 2 * third - 1] - blended).max() <= 1.5


def test_la_is_composited_on_white_and_grey(bad_image_corpus):
    source = np.asarray(Image.open(bad_image_corpus["la_png"])).astype(int)
    result = rgb(load_image(bad_image_corpus["la_png"])).astype(int)
    assert (result[..., 0] == result[..., 1]).all() and (result[..., 1] == result[..., 2]).all()
    third = source.shape[1] // 3
    assert (result[:, :third] == 255).all()
    np.testing.assert_array_equal(result[:, 2 * third + 1 :, 0], source[:, 2 * third + 1 :, 0])


def test_greyscale_becomes_equal_rgb_channels(bad_image_corpus):
    grey = np.asarray(Image.open(bad_image_corpus["grey_png"]))
    result = rgb(load_image(bad_image_corpus["grey_png"]))
    for channel in range(3):
        np.testing.assert_array_equal(result[..., channel], grey)


def test_bilevel_becomes_black_and_white(bad_image_corpus):
    result = rgb(load_image(bad_image_corpus["bilevel_png"]))
    assert set(np.unique(result)) == {0, 255}


def test_animated_gif_uses_its_first_frame(bad_image_corpus):
    path = bad_image_corpus["animated_gif"]
    assert Image.open(path).n_frames == len(GIF_FRAME_COLOURS)
    result = rgb(load_image(path)).astype(int)
    first, second = np.array(GIF_FRAME_COLOURS[0]), np.array(GIF_FRAME_COLOURS[1])
    assert np.abs(result - first).max() <= 8
    assert np.abs(result - second).max(axis=-1).min() > 50


def test_pil_image_on_a_later_frame_is_taken_as_it_is(bad_image_corpus):
    image = Image.open(bad_image_corpus["animated_gif"])
    image.seek(1)
    result = rgb(load_image(image)).astype(int)
    assert np.abs(result - np.array(GIF_FRAME_COLOURS[1])).max() <= 8


@pytest.mark.parametrize(
    ("name", "transpose"),
    [("exif6_jpeg", Image.Transpose.ROTATE_270), ("exif8_jpeg", Image.Transpose.ROTATE_90)],
)
def test_exif_orientation_is_applied(bad_image_corpus, name, transpose):
    path = bad_image_corpus[name]
    stored = Image.open(path)
    assert stored.getexif()[0x0112] in (6, 8)
    result = load_image(path)
    assert result.size == (stored.height, stored.width)  # width and height swapped
    expected = np.asarray(stored.convert("RGB").transpose(transpose))
    np.testing.assert_array_equal(rgb(result), expected)
    assert 0x0112 not in result.image.getexif()  # applied, then dropped


def test_orientation_6_and_8_give_different_pixels(bad_image_corpus):
    six = load_image(bad_image_corpus["exif6_jpeg"])
    eight = load_image(bad_image_corpus["exif8_jpeg"])
    assert six.size == eight.size
    assert six.sha256 != eight.sha256


def test_pil_input_with_orientation_is_rotated_too(bad_image_corpus):
    image = Image.open(bad_image_corpus["exif6_jpeg"])
    assert load_image(image).sha256 == load_image(bad_image_corpus["exif6_jpeg"]).sha256


def test_pil_input_keeps_a_lossless_copy_of_what_was_seen(real_photo):
    photo = real_photo("rocket", size=(40, 30)).convert("RGBA")
    result = load_image(photo)
    assert result.name == "<PIL image>"
    kept = Image.open(io.BytesIO(result.source_bytes))
    assert kept.format == "PNG"
    np.testing.assert_array_equal(np.asarray(kept.convert("RGB")), rgb(result))


def test_image_input_passes_through_unchanged(real_photo):
    first = load_image(real_photo())
    assert load_image(first) is first


def test_input_pil_image_is_not_modified(real_photo):
    photo = real_photo("coffee").convert("RGBA")
    before = photo.tobytes()
    load_image(photo)
    assert photo.mode == "RGBA" and photo.tobytes() == before


# -- content hash ------------------------------------------------------------------------


LOSSLESS = [("BMP", {}), ("TIFF", {}), ("TIFF", {"compression": "tiff_lzw"}), ("WEBP", {"lossless": True}), ("PNG", {"compress_level": 1})]


@pytest.mark.parametrize(("fmt", "params"), LOSSLESS, ids=[f"{f}-{i}" for i, (f, _) in enumerate(LOSSLESS)])
def test_lossless_resave_shares_the_hash(tmp_path, real_photo, fmt, params):
    photo = real_photo("coffee", size=(72, 48))
    png = tmp_path / "photo.png"
    png.write_bytes(encode(photo, "PNG"))
    other = tmp_path / f"resaved.{fmt.lower()}"
    other.write_bytes(encode(photo, fmt, **params))
    assert png.read_bytes() != other.read_bytes()
    a, b = load_image(png), load_image(other)
    assert a.sha256 == b.sha256
    assert b.source_format == fmt


def test_jpeg_reencode_changes_the_hash(real_photo):
    photo = real_photo("coffee", size=(72, 48))
    assert load_image(encode(photo, "PNG")).sha256 != load_image(encode(photo, "JPEG", quality=95)).sha256


@pytest.mark.parametrize("xy", [(0, 0), (71, 47), (30, 20)])
@pytest.mark.parametrize("channel", [0, 1, 2])
def test_one_pixel_change_changes_the_hash(real_photo, xy, channel):
    photo = real_photo("astronaut", size=(72, 48))
    changed = photo.copy()
    pixel = list(changed.getpixel(xy))
    pixel[channel] = (pixel[channel] + 1) % 256
    changed.putpixel(xy, tuple(pixel))
    assert load_image(encode(photo, "PNG")).sha256 != load_image(encode(changed, "PNG")).sha256


def test_path_bytes_and_pil_inputs_agree(tmp_path, real_photo):
    photo = real_photo("chelsea")
    path = tmp_path / "cat.png"
    path.write_bytes(encode(photo, "PNG"))
    hashes = {
        load_image(path).sha256,
        load_image(str(path)).sha256,
        load_image(path.read_bytes()).sha256,
        load_image(bytearray(path.read_bytes())).sha256,
        load_image(memoryview(path.read_bytes())).sha256,
        load_image(photo).sha256,
        load_image(Image.open(path)).sha256,
    }
    assert len(hashes) == 1


def test_hash_is_sha256_of_size_and_rgb_pixels(real_photo):
    photo = real_photo("rocket", size=(20, 10))
    expected = hashlib.sha256(b"rgb8:20x10:" + photo.tobytes()).hexdigest()
    assert load_image(photo).sha256 == expected


def test_same_pixel_bytes_in_another_shape_hash_differently():
    data = np.arange(2 * 8 * 3, dtype=np.uint8)
    wide = Image.fromarray(data.reshape(2, 8, 3))
    tall = Image.fromarray(data.reshape(8, 2, 3))
    assert wide.tobytes() == tall.tobytes()
    assert load_image(wide).sha256 != load_image(tall).sha256


def test_transparent_pixels_hash_as_what_the_encoder_sees():
    # Two RGBA images differing only in the colour under alpha 0 look identical on white.
    a = np.zeros((4, 4, 4), np.uint8)
    b = a.copy()
    b[..., 0] = 200
    assert load_image(Image.fromarray(a)).sha256 == load_image(Image.fromarray(b)).sha256


def test_pixel_hash_needs_rgb():
    with pytest.raises(ValueError, match="RGB"):
        pixel_hash(Image.new("L", (2, 2)))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    pixels=st.integers(1, 12).flatmap(
        lambda w: st.integers(1, 12).flatmap(
            lambda h: st.binary(min_size=w * h * 3, max_size=w * h * 3).map(lambda b: (w, h, b))
        )
    )
)
def test_lossless_containers_agree_for_any_pixels(pixels):
    width, height, data = pixels
    image = Image.frombytes("RGB", (width, height), data)
    hashes = {load_image(encode(image, fmt, **params)).sha256 for fmt, params in LOSSLESS}
    assert hashes == {load_image(image).sha256}


def test_multi_picture_jpeg_is_accepted_as_its_first_picture(real_photo):
    first, second = real_photo("chelsea", size=(32, 24)), real_photo("rocket", size=(32, 24))
    data = encode(first, "MPO", save_all=True, append_images=[second], quality=95)
    result = load_image(data)
    assert result.source_format == "MPO"
    assert load_image(encode(first, "JPEG", quality=95)).sha256 == result.sha256
