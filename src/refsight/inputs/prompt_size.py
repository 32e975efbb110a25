"""A prompt's size in tokens, text and images together, checked before the language model runs.

The server bounds a prompt's *text* tokens before any model work (``server/intake/prompt_limit.py``), but
an image costs tokens too: one stored reference named 4,000 times in a 277 KB body was a
56,026-token prompt (issue 38). :func:`check_prompt_size` counts each image's tokens as well (a
package by its layout, pixels by their size where the backend can tell:
:meth:`~refsight.backends.base.Backend.image_token_count`) and refuses a prompt over the limit
(``max_prompt_tokens``) or over the backend's context (``context_size``, llama.cpp's ``n_ctx``)
with :class:`~refsight.errors.ContextLengthError`, llama-server's ``exceed_context_size_error``,
before any prefill. :meth:`~refsight.backends.base.Backend.check_prompt` checks: on a chat before
any image is encoded (the text and the new images the backend can count from their size; stored
references count nothing yet), then for every generation with every image resolved to its package.
The count leaves out the chat template's own tokens, so it is a lower bound: a backend with a
context still checks the exact prompt itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import ContextLengthError

__all__ = ["check_prompt_size"]


def check_prompt_size(backend: Any, segments: Sequence[Any], max_prompt_tokens: int | None, raw: bool = False) -> None:
    """Raise :class:`ContextLengthError` when the text and image tokens of ``segments`` exceed ``max_prompt_tokens`` or
    fill ``backend``'s context; nothing to check (or count) without either bound. ``raw``: the text is a raw prompt."""
    context = getattr(backend, "context_size", None)
    if max_prompt_tokens is None and not context:
        return
    text_tokens, image_tokens = _text_tokens(backend, segments, raw), _image_tokens(backend, segments)
    total = text_tokens + image_tokens
    images = sum(1 for s in segments if not isinstance(s, str))
    counted = f"{total} tokens ({text_tokens} text, {image_tokens} in {images} image{'' if images == 1 else 's'})"
    if context and total >= context:
        raise ContextLengthError("prompt", f"{counted} does not fit the context of {context} tokens",
                                 n_prompt_tokens=total, n_ctx=context)
    if max_prompt_tokens is not None and total > max_prompt_tokens:
        raise ContextLengthError("prompt", f"{counted}, over the limit of {max_prompt_tokens} prompt tokens "
                                 "(max_prompt_tokens)", n_prompt_tokens=total, n_ctx=max_prompt_tokens)


def _text_tokens(backend: Any, segments: Sequence[Any], raw: bool) -> int:
    # A raw prompt spells special tokens as llama-server's /completion parses them (<|im_start|> one token, not six).
    texts = [s for s in segments if isinstance(s, str)]
    if raw and texts:
        return len(backend.tokenize("".join(texts), add_special=False, parse_special=True))
    return backend.count_text_tokens("\n".join(texts)) if texts else 0


def _image_tokens(backend: Any, segments: Sequence[Any]) -> int:
    # An image the backend cannot count (yet: a stored reference before its package loads) adds nothing.
    return sum(backend.image_token_count(s) or 0 for s in segments if not isinstance(s, str))
