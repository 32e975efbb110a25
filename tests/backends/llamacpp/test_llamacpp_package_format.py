"""The llama.cpp visual package: per-chunk float32 embeddings + the chunk layout, checked before use."""

from __future__ import annotations

import copy

import pytest
from llama_models import require_llama_cpp

from refsight.requests import GenerationRequest
from refsight.errors import CorruptPackageError

require_llama_cpp()
pytestmark = pytest.mark.slow  # converts the tiny models to GGUF (llama-cpp-python: an optional runtime)


def test_qwen_image_is_one_chunk_smolvlm_several_with_text_between(gguf, photos):
    qwen = gguf("tiny-qwen2-vl-gguf").encode([photos["chelsea"]])[0]
    smol = gguf("tiny-smolvlm-gguf").encode([photos["chelsea"]])[0]
    assert [c["type"] for c in qwen.metadata["chunks"]] == ["text", "image", "text"]
    assert len(qwen.tensors) == 1
    assert len(smol.tensors) > 1  # tiles + the overview
    kinds = [c["type"] for c in smol.metadata["chunks"]]
    assert kinds.count("image") == len(smol.tensors)
    # Row/column markers sit between the tiles: text chunks alternate with image chunks.
    assert all(a != b for a, b in zip(kinds, kinds[1:]))
    for package, backend in ((qwen, gguf("tiny-qwen2-vl-gguf")), (smol, gguf("tiny-smolvlm-gguf"))):
        assert package.metadata["image_size"] == list(photos["chelsea"].image.size)
        for c in package.metadata["chunks"]:
            if c["type"] == "image":
                tensor = package.tensors[c["tensor"]]
                assert str(tensor.dtype) == "torch.float32"
                assert list(tensor.shape) == [c["n_tokens"], backend.runtime.n_embd_inp]


def test_a_package_whose_layout_mtmd_would_not_produce_is_refused(gguf, photos):
    backend = gguf("tiny-qwen2-vl-gguf")
    package = backend.encode([photos["chelsea"]])[0]
    bad = copy.copy(package)
    bad.metadata = copy.deepcopy(package.metadata)
    bad.metadata["image_size"] = [400, 300]  # mtmd lays a larger image out in more tokens
    with pytest.raises(CorruptPackageError, match="lays this image out"):
        backend.generate([GenerationRequest([bad, "?"], max_new_tokens=2)])


def test_tensors_that_disagree_with_the_metadata_are_refused(gguf, photos):
    backend = gguf("tiny-qwen2-vl-gguf")
    package = backend.encode([photos["chelsea"]])[0]
    bad = copy.copy(package)
    bad.tensors = {k: v[:-1] for k, v in package.tensors.items()}
    with pytest.raises(CorruptPackageError, match="shape"):
        backend.validate_package(bad)
    with pytest.raises(CorruptPackageError):
        backend.generate([GenerationRequest([bad, "?"], max_new_tokens=2)])
