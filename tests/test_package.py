"""Encoder fingerprints, package keys, tensor specs and reference-id validation."""

from __future__ import annotations

import dataclasses
import json
import pickle

import numpy as np
import pytest
from runtimes import require_module
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from image_corpus import encode
from refsight.errors import InvalidInputError, InvalidReferenceIdError, RefsightError
from refsight.inputs.images import load_image
from refsight.package import (
    PACKAGE_FORMAT_VERSION,
    EncoderFingerprint,
    VisualPackage,
    canonical_json,
    package_key,
    tensor_spec,
)
from refsight.inputs.ref_ids import validate_ref_id

IMAGE = "ab" * 32  # a sha256-shaped image hash


def base_fingerprint(**changes) -> EncoderFingerprint:
    """A realistic Qwen2-VL-like fingerprint, with ``changes`` applied."""
    fields = dict(
        backend="hf-qwen2-vl",
        model_id="Qwen/Qwen2-VL-2B-Instruct",
        revision="895c3a49bc3fa70a340399125c650a463535e71c",
        dtype="bfloat16",
        preprocessing={
            "min_pixels": 3136,
            "max_pixels": 12845056,
            "patch_size": 14,
            "merge_size": 2,
            "image_mean": [0.48145466, 0.4578275, 0.40821073],
            "do_resize": True,
        },
        format_version=PACKAGE_FORMAT_VERSION,
    )
    fields.update(changes)
    return EncoderFingerprint(**fields)


# -- every field is part of the key --------------------------------------------------------

FIELD_CHANGES = [
    ("backend", "hf-qwen2_5-vl"),
    ("model_id", "Qwen/Qwen2-VL-7B-Instruct"),
    ("revision", "0000000000000000000000000000000000000000"),
    ("dtype", "float16"),
    ("format_version", PACKAGE_FORMAT_VERSION + 1),
]


@pytest.mark.parametrize(("field", "value"), FIELD_CHANGES, ids=[f for f, _ in FIELD_CHANGES])
def test_each_top_level_field_changes_the_key(field, value):
    base = base_fingerprint()
    changed = base_fingerprint(**{field: value})
    assert changed != base
    assert changed.digest != base.digest
    assert package_key(IMAGE, changed) != package_key(IMAGE, base)


def _preprocessing_variants() -> list[tuple[str, dict]]:
    base = base_fingerprint().to_dict()["preprocessing"]
    variants = []
    for key, value in base.items():
        removed = {k: v for k, v in base.items() if k != key}
        variants.append((f"drop-{key}", removed))
        renamed = {**removed, key + "_": value}
        variants.append((f"rename-{key}", renamed))
        if isinstance(value, bool):
            new = not value
        elif isinstance(value, int):
            new = value + 1
        elif isinstance(value, list):
            new = value[:-1] + [value[-1] + 1e-9]
        else:
            new = value + "x"
        variants.append((f"value-{key}", {**base, key: new}))
    variants.append(("add-key", {**base, "tile_size": 384}))
    variants.append(("int-vs-float", {**base, "patch_size": 14.0}))
    variants.append(("int-vs-string", {**base, "patch_size": "14"}))
    variants.append(("nested", {**base, "resample": {"filter": "bicubic"}}))
    return variants


PREPROCESSING_VARIANTS = _preprocessing_variants()


@pytest.mark.parametrize(
    "preprocessing", [v for _, v in PREPROCESSING_VARIANTS], ids=[n for n, _ in PREPROCESSING_VARIANTS]
)
def test_each_preprocessing_key_and_value_changes_the_key(preprocessing):
    base = base_fingerprint()
    changed = base_fingerprint(preprocessing=preprocessing)
    assert package_key(IMAGE, changed) != package_key(IMAGE, base)


def test_all_variants_give_distinct_keys():
    fingerprints = [base_fingerprint()]
    fingerprints += [base_fingerprint(**{f: v}) for f, v in FIELD_CHANGES]
    fingerprints += [base_fingerprint(preprocessing=p) for _, p in PREPROCESSING_VARIANTS]
    keys = {package_key(IMAGE, fp) for fp in fingerprints}
    assert len(keys) == len(fingerprints)


def test_each_pixel_change_gives_a_new_key(real_photo):
    photo = real_photo("coffee", size=(24, 16))
    fingerprint = base_fingerprint()
    keys = {package_key(load_image(photo).sha256, fingerprint)}
    for xy in [(0, 0), (23, 15), (5, 9)]:
        changed = photo.copy()
        r, g, b = changed.getpixel(xy)
        changed.putpixel(xy, (r ^ 1, g, b))
        keys.add(package_key(load_image(changed).sha256, fingerprint))
    assert len(keys) == 4


