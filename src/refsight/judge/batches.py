"""Generation requests sent in the backend's batch size: the judge and the VLM attribute source share it."""

from __future__ import annotations

from collections.abc import Sequence

from ..backends.base import Backend
from ..requests import GenerationRequest
from ..errors import BackendError

__all__ = ["generate_texts"]


def generate_texts(backend: Backend, requests: Sequence[GenerationRequest]) -> list[str]:
    """The answer text of each request, in order, ``batch_size`` requests per ``backend.generate`` call."""
    texts: list[str] = []
    step = max(1, int(getattr(backend, "batch_size", 1) or 1))
    for start in range(0, len(requests), step):
        chunk = list(requests[start : start + step])
        generations = backend.generate(chunk)
        if len(generations) != len(chunk):
            raise BackendError(backend.name, f"returned {len(generations)} results for {len(chunk)} requests")
        texts += [g.text for g in generations]
    return texts
