"""A fake backend that COUNTS what the compare pipeline asks of it (orchestration tests only).

It is not a model and proves nothing about model paths: it encodes like the toy backend,
answers verdict and attribute schemas with valid JSON, and scores yes/no from the
package's pixels. Every request is recorded so tests can count rerank scorings and
judge calls exactly.
"""

from __future__ import annotations

import json
from typing import Sequence

import numpy as np

from refsight.backends.base import Generation
from refsight.requests import GenerationRequest
from refsight.backends.toy import ToyBackend
from refsight.package import VisualPackage
from refsight.retrieval import Embedder


def pattern_of(image_sha256: str) -> str:
    """The fake's "colour pattern" of an image: decided by its hash, so recall (by pixels) cannot predict it."""
    return "tabby" if int(image_sha256[:8], 16) % 2 else "solid"


class CountingBackend(ToyBackend):
    """Toy encodes; valid JSON for every schema; P(yes) = mean pixel of the reference package."""

    supports_constrained_decoding = True
    random_weights = True

    def __init__(self, name: str = "counting", **_: object) -> None:
        super().__init__(name)
        self.judge_requests = 0
        self.attribute_requests = 0
        #: image hashes of the references scored, in order
        self.scored: list[str] = []

    def generate(self, requests: Sequence[GenerationRequest], *, return_logits: bool = False) -> list[Generation]:
        out = []
        for request in requests:
            props = (request.json_schema or {}).get("properties", {})
            package = request.packages[0]
            if "criteria" in props:
                self.judge_requests += 1
                items = props["criteria"]["prefixItems"]
                answer = {"criteria": [
                    {"criterion": it["properties"]["criterion"]["const"], "verdict": "match", "confidence": 0.9,
                     "evidence": "fake"} for it in items
                ]}
            else:
                self.attribute_requests += 1
                answer = {name: pattern_of(package.image_sha256) if name == "color_pattern" else "unknown" for name in props}
            out.append(Generation(json.dumps(answer), [], self.name, True))
        return out

    def score_yes_no(self, requests: Sequence[GenerationRequest]) -> list[float]:
        scores = []
        for request in requests:
            reference = request.segments[3]
            assert isinstance(reference, VisualPackage)
            self.scored.append(reference.image_sha256)
            scores.append(float(reference.tensors["features"].mean()))
        return scores


class PixelEmbedder(Embedder):
    """A 4x4 thumbnail as the vector: cheap and deterministic, for orchestration tests only."""

    name = "pixels-4x4"

    @property
    def dim(self) -> int:
        return 48

    def fingerprint(self) -> dict:
        return {"model": "pixels-4x4", "revision": "1"}

    def _embed_images(self, images):
        return np.stack([np.asarray(i.image.resize((4, 4)), np.float32).reshape(-1) + 1.0 for i in images])

    def _embed_texts(self, texts, instruction):
        # No text side: a zero vector, so a "both" recall query ranks by the image alone.
        return np.zeros((len(texts), self.dim), np.float32)