def test_lossless_container_gives_the_same_key(real_photo):
    photo = real_photo("chelsea", size=(40, 30))
    fingerprint = base_fingerprint()
    keys = {package_key(load_image(encode(photo, fmt)).sha256, fingerprint) for fmt in ("PNG", "BMP", "TIFF")}
    assert len(keys) == 1


def test_key_depends_on_the_image_hash():
    fingerprint = base_fingerprint()
    assert package_key("a" * 64, fingerprint) != package_key("b" * 64, fingerprint)


def test_key_is_a_sha256_hex_and_deterministic():
    key = package_key(IMAGE, base_fingerprint())
    assert len(key) == 64 and set(key) <= set("0123456789abcdef")
    assert key == package_key(IMAGE, base_fingerprint())


# -- canonical JSON ----------------------------------------------------------------------


def test_canonical_json_ignores_key_order_and_tuple_vs_list():
    a = base_fingerprint(preprocessing={"b": 1, "a": (1, 2), "c": {"y": 1, "x": [3]}})
    b = base_fingerprint(preprocessing={"c": {"x": (3,), "y": 1}, "a": [1, 2], "b": 1})
    assert a.to_json() == b.to_json()
    assert a == b and hash(a) == hash(b)
    assert package_key(IMAGE, a) == package_key(IMAGE, b)
    assert {a: "x"}[b] == "x"


def test_canonical_json_is_sorted_compact_ascii():
    fingerprint = base_fingerprint(model_id="vendor/modèle", preprocessing={"z": 1, "a": "é"})
    text = fingerprint.to_json()
    assert text.isascii()
    assert " " not in text and "\n" not in text
    data = json.loads(text)
    assert list(data) == sorted(data)
    assert list(data["preprocessing"]) == ["a", "z"]
    assert data["model_id"] == "vendor/modèle"
    assert text == canonical_json(data)


def test_fingerprint_json_is_pinned():
    # A change in the canonical form silently invalidates every stored package: make it loud.
    fingerprint = EncoderFingerprint("toy", "m", "r1", "float32", {"grid": 4, "a": [1, 2]}, 1)
    assert fingerprint.to_json() == (
        '{"backend":"toy","dtype":"float32","format_version":1,"model_id":"m",'
        '"preprocessing":{"a":[1,2],"grid":4},"revision":"r1"}'
    )


@pytest.mark.parametrize("via", ["text", "dict"])
def test_from_json_round_trips(via):
    fingerprint = base_fingerprint(preprocessing={"tiles": (2, 3), "nested": {"k": [1.5, None, True]}})
    source = fingerprint.to_json() if via == "text" else json.loads(fingerprint.to_json())
    again = EncoderFingerprint.from_json(source)
    assert again == fingerprint
    assert again.to_json() == fingerprint.to_json()
    assert package_key(IMAGE, again) == package_key(IMAGE, fingerprint)


def test_fingerprint_survives_pickle_copy_and_replace():
    fingerprint = base_fingerprint()
    assert pickle.loads(pickle.dumps(fingerprint)) == fingerprint
    replaced = dataclasses.replace(fingerprint, dtype="float32")
    assert replaced.dtype == "float32" and replaced != fingerprint


def test_editing_the_callers_dict_does_not_change_the_key():
    settings_dict = {"min_pixels": 3136, "tiles": [1, 2]}
    fingerprint = base_fingerprint(preprocessing=settings_dict)
    key = package_key(IMAGE, fingerprint)
    settings_dict["min_pixels"] = 1
    settings_dict["tiles"].append(3)
    assert package_key(IMAGE, fingerprint) == key


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        ("backend", "", "non-empty string"),
        ("model_id", None, "non-empty string"),
        ("revision", "", "non-empty string"),
        ("dtype", 16, "non-empty string"),
        ("format_version", "1", "must be an int"),
        ("format_version", True, "must be an int"),
        ("preprocessing", [("a", 1)], "must be a mapping"),
        ("preprocessing", {"x": float("nan")}, "JSON"),
        ("preprocessing", {"x": object()}, "JSON"),
        ("preprocessing", {1: "a", "b": 2}, "JSON"),
    ],
)
def test_bad_fingerprint_fields_are_refused(field, value, reason):
    with pytest.raises(InvalidInputError) as caught:
        base_fingerprint(**{field: value})
    assert caught.value.input == f"EncoderFingerprint.{field}"
    assert reason in caught.value.reason


