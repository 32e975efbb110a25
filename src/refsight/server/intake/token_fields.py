"""llama-server's ``logit_bias`` as its clients send it, read into ``(token id, bias)`` pairs.

Two forms, as llama-server takes them: an object ``{"15043": 1.5, "Hello": false}`` (OpenAI's
form: keys are token ids; llama-server also takes text, every token of which gets the bias) and
an array of pairs ``[[15043, 1.5], ["Hello", false]]``; ``""`` (what Open WebUI sends for a bias left empty) is
none. A bias is a number, or ``false``: the
token is banned (``-inf``). Where llama-server skips an entry it cannot read, refsight answers a
400 naming it: nothing is silently ignored.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from ..edge.http_errors import ApiError

__all__ = ["logit_bias_pairs"]

#: Text keys tokenized per request at most (each is the served vocabulary's tokens of that text).
MAX_TEXT_KEYS = 256


def _bias(value: Any, where: str) -> float:
    if value is False:
        return -math.inf
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ApiError(400, "invalid_input", f"{where}: a bias is a finite number, or false to ban the token",
                       param="logit_bias")
    return float(value)


def _tokens(key: Any, where: str, tokenize: Callable[[str], list[int]]) -> list[int]:
    """A key's token ids: a token id (an integer, or its decimal text), else every token of the text."""
    if isinstance(key, int) and not isinstance(key, bool):
        token = key
    elif isinstance(key, str) and key.strip().lstrip("-").isdigit():
        token = int(key)
    elif isinstance(key, str) and key:
        return tokenize(key)
    else:
        raise ApiError(400, "invalid_input", f"{where}: name a token id or a non-empty text", param="logit_bias")
    if token < 0:
        raise ApiError(400, "invalid_input", f"{where}: token ids are not negative, got {token}", param="logit_bias")
    return [token]


def logit_bias_pairs(value: Any, tokenize: Callable[[str], list[int]]) -> list[tuple[int, float]]:
    """``(token id, bias)`` pairs of a request's ``logit_bias`` (object or array form); 400 naming a bad entry.

    ``tokenize(text)``: the served model's tokens of a text key (no special tokens added or parsed).
    """
    if value == "":  # an empty setting: nothing to bias
        return []
    if isinstance(value, dict):
        entries = list(value.items())
    elif isinstance(value, list):
        entries = []
        for i, pair in enumerate(value):
            if not isinstance(pair, list) or len(pair) != 2:
                raise ApiError(400, "invalid_input", f"logit_bias[{i}]: give a [token, bias] pair", param="logit_bias")
            entries.append((pair[0], pair[1]))
    else:
        raise ApiError(400, "invalid_input", "logit_bias: give an object of token: bias, or [token, bias] pairs",
                       param="logit_bias")
    texts = sum(1 for key, _ in entries if isinstance(key, str) and not key.strip().lstrip("-").isdigit())
    if texts > MAX_TEXT_KEYS:
        raise ApiError(400, "invalid_input", f"logit_bias: at most {MAX_TEXT_KEYS} text keys", param="logit_bias")
    pairs: list[tuple[int, float]] = []
    for i, (key, bias) in enumerate(entries):
        where = f"logit_bias[{key!r}]" if isinstance(value, dict) else f"logit_bias[{i}]"
        weight = _bias(bias, where)
        pairs.extend((token, weight) for token in _tokens(key, where, tokenize))
    return pairs
