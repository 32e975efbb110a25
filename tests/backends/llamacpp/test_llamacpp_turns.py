"""Conversations on llama.cpp: turns rendered in the GGUF's own chat template, cached == pixel path."""

from __future__ import annotations

import pytest
from llama_models import PROMPTS, require_llama_cpp

from refsight.requests import GenerationRequest

require_llama_cpp()
pytestmark = pytest.mark.slow  # converts the tiny models to GGUF (llama-cpp-python: an optional runtime)

TURNS = [("system", 1), ("user", 2), ("assistant", 1), ("user", 1)]


def _segments(image) -> list:
    return ["You compare animals.", image, "What is it?", "A cat.", "Sure?"]


@pytest.mark.parametrize("name", ["tiny-qwen2-vl-gguf", "tiny-smolvlm-gguf"])
def test_turns_render_in_the_gguf_template_and_cached_equals_pixels(gguf, photos, name):
    backend = gguf(name)
    assert backend.supports_turns
    image = photos["chelsea"]
    package = backend.encode([image])[0]
    marker = backend.runtime.marker
    text = backend.prompt_text(_segments(package), TURNS)
    # every turn is there, in order, in the template's own words (and one user turn renders as before)
    assert text.index("You compare animals.") < text.index(marker) < text.index("A cat.") < text.index("Sure?")
    assert backend.prompt_text(["Hi ", package]) == PROMPTS[name].format("Hi " + marker)
    if name.startswith("tiny-qwen"):
        assert "<|im_start|>system\nYou compare animals.<|im_end|>" in text
        assert "<|im_start|>assistant\nA cat.<|im_end|>" in text
    cached = backend.generate([GenerationRequest(_segments(package), max_new_tokens=6, turns=TURNS)], return_logits=True)[0]
    fresh = backend.generate([GenerationRequest(_segments(image), max_new_tokens=6, turns=TURNS)], return_logits=True)[0]
    assert cached.token_ids == fresh.token_ids
    assert float((cached.logits - fresh.logits).abs().max()) == 0.0
