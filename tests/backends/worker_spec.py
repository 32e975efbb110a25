"""The request spec the new-process equivalence workers share (HF, llama.cpp, vLLM).

A case's ``rows`` are lists of segments: ``{"text": ...}``, ``{"ref": package key}`` (read
from the store's disk tier: the worker's memory tier starts empty) or ``{"image": path}``
(a fresh candidate). Imported by the workers, which run as scripts: the llama.cpp and vLLM
ones put this directory on ``sys.path`` first.
"""

from __future__ import annotations

from typing import Any


def case_requests(store: Any, case: dict[str, Any]) -> list[Any]:
    """The case's :class:`GenerationRequest` list; a package missing from ``store`` ends the worker, naming it."""
    from refsight.backends.base import GenerationRequest
    from refsight.images import load_image

    requests = []
    for row in case["rows"]:
        segments: list[Any] = []
        for segment in row:
            if "text" in segment:
                segments.append(segment["text"])
            elif "ref" in segment:
                package = store.packages.get(segment["ref"])
                if package is None:
                    raise SystemExit(f"package {segment['ref']} missing from the store")
                segments.append(package)
            else:
                segments.append(load_image(segment["image"]))
        requests.append(GenerationRequest(segments, max_new_tokens=case["max_new_tokens"]))
    return requests
