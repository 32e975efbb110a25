"""The vLLM backend counts an image's prompt tokens as the transformers backend of the same weights does
(issue 38: the prompt limit counts images), before anything is sent: no vLLM server needed.

Qwen's count comes from the grid (a package's, or the one pixels resize to); every other family's from
its processor's placeholder for the image's size (a source-pixel package keeps the size). The vLLM
backend here is built around its encoder with no client: counting never talks to the server.
"""

from __future__ import annotations

import pytest

from refsight.backends.vllm.backend import VLLMBackend

#: (tiny vLLM model, whether its server encodes pixels): Qwen's grid either way, a processor's expansion, tiles.
CASES = (("tiny-qwen2-vl-vllm", True), ("tiny-qwen2-vl-vllm", False), ("tiny-gemma3-vllm", True),
         ("tiny-mistral3-vllm", True), ("tiny-smolvlm-vllm", True))
SIZES = ((64, 48), (256, 192), (13, 300))


def _backends(model: str, pixels: bool):
    """(the model's transformers backend, a vLLM backend around it with no client: counting sends nothing)."""
    from refsight.backends.registry import get_backend

    encoder = get_backend(model)  # built once per process
    return encoder, VLLMBackend("vllm:counting", client=None, served_model="m", encoder=encoder, encodes_images=pixels)


def _photo(size: tuple[int, int]):
    from refsight.inputs.images import load_image
    from refsight.samples import load_sample

    return load_image(load_sample("chelsea").resize(size), name=f"chelsea-{size[0]}x{size[1]}")


@pytest.mark.parametrize(("model", "pixels"), CASES)
def test_an_image_counts_as_on_transformers(model, pixels):
    encoder, vllm = _backends(model, pixels)
    for size in SIZES:
        image = _photo(size)
        expected = encoder.image_token_count(encoder.encode([image])[0])
        assert expected and expected > 0, size
        assert vllm.image_token_count(image) == expected, size  # new pixels, by their size
        assert vllm.image_token_count(vllm.encode([image])[0]) == expected, size  # a stored package


def test_a_source_pixel_package_without_its_size_is_not_counted():
    import dataclasses

    _, vllm = _backends("tiny-gemma3-vllm", True)
    package = vllm.encode([_photo((64, 48))])[0]
    sizeless = dataclasses.replace(package, metadata={k: v for k, v in package.metadata.items() if k != "size"})
    assert vllm.image_token_count(sizeless) is None
