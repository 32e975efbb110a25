"""Helpers shared by the judge tests (a module, not conftest: importable by a unique name)."""

from __future__ import annotations

from typing import Sequence

from PIL import Image

from refsight.backends.base import Backend, Generation
from refsight.requests import GenerationRequest
from refsight.inputs.images import ImageInput, load_image
from refsight.package import EncoderFingerprint, VisualPackage


def photo(name: str, size: tuple[int, int] | None = None, flip: bool = False) -> ImageInput:
    """A bundled real photo (``refsight.samples``) as an ImageInput (optionally resized or mirrored)."""
    from refsight.samples import load_sample

    image = load_sample(name, size)
    if flip:
        image = image.transpose(Image.FLIP_LEFT_RIGHT)
    return load_image(image, name=name + ("-flipped" if flip else ""))


def fake_package(name: str = "ref") -> VisualPackage:
    """A package with no tensors, for orchestration tests that never run a model."""
    fp = EncoderFingerprint(backend="fake", model_id="fake", revision="1", dtype="float32")
    return VisualPackage(tensors={}, metadata={"num_tokens": 1}, image_sha256=name * 4, fingerprint=fp)


class ScriptedBackend(Backend):
    """Answers from a script: ``answers(request) -> text``; records every request it gets.

    Orchestration only (retry, batching, counting): the tiny-model tests are the proof
    that the real paths produce valid JSON.
    """

    supports_constrained_decoding = False
    random_weights = True

    def __init__(self, answers, *, batch_size: int = 4, constrained: bool = False) -> None:
        super().__init__("scripted")
        self.answers = answers
        self.batch_size = batch_size
        self.supports_constrained_decoding = constrained
        self.requests: list[GenerationRequest] = []
        self.batches: list[int] = []

    def fingerprint(self) -> EncoderFingerprint:
        return EncoderFingerprint(backend="fake", model_id="fake", revision="1", dtype="float32")

    def encode(self, images: Sequence[ImageInput]) -> list[VisualPackage]:
        raise AssertionError("the judge never encodes")

    def generate(self, requests: Sequence[GenerationRequest], *, return_logits: bool = False) -> list[Generation]:
        self.batches.append(len(requests))
        self.requests += list(requests)
        return [
            Generation(text=self.answers(r), token_ids=[], model=self.name, random_weights=True) for r in requests
        ]
