"""llama-server's ``logit_bias`` as its clients send it, read into ``(token id, bias)`` pairs.

Two forms, as llama-server takes them: an object ``{"15043": 1.5, "Hello": false}`` (OpenAI's
form: keys are token ids; llama-server also takes text, every token of which gets the bias) and
an array of pairs ``[[15043, 1.5], ["Hello", false]]``; ``""`` (what Open WebUI sends for a bias left empty) is
none. A bias is a number, or ``false``: the
token is banned (``-inf``). Where llama-server skips an entry it cannot read, refsight answers a
400 naming it: nothing is silently ignored.

A text key costs a tokenizer run, so its cost is bounded before any key is tokenized: at most
:data:`MAX_TEXT_KEYS` text keys, each at most :data:`MAX_TEXT_KEY_CHARS` characters (a word or a phrase, every
token of which gets the bias; a longer key is refused by name), and the pairs the entries can make at most the
library's :data:`~refsight.requests.MAX_LOGIT_BIAS` (an id is one pair, a text at most one per UTF-8 byte and
one more). The keys are then tokenized where the caller runs this: in the work pool, never on the event loop
(:func:`~.generation_body.check_generation` runs there).
"""

from __future__ import annotations

import math
from typing import Any, Callable

from ...requests import MAX_LOGIT_BIAS
from ..edge.http_errors import ApiError

__all__ = ["logit_bias_pairs", "MAX_TEXT_KEYS", "MAX_TEXT_KEY_CHARS"]

#: Text keys tokenized per request at most (each is the served vocabulary's tokens of that text).
MAX_TEXT_KEYS = 256
#: The longest text key, in characters: a word or a phrase (256 keys of it: 64 Ki characters tokenized at most).
MAX_TEXT_KEY_CHARS = 256


def _bias(value: Any, where: str) -> float:
    if value is False:
        return -math.inf
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ApiError(400, "invalid_input", f"{where}: a bias is a finite number, or false to ban the token",
                       param="logit_bias")
    return float(value)


def _is_text(key: Any) -> bool:
    """Whether ``key`` is text to tokenize (not a token id, as an integer or its decimal text)."""
    return isinstance(key, str) and not (len(key) <= MAX_TEXT_KEY_CHARS and key.strip().lstrip("-").isdigit())


def _tokens(key: Any, where: str, tokenize: Callable[[str], list[int]]) -> list[int]:
    """A key's token ids: a token id (an integer, or its decimal text), else every token of the text."""
    if isinstance(key, int) and not isinstance(key, bool):
        token = key
    elif isinstance(key, str) and not _is_text(key):
        token = int(key)
    elif isinstance(key, str) and key:
        return tokenize(key)
    else:
        raise ApiError(400, "invalid_input", f"{where}: name a token id or a non-empty text", param="logit_bias")
    if token < 0:
        raise ApiError(400, "invalid_input", f"{where}: token ids are not negative, got {token}", param="logit_bias")
    return [token]


def _where(value: Any, key: Any, i: int) -> str:
    """How an entry is named in an error: its key (shortened) in the object form, its index in the array form."""
    if isinstance(value, dict):
        shown = repr(key[:40] + "…") if isinstance(key, str) and len(key) > 40 else repr(key)
        return f"logit_bias[{shown}]"
    return f"logit_bias[{i}]"


def _check_cost(value: Any, entries: list[tuple[Any, Any]]) -> None:
    """400 naming the first entry past a bound, before anything is tokenized (see the module's docstring)."""
    texts = [(i, key) for i, (key, _) in enumerate(entries) if _is_text(key)]
    if len(texts) > MAX_TEXT_KEYS:
        raise ApiError(400, "invalid_input", f"logit_bias: at most {MAX_TEXT_KEYS} text keys", param="logit_bias")
    for i, key in texts:
        if len(key) > MAX_TEXT_KEY_CHARS:
            raise ApiError(400, "invalid_input", f"{_where(value, key, i)}: a text key of {len(key)} characters; "
                           f"give at most {MAX_TEXT_KEY_CHARS} (a word or a phrase), or token ids", param="logit_bias")
    pairs = len(entries) - len(texts) + sum(len(key.encode("utf-8", "surrogatepass")) + 1 for _, key in texts)
    if pairs > MAX_LOGIT_BIAS:
        raise ApiError(400, "invalid_input", f"logit_bias: its entries could make {pairs} (token, bias) pairs; give "
                       f"at most {MAX_LOGIT_BIAS}", param="logit_bias")


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
    _check_cost(value, entries)
    pairs: list[tuple[int, float]] = []
    for i, (key, bias) in enumerate(entries):
        where = _where(value, key, i)
        weight = _bias(bias, where)
        pairs.extend((token, weight) for token in _tokens(key, where, tokenize))
    return pairs
