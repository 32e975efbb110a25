"""The recall query: what a compare searches the index with (the candidate image, the rubric, or both).

``image`` embeds the candidate; ``text`` embeds the recall text (an explicit query, else the
rubric's criteria); ``both`` (the default of a compare without ``query``) combines them.

How ``both`` combines: the normalised sum of the two unit query vectors. For any reference
vector ``r`` the score is ``(cos(img, r) + cos(txt, r)) / ‖img + txt‖``, so the ranking is
exactly "sum of the image and the text cosine" and it takes ONE index search (the ANN graph
and the exact path both see one vector). Reciprocal rank fusion would need two searches,
each deeper than the shortlist (a reference ranked 150th by image but 2nd by text must
still be found), and would throw the scores away. With the default ConSE embedder a text
query scores at most ``a = 0.5`` against an image (the ConSE share of the vector), while
near-duplicate images score close to 1: the candidate image dominates among look-alikes'
distant relatives, and the rubric re-orders the look-alikes (documented trade-off; use
``text`` to recall by the rubric alone).

The text goes with an instruction (:data:`RECALL_INSTRUCTION`); embedders that are not
instruction-tuned (ConSE, CLIP) accept and ignore it, ``vlm:MODEL`` uses it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..errors import InvalidInputError
from ..images import ImageInput
from ..inputs.text import check_text, check_texts
from ..embedders.base import Embedder, l2_normalise

__all__ = [
    "MAX_K", "RECALL_INSTRUCTION", "RECALL_MODES", "check_query_text", "check_recall_mode", "check_search",
    "query_vector", "recall_text",
]

#: Most references one search returns.
MAX_K = 1000

#: How a compare may build its recall query.
RECALL_MODES = ("image", "text", "both")

#: The instruction given with the rubric text to instruction-aware embedders.
RECALL_INSTRUCTION = "Find a reference image that meets these criteria."


def check_query_text(text: object, name: str) -> str:
    """A query text as given, or InvalidInputError naming ``name``: the one rule for search's ``text``
    and compare's ``query`` (a string of valid Unicode with something in it)."""
    if not isinstance(text, str):
        raise InvalidInputError(name, f"the query text must be a string, not {type(text).__name__}")
    check_text(text, name)
    if not text.strip():
        raise InvalidInputError(name, "the query text is empty")
    return text


def check_search(text: str | None, image: object | None, k: object, where: object = None, restrict_to: object = None) -> None:
    """The rules of one search: exactly one of ``text`` (see :func:`check_query_text`) or ``image``, ``k`` in
    1..1000, and valid text in the ``where`` filter and the ``restrict_to`` ids."""
    check_texts(where, "where")
    check_texts(restrict_to, "restrict_to")
    if (text is None) == (image is None):
        raise InvalidInputError("query", "give exactly one of a text query or an image")
    if text is not None:
        check_query_text(text, "text")
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= MAX_K:
        raise InvalidInputError("k", f"must be an integer in 1..{MAX_K}, not {k!r}")


def check_recall_mode(mode: str | None, *, query: str | None) -> str:
    """The recall mode to use: ``mode``, else ``text`` when an explicit query is given, else ``both``."""
    if mode is None:
        return "text" if query else "both"
    if mode not in RECALL_MODES:
        raise InvalidInputError("recall", f"must be one of {', '.join(RECALL_MODES)}, not {mode!r}")
    return mode


def recall_text(criteria: Sequence[str], query: str | None) -> str:
    """The text side of the query: the explicit ``query``, else the criteria joined by ``"; "``."""
    if query is not None and query.strip():
        return query
    return "; ".join(criteria)


def query_vector(
    embedder: Embedder, *, image: ImageInput | None, text: str | None, mode: str,
    instruction: str | None = RECALL_INSTRUCTION,
) -> np.ndarray:
    """The unit query vector for ``mode`` (see the module docstring for ``both``)."""
    parts = []
    if mode in ("image", "both"):
        if image is None:
            raise InvalidInputError("recall", f"mode {mode!r} needs the candidate image")
        # Embedded now and never stored: a compared candidate leaves no vector on disk.
        parts.append(embedder.embed_images([image])[0])
    if mode in ("text", "both"):
        if not text or not text.strip():
            raise InvalidInputError("recall", f"mode {mode!r} needs a text (a query or the rubric)")
        parts.append(embedder.embed_texts([text], instruction)[0])
    return l2_normalise(np.sum(parts, axis=0, keepdims=True))[0]
