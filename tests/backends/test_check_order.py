"""The order of a backend's own checks (``Backend.check_request``), and the callbacks it refuses before any work."""

from __future__ import annotations

import pytest
from PIL import Image

from refsight.backends.toy import ToyBackend
from refsight.errors import ContextLengthError, CorruptPackageError, InvalidInputError
from refsight.inputs.images import load_image
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


@pytest.mark.parametrize("streamed", [True, False])
def test_a_prompt_progress_callback_that_would_never_be_called_is_refused(streamed):
    # The toy reports no prompt evaluation; no backend reports one for a generation that is not streamed.
    backend = ToyBackend("toy")
    request = GenerationRequest(["Which colour?"], max_new_tokens=4)
    on_text = (lambda piece: None) if streamed else None
    with pytest.raises(InvalidInputError, match="does not report a prompt's evaluation") as info:
        backend.generate_one(request, on_text=on_text, on_prompt=lambda *counts: None)
    assert info.value.input == "on_prompt"
    if streamed:
        with pytest.raises(InvalidInputError):
            backend.generate_stream(request, on_text=on_text, on_prompt=lambda *counts: None)


def test_a_backend_that_reports_prompt_progress_does_so_only_while_streaming(load):
    backend = load("tiny-qwen2-vl")
    request = GenerationRequest(["Which colour?"], max_new_tokens=2)
    heard = []
    backend.generate_one(request, on_text=lambda piece: None, on_prompt=lambda *counts: heard.append(counts))
    assert heard and heard[-1][0] == heard[-1][2]  # the whole prompt evaluated, as it ends
    with pytest.raises(InvalidInputError, match="streamed only") as info:
        backend.generate_one(request, on_prompt=lambda *counts: heard.append(counts))  # before: never called, no word
    assert info.value.input == "on_prompt"