@pytest.mark.parametrize(
    "text",
    ["not json", "[]", '{"backend": "x"}', '{"backend":"b","model_id":"m","revision":"r","dtype":"d","format_version":"v"}'],
)
def test_from_json_refuses_what_is_not_a_fingerprint(text):
    with pytest.raises(InvalidInputError, match="^fingerprint JSON: "):
        EncoderFingerprint.from_json(text)


@pytest.mark.parametrize(("image", "fingerprint"), [(None, "fp"), ("", "fp"), (IMAGE, None), (IMAGE, {"backend": "x"})])
def test_package_key_refuses_bad_arguments(image, fingerprint):
    if fingerprint == "fp":
        fingerprint = base_fingerprint()
    with pytest.raises(InvalidInputError):
        package_key(image, fingerprint)


# -- properties --------------------------------------------------------------------------

text = st.text(min_size=1, max_size=12)
json_leaf = st.one_of(
    st.none(), st.booleans(), st.integers(-(10**6), 10**6), st.floats(allow_nan=False, allow_infinity=False), text
)
json_value = st.recursive(
    json_leaf, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3), max_leaves=6
)
fingerprints = st.builds(
    EncoderFingerprint,
    backend=text,
    model_id=text,
    revision=text,
    dtype=text,
    preprocessing=st.dictionaries(text, json_value, max_size=4),
    format_version=st.integers(0, 5),
)
STRING_FIELDS = ("backend", "model_id", "revision", "dtype")


@settings(max_examples=60, deadline=None)
@given(fp=fingerprints, field=st.sampled_from(STRING_FIELDS + ("format_version", "preprocessing")), data=st.data())
def test_key_changes_with_any_fingerprint_field(fp, field, data):
    if field == "format_version":
        new = data.draw(st.integers(0, 5))
    elif field == "preprocessing":
        new = data.draw(st.dictionaries(text, json_value, max_size=4))
    else:
        new = data.draw(text)
    changed = dataclasses.replace(fp, **{field: new})
    assume(canonical_json(changed.to_dict()[field]) != canonical_json(fp.to_dict()[field]))
    assert package_key(IMAGE, changed) != package_key(IMAGE, fp)
    assert changed.digest != fp.digest


def two_cuts(min_size: int = 3, max_size: int = 20):
    """A string and two different places to cut it, each leaving both parts non-empty."""
    return st.text(min_size=min_size, max_size=max_size).flatmap(
        lambda whole: st.tuples(
            st.just(whole),
            st.lists(st.integers(1, len(whole) - 1), min_size=2, max_size=2, unique=True),
        )
    )


@settings(max_examples=60, deadline=None)
@given(
    cut=two_cuts(),
    pair=st.sampled_from([(a, b) for a in STRING_FIELDS for b in STRING_FIELDS if a != b]),
)
def test_no_collision_when_strings_shift_between_fields(cut, pair):
    whole, (i, j) = cut
    first, second = pair
    a = base_fingerprint(**{first: whole[:i], second: whole[i:]})
    b = base_fingerprint(**{first: whole[:j], second: whole[j:]})
    assert package_key(IMAGE, a) != package_key(IMAGE, b)


@settings(max_examples=50, deadline=None)
@given(cut=two_cuts())
def test_no_collision_when_strings_shift_between_preprocessing_key_and_value(cut):
    whole, (i, j) = cut
    a = base_fingerprint(preprocessing={whole[:i]: whole[i:]})
    b = base_fingerprint(preprocessing={whole[:j]: whole[j:]})
    assert package_key(IMAGE, a) != package_key(IMAGE, b)


@settings(max_examples=50, deadline=None)
@given(image=st.text(min_size=1, max_size=70), extra=st.text(min_size=1, max_size=8))
def test_no_collision_when_text_shifts_from_image_hash_into_fingerprint(image, extra):
    # Moving characters from the end of the image hash to the start of model_id is a new pair.
    fp = base_fingerprint()
    shifted = base_fingerprint(model_id=extra + fp.model_id)
    assert package_key(image + extra, fp) != package_key(image, shifted)


@settings(max_examples=50, deadline=None)
@given(fp=fingerprints)
def test_from_json_round_trips_for_any_fingerprint(fp):
    again = EncoderFingerprint.from_json(fp.to_json())
    assert again == fp and package_key(IMAGE, again) == package_key(IMAGE, fp)


# -- tensor specs and packages -------------------------------------------------------------


