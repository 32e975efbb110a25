"""The order of a backend's own checks (``Backend.check_request``): the packages, then the prompt they are counted in."""

from __future__ import annotations

import pytest
from PIL import Image

from refsight.backends.toy import ToyBackend
from refsight.errors import ContextLengthError, CorruptPackageError
from refsight.images import load_image
from refsight.requests import GenerationRequest


def test_a_package_from_another_encoder_is_named_before_the_prompt_is_counted_with_it():
    backend, other = ToyBackend("toy"), ToyBackend("toy", grid=4)
    foreign = other.encode([load_image(Image.new("RGB", (16, 16), "red"))])[0]
    too_long = GenerationRequest([foreign, "Which colour? " * 40], max_new_tokens=4, max_prompt_tokens=8)
    with pytest.raises(CorruptPackageError) as info:
        backend.generate([too_long])
    assert foreign.key in str(info.value) and "differs in: preprocessing" in str(info.value)
    # The same prompt with the backend's own package: its size is what is refused.
    own = backend.encode([load_image(Image.new("RGB", (16, 16), "red"))])[0]
    with pytest.raises(ContextLengthError):
        backend.generate([GenerationRequest([own, "Which colour? " * 40], max_new_tokens=4, max_prompt_tokens=8)])
