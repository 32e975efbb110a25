"""Quantized GGUFs (llama.cpp's own quantizer, Q8_0 and Q4_K_M, beside an f16 mmproj): keyed apart, cached == fresh.

The tiny Qwen2-VL is converted to f16 (model and mmproj), then its language model is
quantized with ``llama_model_quantize`` (:mod:`refsight.builtin_models.gguf_quantized`).
On each quantization: the file says its type, the fingerprint and every package key
differ from the f16 model's and from each other's (a package of one is refused by the
other); the cached path, from packages on disk in a NEW process, equals llama.cpp's own
pixel path bit for bit (tokens, and logits with max |Δ| exactly 0; also on a Q4_K_M model
whose 256-wide rows take the repacked K-quant kernels); and the reference
prefix's KV state, built here and restored from disk in a new process, gives the same
tokens and logits as evaluating the prefix.
"""

from __future__ import annotations

import numpy as np
import pytest
from llama_models import PROMPTS, require_llama_cpp
from llama_workers import pixel_path_rows, stored_proofs

require_llama_cpp()

QUANTIZED = {"tiny-qwen2-vl-gguf-q8": 7, "tiny-qwen2-vl-gguf-q4": 15}  # name -> general.file_type (llama_ftype)
#: The tiny model's 64-wide rows fall back to Q5_0; 256-wide rows take real Q4_K / Q6_K (repacked) kernels.
EQUIVALENCE = (*QUANTIZED, "tiny-qwen2-vl-256-gguf-q4")
BASE = "tiny-qwen2-vl-gguf-f16"
REFS = ("chelsea", "coffee")
CANDIDATE = "rocket"
RUBRICS = ("same colour", "a round shape")
MAX_NEW_TOKENS = 6


@pytest.fixture(scope="module")
def f16(gguf_files):
    """The f16 base, loaded by path like a downloaded GGUF."""
    from refsight.backends.registry import get_backend

    model, mmproj = gguf_files(BASE)
    return get_backend(f"llamacpp:{model}", mmproj=str(mmproj))


def test_the_quantization_is_in_the_file_the_fingerprint_and_every_key(gguf, f16, photos):
    from refsight.errors import CorruptPackageError

    backends = {"f16": f16, **{name: gguf(name) for name in QUANTIZED}}
    assert f16.runtime.meta("general.file_type") == "1"
    for name, ftype in QUANTIZED.items():
        assert backends[name].runtime.meta("general.file_type") == str(ftype)
        assert backends[name].mmproj_path.samefile(f16.mmproj_path)  # the f16 mmproj, unchanged
    assert len({b.fingerprint().digest for b in backends.values()}) == 3
    packages = {name: b.encode([photos[REFS[0]]])[0] for name, b in backends.items()}
    assert len({p.key for p in packages.values()}) == 3
    with pytest.raises(CorruptPackageError, match="gguf_sha256"):
        backends["tiny-qwen2-vl-gguf-q4"].validate_package(packages["tiny-qwen2-vl-gguf-q8"])


@pytest.fixture(scope="module")
def from_disk(gguf, photos, tmp_path_factory):
    """Per quantization: packages stored, prefix states built here; a new process replays both from disk."""
    return stored_proofs(
        gguf, photos, tmp_path_factory.mktemp("llama-quantized"), EQUIVALENCE, n_refs=(len(REFS),), refs=REFS,
        candidate=CANDIDATE, rubrics=RUBRICS, max_new_tokens=MAX_NEW_TOKENS,
    )


@pytest.mark.parametrize("name", EQUIVALENCE)
def test_cached_path_from_disk_equals_llama_cpps_pixel_path_on_a_quantized_model(from_disk, gguf, photos, name):
    _, cached, _ = from_disk
    backend = gguf(name)
    fresh = pixel_path_rows(backend, PROMPTS["tiny-qwen2-vl-gguf"], photos, REFS, CANDIDATE, MAX_NEW_TOKENS)
    got = cached[f"{name}/{len(REFS)}"]
    for row, (tokens, logits) in zip(got["rows"], fresh, strict=True):
        assert row["tokens"] == tokens
        assert np.abs(row["logits"].numpy() - logits).max() == 0.0
    # Only the candidate reached the vision encoder (once per prompt).
    assert got["encode_calls"] == 2 * len(backend.encode([photos[CANDIDATE]])[0].tensors)


@pytest.mark.parametrize("name", EQUIVALENCE)
def test_prefix_states_are_valid_on_a_quantized_model_here_and_from_disk(from_disk, name):
    here, _, prefix = from_disk
    for plain, cached, loaded in zip(here[name]["plain"], here[name]["cached"], prefix[name], strict=True):
        assert plain["tokens"] == cached["tokens"] == loaded["tokens"]
        assert (plain["logits"] - cached["logits"]).abs().max().item() == 0.0
        assert (plain["logits"] - loaded["logits"]).abs().max().item() == 0.0
        assert loaded["restores"] == 1 and loaded["cached_tokens"] > 0
        assert loaded["decoded"] == loaded["prompt_tokens"] - loaded["cached_tokens"]
    assert here[name]["cached"][0]["restores"] == 0 and here[name]["cached"][1]["restores"] == 1
