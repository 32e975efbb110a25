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

A generated token's ``token`` text is what the answer's text gained with it, as llama-server sends
it: a token that leaves a character cut off gains nothing, the one that completes it the whole
character, bytes that are not UTF-8 are U+FFFD, and what is still cut off at the end goes with the
last token, so the texts join to the answer's text. An alternative's text is its own bytes less a
character cut off at their end (llama-server's ``validate_utf8``). ``bytes`` are always the token's own.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from ...results import TokenLogprob, finite_logprob

__all__ = ["token_entries", "chat_logprobs", "completion_logprobs", "piece_logprobs"]


def _whole_length(data: bytes) -> int:
    """llama-server's ``validate_utf8``: the length of ``data`` without a multi-byte character cut off at its end."""
    for i in range(1, min(4, len(data)) + 1):
        lead = data[-i]
        needs = 2 if lead & 0xE0 == 0xC0 else 3 if lead & 0xF0 == 0xE0 else 4 if lead & 0xF8 == 0xF0 else 0
        if i < needs:
            return len(data) - i
    return len(data)


def _text(piece: bytes) -> str:
    """An alternative's text: ``piece`` less a character cut off at its end, other bytes that are not UTF-8 as U+FFFD."""
    return piece[: _whole_length(piece)].decode("utf-8", "replace")


def _released(logprobs: Sequence[TokenLogprob]) -> list[str]:
    """Each token's text: what the answer's text gained with it (see the module docstring)."""
    texts, pending = [], b""
    for lp in logprobs:
        pending += lp.piece
        whole = _whole_length(pending)
        texts.append(pending[:whole].decode("utf-8", "replace"))
        pending = pending[whole:]
    if pending and texts:
        texts[-1] += pending.decode("utf-8", "replace")
    return texts


def _entry(token: int, piece: bytes, logprob: float, post_sampling: bool = False, text: str | None = None) -> dict[str, Any]:
    value = {"prob": math.exp(logprob)} if post_sampling else {"logprob": finite_logprob(logprob)}
    return {"id": token, "token": _text(piece) if text is None else text, "bytes": list(piece), **value}


def token_entries(logprobs: Sequence[TokenLogprob]) -> list[dict[str, Any]]:
    """llama-server's entries (its ``completion_probabilities``, and OpenAI's chat ``logprobs.content``)."""
    return [
        {**_entry(lp.token, lp.piece, lp.logprob, lp.post_sampling, text),
         ("top_probs" if lp.post_sampling else "top_logprobs"): [_entry(*alt, lp.post_sampling) for alt in lp.top]}
        for lp, text in zip(logprobs, _released(logprobs))
    ]


def chat_logprobs(logprobs: Sequence[TokenLogprob] | None) -> dict[str, Any] | None:
    """A chat choice's ``logprobs``: ``{"content": [...]}``, or None when none were asked for."""
    return None if logprobs is None else {"content": token_entries(logprobs)}


def completion_logprobs(logprobs: Sequence[TokenLogprob] | None, offset: int = 0) -> dict[str, Any] | None:
    """A ``/v1/completions`` choice's ``logprobs`` (OpenAI's legacy fields, llama-server's ``content`` beside);
    ``offset``: the characters of the answer before these tokens (a stream's earlier pieces)."""
    if logprobs is None:
        return None
    tokens, offsets = _released(logprobs), []
    for text in tokens:
        offsets.append(offset)
        offset += len(text)
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
