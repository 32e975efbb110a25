"""Retrieval: recall a shortlist of references by text or image before any VLM runs.

* :class:`Retriever` – embed each reference once (cached per image and embedder), index it
  per namespace, search by text or image with metadata filters.
* :class:`Embedder` – the interface (:mod:`refsight.embedders.base`); the implementations
  live in :mod:`refsight.embedders` and are named through :func:`refsight.embedders.get_embedder`.
  :func:`default_embedder` is the offline EfficientNet-Lite0 + MiniLM ConSE embedder.
* :mod:`refsight.retrieval.index` – exact search below 10,000 vectors, hnswlib HNSW above.

Nothing here imports torch or ``refsight.backends``.
"""

from refsight.embedders.registry import default_embedder
from refsight.embedders.base import Embedder
from refsight.retrieval.retriever import Retriever

__all__ = ["Embedder", "Retriever", "default_embedder"]
