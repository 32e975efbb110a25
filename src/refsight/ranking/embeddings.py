"""Vectors of inputs (:meth:`refsight.Engine.embed`): texts, images and stored references, an image's vector durable.

**An image's vector is kept like a package.** It is stored in the retrieval database's vector cache
(:class:`~refsight.retrieval.vectors.VectorDB`) under the image's content hash and the embedder's digest (its
fingerprint: model, weights, preprocessing), salted by the namespace where tenants are isolated
(:func:`~refsight.retrieval.vectors.vector_key`) — the very rows recall reads a reference's vector from. So a vector
database that re-indexes the same photos, an image sent again, or a reference embedded for recall costs no encoder;
concurrent requests for the same new image embed it once (a lock per key). Images sent inline are kept under every
``remember_images`` policy but ``off`` (:mod:`refsight.settings.remembering`: a server that must keep nothing a
client sends keeps no vector either); a stored reference's always.

**An input of several parts** (texts and images): an embedder that reads them together (``joint``: the VLM
embedder, one pass over the instruction, the texts and the images' packages) embeds it whole; any other gives the
normalised sum of its text's vector (the texts joined as they are) and each image's, the rule a compare's recall
query ``both`` follows (:mod:`refsight.retrieval.query`). An input that is one image takes the cached path either way.

**Tokens.** A text's tokens are counted in the embedder's own vocabulary (``text_tokens``); one longer than the
embedder reads (``max_tokens``: MiniLM's 256) is refused, naming the input, unless the request truncates (the
model then cuts it, as sentence-transformers does). Images count no tokens (a stored vector reads none).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..cache.packages import PackageCache
from ..context import RequestContext
from ..embedders.base import Embedder, l2_normalise
from ..errors import InvalidInputError, ModelLoadError
from ..inputs.images import ImageInput
from ..references import ReferenceBook, ReferenceSegment
from ..retrieval.store_index import StoreIndex
from ..retrieval.vectors import vector_key
from ..store import Reference
from ..support.locks import KeyedLocks
from .requests import EmbedRequest, EmbedResult, is_token_id

__all__ = ["Embeddings", "VLM_EMBEDDER_PREFIX", "check_dimensions"]

#: An embedder named ``vlm:MODEL`` with the request's own model is that model, already loaded (the VLM2Vec recipe).
VLM_EMBEDDER_PREFIX = "vlm:"

#: Most special tokens an embedder adds around a text (BERT's ``[CLS]`` and ``[SEP]``: 2), with room to spare.
_MOST_SPECIAL = 8

#: A key's lock while its vector is computed: the same new image, sent by two requests at once, embeds once.
VECTOR_LOCKS = KeyedLocks()


@dataclass
class _Input:
    """One input taken apart: its texts joined, its images (decoded, or stored references) in order."""

    text: str
    images: list[Any]

    @property
    def lone_image(self) -> bool:
        """Whether the input is one image and nothing else (its vector is the cached one, whatever the embedder)."""
        return not self.text.strip() and len(self.images) == 1

    @property
    def mixed(self) -> bool:
        """Whether the input holds images and more (text, or other images): what a joint embedder reads whole."""
        return bool(self.images) and not self.lone_image


class Embeddings:
    """Embeds a request's inputs over the engine's parts: the reference book (references, decoding), the package cache
    (a VLM's packages) and the store index (its embedder and the vector cache)."""

    def __init__(self, book: ReferenceBook, packages: PackageCache, retrieval: StoreIndex) -> None:
        self.book = book
        self.packages = packages
        self.retrieval = retrieval

    def embedder(self, context: RequestContext, name: str | None) -> Embedder:
        """The embedder ``name`` means for this context: None the engine's, ``vlm:`` + the context's model that model's
        last-token embedder (a 400 naming ``embedder`` where its runtime gives no hidden states), else the registry's."""
        if name is None or name == self.retrieval.registry_name:
            return self.retrieval.embedder()
        if name == VLM_EMBEDDER_PREFIX + context.model:
            from ..embedders.vlm_embedder import VlmEmbedder

            try:
                return VlmEmbedder(context.backend())
            except ModelLoadError as exc:
                raise InvalidInputError("embedder", f"{context.model} cannot embed: {exc.reason}") from None
        from ..embedders.registry import get_embedder

        return get_embedder(name)

    def embed(self, context: RequestContext, request: EmbedRequest) -> EmbedResult:
        """One unit vector per input (see the module docstring), cut to ``request.dimensions``."""
        embedder = self.embedder(context, request.embedder)
        check_dimensions(embedder, request.dimensions)
        inputs, named = self.taken_apart(context, request.inputs, "inputs", embedder)
        tokens = count_tokens(embedder, [item.text for item in inputs], request.truncate, "inputs")
        vectors, cached = self.vectors(context, embedder, inputs, named)
        if request.dimensions not in (None, embedder.dim):
            vectors = l2_normalise(vectors[:, : request.dimensions])
        return EmbedResult(vectors, embedder.name, embedder.random_weights, tokens, tuple(cached))

    def taken_apart(
        self, context: RequestContext, inputs: Sequence[Sequence[Any]], name: str, embedder: Embedder,
    ) -> tuple[list[_Input], dict[str, Reference]]:
        """Each input's texts (token ids read as text: :func:`ids_as_text`) and images, every reference read once and
        every image decoded and checked (a bad one is refused before any model work), and the references by id."""
        parts = [part for item in inputs for part in item]
        named = self.book.named_references(parts, namespace=context.namespace)
        taken = []
        for i, item in enumerate(inputs):
            decoded = self.book.decode_images(ids_as_text(embedder, item, f"{name}[{i}]"))
            taken.append(_Input("".join(p for p in decoded if isinstance(p, str)),
                                [p for p in decoded if not isinstance(p, str)]))
        return taken, named

    def vectors(
        self, context: RequestContext, embedder: Embedder, inputs: list[_Input], named: dict[str, Reference],
    ) -> tuple[np.ndarray, list[bool]]:
        """One unit vector per input, and per image embedded through the cache whether its vector was stored."""
        read_whole = [embedder.joint and item.mixed for item in inputs]
        whole = [i for i, read in enumerate(read_whole) if read]
        apart = [i for i, read in enumerate(read_whole) if not read]
        image_vectors, cached = self.image_vectors(context, embedder, [im for i in apart for im in inputs[i].images], named)
        text_vectors = _text_vectors(embedder, {i: inputs[i].text for i in apart})
        joint = dict(zip(whole, self._read_whole(context, embedder, [inputs[i] for i in whole], named)))
        return l2_normalise(np.stack(_summed(inputs, joint, text_vectors, image_vectors))), cached

    def image_vectors(
        self, context: RequestContext, embedder: Embedder, images: list[Any], named: dict[str, Reference],
    ) -> tuple[list[np.ndarray], list[bool]]:
        """Each image's unit vector, from the vector cache where it is there (else embedded now, and kept: see the
        module docstring), and whether it came from the cache."""
        shas = [named[im.ref_id].image_sha256 if isinstance(im, ReferenceSegment) else im.sha256 for im in images]
        if not context.use_cache:
            fresh = self._embed_images(context, embedder, dict(zip(shas, images)), named)
            return [fresh[sha] for sha in shas], [False] * len(shas)
        database, key = self.retrieval.vector_db(), vector_key(embedder.digest, context.scope)
        found = database.get_vectors(key, list(dict.fromkeys(shas)))
        missing = {sha: image for sha, image in zip(shas, images) if sha not in found}
        fresh = self._embed_missing(context, embedder, (database, key), missing, found, named)
        return [found.get(sha, fresh.get(sha)) for sha in shas], [sha in found for sha in shas]

    def _embed_missing(
        self, context: RequestContext, embedder: Embedder, where: tuple[Any, str], missing: dict[str, Any],
        found: dict[str, np.ndarray], named: dict[str, Reference],
    ) -> dict[str, np.ndarray]:
        """The vectors of the ``missing`` images (by content hash) embedded now, each under its key's lock, and kept
        in the vector cache (``where``: the database and the key) where they may be; ``found`` gains those another
        request stored meanwhile."""
        database, key = where
        with ExitStack() as held:
            for sha in sorted(missing):  # in one order, so two requests never wait on each other
                held.enter_context(VECTOR_LOCKS.hold(f"{key}/{sha}"))
            found.update(database.get_vectors(key, list(missing)))  # another request may have embedded them meanwhile
            still = {sha: image for sha, image in missing.items() if sha not in found}
            fresh = self._embed_images(context, embedder, still, named) if still else {}
            kept = {sha: v for sha, v in fresh.items() if self._keeps(still[sha])}
            if kept:
                database.put_vectors(key, kept)
        return fresh

    def _keeps(self, image: Any) -> bool:
        """Whether an image's vector is kept: a reference's always, one sent inline unless ``remember_images`` is off."""
        return isinstance(image, ReferenceSegment) or self.packages.remember_images != "off"

    def _embed_images(
        self, context: RequestContext, embedder: Embedder, images: dict[str, Any], named: dict[str, Reference],
    ) -> dict[str, np.ndarray]:
        """Vectors of these images by content hash, embedded now (a VLM's from the images' packages)."""
        if not images:
            return {}
        if embedder.joint:  # the VLM's packages (pixels with use_cache=False: all or none are)
            served = [self._served(context, image, named).item for image in images.values()]
            if isinstance(served[0], ImageInput):
                return dict(zip(images, embedder.embed_images(served)))
            return dict(zip(images, embedder.embed_packages(served)))
        return dict(zip(images, embedder.embed_images([self._pixels(image, named) for image in images.values()])))

    def _read_whole(
        self, context: RequestContext, embedder: Embedder, inputs: list[_Input], named: dict[str, Reference],
    ) -> list[np.ndarray]:
        """Vectors of inputs a joint embedder reads whole (texts and images' packages together)."""
        if not inputs:
            return []
        rows = []
        for item in inputs:
            served = [self._served(context, image, named).item for image in item.images]
            rows.append([item.text, *served] if item.text.strip() else served)
        return list(embedder.embed_rows(rows))

    def _served(self, context: RequestContext, image: Any, named: dict[str, Reference]) -> Any:
        """An image as the context's backend takes it: a reference's durable package, an inline image's memory-only
        one (its vector is what is kept), or pixels with ``use_cache=False``."""
        if isinstance(image, ReferenceSegment):
            return self.packages.served_reference(context, named[image.ref_id])
        return self.packages.served_candidate(context, image)

    def _pixels(self, image: Any, named: dict[str, Reference]) -> ImageInput:
        """An image's pixels: decoded already, or a reference's kept image."""
        if isinstance(image, ReferenceSegment):
            ref = named[image.ref_id]
            return self.book.kept_image(ref.image_sha256, label=f"reference {ref.ref_id}")
        return image


def _text_vectors(embedder: Embedder, texts: dict[int, str]) -> dict[int, np.ndarray]:
    """The vectors of the texts that are not blank, by their inputs' index."""
    given = [i for i, text in texts.items() if text.strip()]
    return dict(zip(given, embedder.embed_texts([texts[i] for i in given])))


def _summed(
    inputs: list[_Input], joint: dict[int, np.ndarray], text_vectors: dict[int, np.ndarray], image_vectors: list[Any],
) -> list[np.ndarray]:
    """Each input's vector before normalising: a joint embedder's reading of it whole, else the sum of its text's
    vector and its images' (``image_vectors``: every other input's images, in input order)."""
    out, images = [], iter(image_vectors)
    for i, item in enumerate(inputs):
        if i in joint:
            out.append(joint[i])
            continue
        parts = [text_vectors[i]] if i in text_vectors else []
        parts += [next(images) for _ in item.images]
        out.append(np.sum(parts, axis=0))
    return out


def ids_as_text(embedder: Embedder, parts: Sequence[Any], name: str) -> list[Any]:
    """``parts`` with each run of token ids as its text in the embedder's vocabulary; refused naming ``name`` where
    that text does not read back as the same ids (special tokens aside): a split word, or another model's ids."""
    out: list[Any] = []
    run: list[int] = []
    for part in [*parts, None]:
        if is_token_id(part):
            run.append(part)
            continue
        if run:
            try:
                text = embedder.token_text(run)
            except InvalidInputError as exc:
                raise InvalidInputError(name, exc.reason) from None
            tokens = embedder.text_tokens(text)
            if tokens is not None and not _within(run, tokens):
                raise InvalidInputError(name, f"these token ids do not read back as the same tokens of {embedder.name} "
                                        "from their text (ids of another vocabulary, or a split word); send the text")
            out.append(text)
            run = []
        if part is not None:
            out.append(part)
    return out


def _within(run: list[int], tokens: list[int]) -> bool:
    """Whether ``run`` is ``tokens`` or a stretch of it (the ids without the few special tokens around them)."""
    spare = len(tokens) - len(run)
    return 0 <= spare <= _MOST_SPECIAL and any(tokens[i:i + len(run)] == run for i in range(spare + 1))


def check_dimensions(embedder: Embedder, dimensions: int | None) -> None:
    """400 naming ``dimensions`` unless it is the embedder's whole size or a cut it keeps its meaning at."""
    if dimensions is None or dimensions == embedder.dim or dimensions in embedder.truncations:
        return
    cuts = ", ".join(str(n) for n in (*embedder.truncations, embedder.dim))
    why = "a Matryoshka cut is its own" if embedder.truncations else "it was not trained to be cut"
    raise InvalidInputError("dimensions", f"{embedder.name} gives {cuts} dimensions only ({why}), not {dimensions}")


def count_tokens(embedder: Embedder, texts: Sequence[str], truncate: bool, name: str) -> int:
    """The tokens the embedder reads of ``texts`` (its own vocabulary, cut at its ``max_tokens`` when ``truncate``);
    a text over that bound without ``truncate`` is refused naming ``name[i]``."""
    total = 0
    for i, text in enumerate(texts):
        tokens = embedder.text_tokens(text) if text.strip() else None
        n = len(tokens) if tokens is not None else 0
        most = embedder.max_tokens
        if most is not None and n > most:
            if not truncate:
                raise InvalidInputError(f"{name}[{i}]", f"{n} tokens, over the {most} that {embedder.name} reads; "
                                        "shorten it, or ask for it to be cut there (truncate)")
            n = most
        total += n
    return total
