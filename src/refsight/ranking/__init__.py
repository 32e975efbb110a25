"""The retrieval stage served on its own, for the tools people already run (a vector database, LangChain, a
reranker client): vectors of texts, images and stored references (:mod:`.embeddings`, an image's vector durable
like a package), and documents scored against a query (:mod:`.rerank`: the model's P("yes") with cached packages,
or an embedding cosine). Their requests and results are :mod:`.requests`; the engine's front doors are
:meth:`refsight.Engine.embed` and :meth:`refsight.Engine.rerank`, over one :class:`Ranking`.
"""

from __future__ import annotations

from ..cache.packages import PackageCache
from ..context import RequestContext
from ..references import ReferenceBook
from ..retrieval.store_index import StoreIndex
from .embeddings import Embeddings
from .requests import EmbedRequest, EmbedResult, RerankRequest, RerankResult
from .rerank import Reranking

__all__ = ["EmbedRequest", "EmbedResult", "Embeddings", "Ranking", "RerankRequest", "RerankResult", "Reranking"]


class Ranking:
    """The engine's part for both: :class:`Embeddings` over its reference book, package cache and store index, and
    :class:`Reranking` over those embeddings."""

    def __init__(self, book: ReferenceBook, packages: PackageCache, retrieval: StoreIndex) -> None:
        self.embeddings = Embeddings(book, packages, retrieval)
        self.reranking = Reranking(book, self.embeddings)

    def embed(self, context: RequestContext, request: EmbedRequest) -> EmbedResult:
        """:meth:`Embeddings.embed`."""
        return self.embeddings.embed(context, request)

    def rerank(self, context: RequestContext, request: RerankRequest) -> RerankResult:
        """:meth:`Reranking.rerank`."""
        return self.reranking.rerank(context, request)
