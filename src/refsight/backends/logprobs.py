"""A generated token's log probability and its most likely alternatives, from one step's raw logits
(or from what a sampler chain kept at that step: :func:`chain_logprob`).

Every backend that honours ``Sampling.logprobs`` computes them here, the same way: a log-softmax
over the model's raw logits of the step in float64 (llama-server's ``n_probs`` reads the same
distribution: before penalties, a bias, a grammar or the temperature), the ``n`` most likely
tokens most likely first (ties by the lower id, so the order is stable). numpy only: no torch.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from ..results import TokenLogprob

__all__ = ["token_logprob", "chain_logprob"]


def token_logprob(row: np.ndarray, token: int, n: int, piece: Callable[[int], bytes]) -> TokenLogprob:
    """``token``'s :class:`TokenLogprob` at the step whose raw logits are ``row`` (``[n_vocab]``), with the
    ``n`` most likely tokens; ``piece`` gives a token's bytes."""
    logits = np.asarray(row, dtype=np.float64)
    finite = np.isfinite(logits)
    peak = logits[finite].max() if finite.any() else 0.0
    logsumexp = peak + np.log(np.exp(logits[finite] - peak).sum()) if finite.any() else 0.0
    logprobs = np.where(finite, logits - logsumexp, -np.inf)
    n = min(n, logprobs.size)
    top: tuple[tuple[int, bytes, float], ...] = ()
    if n:
        # argpartition keeps the work linear in the vocabulary; only the n kept are sorted.
        best = np.argpartition(-logprobs, n - 1)[:n] if n < logprobs.size else np.arange(logprobs.size)
        best = best[np.lexsort((best, -logprobs[best]))]
        top = tuple((int(t), piece(int(t)), float(logprobs[t])) for t in best)
    return TokenLogprob(token=int(token), piece=piece(int(token)), logprob=float(logprobs[token]), top=top)


def chain_logprob(token: int, ids: np.ndarray, probs: np.ndarray, n: int, piece: Callable[[int], bytes]) -> TokenLogprob:
    """``token``'s :class:`TokenLogprob` from what a sampler chain kept at its step (``ids`` with their
    probabilities ``probs``: llama-server's post-sampling probabilities), with the ``n`` most likely kept
    tokens that have a probability above 0 (ties by the lower id)."""
    order = np.lexsort((ids, -probs))
    chosen = float(probs[ids == token][0])
    with np.errstate(divide="ignore"):
        top = tuple((int(ids[i]), piece(int(ids[i])), float(np.log(probs[i]))) for i in order[:n] if probs[i] > 0)
        return TokenLogprob(token=int(token), piece=piece(int(token)), logprob=float(np.log(chosen)), top=top,
                            post_sampling=True)