def test_tensor_spec_names_dtype_and_shape_of_torch_tensors():
    torch = require_module("torch")
    tensors = {
        "pooler_output": torch.zeros(16, 1536, dtype=torch.bfloat16),
        "deepstack.0": torch.zeros(16, 1536, dtype=torch.float16),
        "image_grid_thw": torch.tensor([[1, 8, 8]], dtype=torch.int64),
    }
    spec = tensor_spec(tensors)
    assert list(spec) == sorted(tensors)
    assert spec["pooler_output"] == {"dtype": "bfloat16", "shape": [16, 1536]}
    assert spec["deepstack.0"] == {"dtype": "float16", "shape": [16, 1536]}
    assert spec["image_grid_thw"] == {"dtype": "int64", "shape": [1, 3]}
    json.dumps(spec)  # plain JSON, no torch objects inside


def test_tensor_spec_works_without_torch():
    spec = tensor_spec({"features": np.zeros((3, 4), np.float32), "scalar": np.zeros((), np.int8)})
    assert spec == {"features": {"dtype": "float32", "shape": [3, 4]}, "scalar": {"dtype": "int8", "shape": []}}


def test_tensor_spec_tells_layouts_of_the_same_bytes_apart():
    data = np.zeros(12, np.float32)
    assert tensor_spec({"x": data.reshape(3, 4)}) != tensor_spec({"x": data.reshape(4, 3)})
    assert tensor_spec({"x": data}) != tensor_spec({"y": data})
    assert tensor_spec({"x": data}) != tensor_spec({"x": data.view(np.int32)})


def test_visual_package_key_size_spec_and_header():
    torch = require_module("torch")
    fingerprint = base_fingerprint()
    package = VisualPackage(
        tensors={"features": torch.ones(4, 8, dtype=torch.bfloat16), "grid": torch.tensor([1, 2, 2])},
        metadata={"image_grid_thw": [[1, 2, 2]], "num_tokens": 4},
        image_sha256=IMAGE,
        fingerprint=fingerprint,
        created_at=1.0,
        encode_ms=12.5,
    )
    assert package.key == package_key(IMAGE, fingerprint)
    assert package.nbytes == 4 * 8 * 2 + 3 * 8
    header = json.loads(json.dumps(package.header()))
    assert header["spec"] == {"features": {"dtype": "bfloat16", "shape": [4, 8]}, "grid": {"dtype": "int64", "shape": [3]}}
    assert EncoderFingerprint.from_json(header["fingerprint"]) == fingerprint
    assert header["metadata"] == {"image_grid_thw": [[1, 2, 2]], "num_tokens": 4}
    assert header["image_sha256"] == IMAGE and header["encode_ms"] == 12.5


# -- reference ids -----------------------------------------------------------------------

GOOD_IDS = ["cat-01", "A", "9", "img_2024.06.01", "user@example.com", "x+y=z", "a.b", "a" * 128]
BAD_IDS = [
    "../x",
    "..",
    ".",
    "a/b",
    "/abs",
    "a\\b",
    "C:evil",
    "a..b",
    "",
    "a\0b",
    "a" * 129,
    ".hidden",
    "-rf",
    "a b",
    "abc\n",
    "\u0430bc",  # Cyrillic a
    "\uff41bc",  # fullwidth a
    "abc\u200b",  # zero-width space
    "caf\u00e9",
    "abc\u2215def",  # division slash, looks like '/'
    "%2e%2e",
]


@pytest.mark.parametrize("ref_id", GOOD_IDS)
def test_normal_reference_ids_are_accepted(ref_id):
    assert validate_ref_id(ref_id) == ref_id


@pytest.mark.parametrize("ref_id", BAD_IDS, ids=[repr(i)[:20] for i in BAD_IDS])
def test_path_tricks_and_lookalikes_are_refused(ref_id):
    with pytest.raises(InvalidReferenceIdError) as caught:
        validate_ref_id(ref_id)
    assert caught.value.input == ref_id
    assert isinstance(caught.value, RefsightError) and isinstance(caught.value, ValueError)


@pytest.mark.parametrize("ref_id", [None, 5, b"abc", ["abc"], 1.5])
def test_non_string_ids_are_refused(ref_id):
    with pytest.raises(InvalidReferenceIdError, match="must be a string"):
        validate_ref_id(ref_id)


@settings(max_examples=200, deadline=None)
@given(ref_id=st.text(max_size=140))
def test_accepted_ids_are_safe_as_file_names(ref_id):
    try:
        validate_ref_id(ref_id)
    except InvalidReferenceIdError:
        return
    assert 1 <= len(ref_id) <= 128 and ref_id.isascii()
    assert "/" not in ref_id and "\\" not in ref_id and ".." not in ref_id and "\0" not in ref_id
    assert not ref_id.startswith(".") and ref_id.isprintable() and ref_id.strip() == ref_id
