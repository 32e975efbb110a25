"""Retrieval: recall a shortlist of references by text or image before any VLM runs.

* :class:`Retriever` – embed each reference once (cached per image and embedder), index it
  per namespace, search by text or image with metadata filters.
* :class:`Embedder` and implementations in :mod:`refsight.retrieval.embedders`;
  :func:`default_embedder` is the offline EfficientNet-Lite0 + MiniLM ConSE embedder.
* :mod:`refsight.retrieval.index` – exact search below 10,000 vectors, hnswlib HNSW above.

Nothing here imports torch or ``refsight.backends`` at import time.
"""

from refsight.retrieval.embedders import ClipEmbedder, EfficientNetConSEEmbedder, Embedder, VlmEmbedder, default_embedder
from refsight.retrieval.retriever import Retriever

__all__ = ["Retriever", "Embedder", "default_embedder", "EfficientNetConSEEmbedder", "ClipEmbedder", "VlmEmbedder"]
