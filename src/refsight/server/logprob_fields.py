"""Each answer token's log probability in the shapes the dialects return it.

The generation hands over :class:`~refsight.results.TokenLogprob` records (one per token, with the
most likely alternatives at its step); a streamed piece carries those of its tokens
(:class:`~refsight.results.TextPiece`). Here they become:

- llama-server's ``completion_probabilities`` (``/completion``, with ``n_probs``), and OpenAI's chat
  ``logprobs.content``, which llama-server returns in the same entries: ``id``, ``token``, ``bytes``,
  ``logprob`` and ``top_logprobs`` of the same fields (:func:`token_entries`); the sampler chain's
  probabilities (``post_sampling_probs``) as llama-server gives them, ``prob`` and ``top_probs``;
- OpenAI's legacy ``/v1/completions`` ``logprobs``: ``tokens``, ``token_logprobs``,
  ``top_logprobs`` (text to log probability) and ``text_offset``, with llama-server's ``content``
  entries beside them (:func:`completion_logprobs`).

A token's ``token`` text is its bytes up to the first that is not valid UTF-8 (llama-server's
reading: a piece of a multi-byte character has no text of its own); ``bytes`` are all of them.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from ..results import TokenLogprob, finite_logprob

__all__ = ["token_entries", "chat_logprobs", "completion_logprobs", "piece_logprobs"]


def _text(piece: bytes) -> str:
    """The valid UTF-8 text at the start of ``piece``."""
    try:
        return piece.decode("utf-8")
    except UnicodeDecodeError as e:
        return piece[: e.start].decode("utf-8")


def _entry(token: int, piece: bytes, logprob: float, post_sampling: bool = False) -> dict[str, Any]:
    value = {"prob": math.exp(logprob)} if post_sampling else {"logprob": finite_logprob(logprob)}
    return {"id": token, "token": _text(piece), "bytes": list(piece), **value}


def token_entries(logprobs: Sequence[TokenLogprob]) -> list[dict[str, Any]]:
    """llama-server's entries (its ``completion_probabilities``, and OpenAI's chat ``logprobs.content``)."""
    return [
        {**_entry(lp.token, lp.piece, lp.logprob, lp.post_sampling),
         ("top_probs" if lp.post_sampling else "top_logprobs"): [_entry(*alt, lp.post_sampling) for alt in lp.top]}
        for lp in logprobs
    ]


def chat_logprobs(logprobs: Sequence[TokenLogprob] | None) -> dict[str, Any] | None:
    """A chat choice's ``logprobs``: ``{"content": [...]}``, or None when none were asked for."""
    return None if logprobs is None else {"content": token_entries(logprobs)}


def completion_logprobs(logprobs: Sequence[TokenLogprob] | None, offset: int = 0) -> dict[str, Any] | None:
    """A ``/v1/completions`` choice's ``logprobs`` (OpenAI's legacy fields, llama-server's ``content`` beside);
    ``offset``: the characters of the answer before these tokens (a stream's earlier pieces)."""
    if logprobs is None:
        return None
    tokens, offsets = [], []
    for lp in logprobs:
        offsets.append(offset)
        tokens.append(_text(lp.piece))
        offset += len(tokens[-1])
    return {
        "tokens": tokens,
        "token_logprobs": [finite_logprob(lp.logprob) for lp in logprobs],
        "top_logprobs": [{_text(piece): finite_logprob(value) for _, piece, value in lp.top} for lp in logprobs],
        "text_offset": offsets,
        "content": token_entries(logprobs),
    }


def piece_logprobs(piece: str) -> tuple[TokenLogprob, ...]:
    """The log probabilities a streamed piece carries (none for a plain string)."""
    return getattr(piece, "logprobs", ())
