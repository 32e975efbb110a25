"""Architecture guard: the package key derivation is frozen (stored packages are found by it)."""

from __future__ import annotations

import pytest

from refsight.package import PACKAGE_FORMAT_VERSION, EncoderFingerprint, package_key


#: The key derivation as of PACKAGE_FORMAT_VERSION 1. Stored packages are found by these keys:
#: a change that moves them silently orphans every store on disk.
GOLDEN_FORMAT_VERSION = 1
GOLDEN_IMAGE_SHA256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
GOLDEN_KEY = "0eba6105f4d0a46cb5bd3c2ab31fd9834b1978627dc9bb2c630bfea9c788544c"
GOLDEN_SCOPED_KEY = "689fbaf00a38502c660f357c2212ea3c7037a68859e93e6bd15348d688a3911f"  # scope "tenant-a"


def _golden_fingerprint() -> EncoderFingerprint:
    return EncoderFingerprint(
        backend="hf",
        model_id="Qwen/Qwen2-VL-2B-Instruct",
        revision="895c3a49bc3fa70a340399125c650a463535e71c",
        dtype="bfloat16",
        preprocessing={"min_pixels": 3136, "max_pixels": 12845056, "patch_size": 14, "merge_size": 2,
                       "image_mean": [0.48145466, 0.4578275, 0.40821073]},
    )


def test_package_key_derivation_is_frozen():
    keys = (
        package_key(GOLDEN_IMAGE_SHA256, _golden_fingerprint()),
        package_key(GOLDEN_IMAGE_SHA256, _golden_fingerprint(), "tenant-a"),
    )
    if PACKAGE_FORMAT_VERSION != GOLDEN_FORMAT_VERSION:
        # A bumped format version must give new keys (old packages are then re-encoded, not misread).
        assert keys[0] != GOLDEN_KEY and keys[1] != GOLDEN_SCOPED_KEY, (
            f"PACKAGE_FORMAT_VERSION is {PACKAGE_FORMAT_VERSION} but the keys equal those of version "
            f"{GOLDEN_FORMAT_VERSION}: the version no longer reaches the key"
        )
        pytest.skip(
            f"PACKAGE_FORMAT_VERSION moved from {GOLDEN_FORMAT_VERSION} to {PACKAGE_FORMAT_VERSION}: record the new "
            f"keys here (GOLDEN_FORMAT_VERSION = {PACKAGE_FORMAT_VERSION}, GOLDEN_KEY = {keys[0]!r}, "
            f"GOLDEN_SCOPED_KEY = {keys[1]!r})"
        )
    assert keys == (GOLDEN_KEY, GOLDEN_SCOPED_KEY), (
        "package_key() no longer derives the frozen keys, so every stored package would be orphaned. "
        "If the change is intended, bump PACKAGE_FORMAT_VERSION in src/refsight/package.py "
        f"(then record the new keys here); got {keys}"
    )
