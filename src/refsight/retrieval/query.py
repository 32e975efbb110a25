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
from ..inputs.images import ImageInput
from ..embedders.base import Embedder, l2_normalise

__all__ = ["RECALL_INSTRUCTION", "query_vector", "recall_text"]

#: The instruction given with the rubric text to instruction-aware embedders.
RECALL_INSTRUCTION = "Find a reference image that meets these criteria."


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
