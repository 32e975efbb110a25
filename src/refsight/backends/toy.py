"""A tiny deterministic encoder for tests of storage and orchestration.

It is *not* a model: its "features" are the image downsampled to 8×8 RGB, and it
generates a fixed echo. Use it only where the model does not matter; the
transformers backends are the proof that real model paths work.
"""

from __future__ import annotations

import time
from typing import Sequence

from ..inputs.images import ImageInput
from ..package import EncoderFingerprint, VisualPackage
from .base import Backend, Execution, Generation, PreparedRequest

__all__ = ["ToyBackend"]


class ToyBackend(Backend):
    """8×8 pixel "features"; counts its encodes in ``encode_calls``."""

    random_weights = True  # its output carries no meaning

    def __init__(self, name: str = "toy", *, grid: int = 8) -> None:
        super().__init__(name)
        self.grid = int(grid)
        self.encode_calls = 0
        self.images_encoded = 0

    def fingerprint(self) -> EncoderFingerprint:
        """Fixed revision; the grid size is its only preprocessing setting."""
        return EncoderFingerprint(
            backend="toy", model_id=self.name, revision="toy-1", dtype="float32", preprocessing={"grid": self.grid}
        )

    def encode(self, images: Sequence[ImageInput]) -> list[VisualPackage]:
        """Downsample each image to ``grid × grid`` and keep it as a float tensor."""
        import numpy as np
        import torch

        self.encode_calls += 1
        packages = []
        for image in images:
            start = time.perf_counter()
            small = image.image.resize((self.grid, self.grid))
            features = torch.from_numpy(np.asarray(small, dtype=np.float32).reshape(-1, 3) / 255.0)
            packages.append(
                VisualPackage(
                    tensors={"features": features},
                    metadata={"num_tokens": self.grid * self.grid, "grid": self.grid},
                    image_sha256=image.sha256,
                    fingerprint=self.fingerprint(),
                    encode_ms=(time.perf_counter() - start) * 1000,
                )
            )
            self.images_encoded += 1
        return packages

    def chat_template_reads(self, variable: str) -> bool:
        """False: the echo has no template."""
        return False

    def execute(self, batch: list[PreparedRequest], execution: Execution) -> list[Generation]:
        """Echo the text segments and the number of images; not a model."""
        results = []
        for prepared in batch:
            segments = prepared.segments
            text = " ".join(s for s in segments if isinstance(s, str))
            n_images = len(segments) - sum(isinstance(s, str) for s in segments)
            results.append(
                Generation(text=f"[toy] {n_images} images: {text}"[:200], token_ids=[], model=self.name, random_weights=True)
            )
        return results
