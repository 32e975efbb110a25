"""Sampling settings of one generation, and the pieces that honour them on a token stream.

:class:`Sampling` is what a caller asks for (OpenAI names: ``temperature``, ``top_p``,
``seed``, ``stop``, ``frequency_penalty``, ``presence_penalty``; and ``top_k``, ``min_p``,
``repetition_penalty`` as vLLM, transformers and llama.cpp name them). The default is greedy
decoding with no stop strings, so every request that names nothing decodes exactly as
before. A backend lists the fields it honours in ``Backend.sampling_fields``;
:meth:`Sampling.unsupported` names the ones a request sets that a backend would ignore,
so callers refuse them instead of ignoring them silently. :meth:`Sampling.merged` is the one
merge of a request's fields over the served model's defaults. The token constraints
(:data:`TOKEN_FIELDS`: ``logit_bias``, ``ignore_eos``, a GBNF ``grammar``, llama-server's) are
fields too, honoured only by a backend that lists them; so is the repetition penalty's window
(:data:`WINDOW_FIELDS`: ``repeat_last_n``, llama.cpp's and Ollama's); so are ``logprobs`` and ``post_sampling_probs``
(:data:`OUTPUT_FIELDS`), which change no token but ask the backend to report each token's log probability
and the most likely alternatives (:class:`~refsight.results.TokenLogprob`), the model's own or the
sampler chain's.

:class:`StopText` cuts a growing text at the first stop string and tells a streamer how
much of it is safe to show (text that could still become a stop string is held back).
This module imports no torch: it is shared by every backend and the server.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any, Mapping

from .errors import InvalidInputError
from .inputs.gbnf import check_gbnf
from .inputs.text import check_texts
from .results import MAX_LOGPROBS

__all__ = [
    "Sampling", "StopText", "check_supported", "SAMPLING_FIELDS", "GREEDY_TEMPERATURE",
    "TOP_P_FLOOR", "TEMPERATURE_RANGE", "TOP_P_RANGE", "PENALTY_RANGE", "SEED_LIMIT", "MAX_STOP_STRINGS",
    "MAX_DEFAULT_STOP_STRINGS", "TOP_K_LIMIT", "MIN_P_RANGE", "REPETITION_PENALTY_RANGE", "RANGES",
    "TOKEN_FIELDS", "MAX_LOGIT_BIAS", "OUTPUT_FIELDS", "WINDOW_FIELDS", "WHOLE_CONTEXT",
]

#: Every field of :class:`Sampling`, in the OpenAI spelling.
SAMPLING_FIELDS = (
    "temperature", "top_p", "seed", "stop", "frequency_penalty", "presence_penalty", "top_k", "min_p", "repetition_penalty",
)

#: The token constraints (llama-server's fields): a backend honours them only where it lists them.
TOKEN_FIELDS = ("logit_bias", "ignore_eos", "grammar")
#: The repetition penalty's window (llama.cpp's ``penalty_last_n``): a backend honours it only where it lists it.
WINDOW_FIELDS = ("repeat_last_n",)
#: ``repeat_last_n`` of a penalty over the whole prompt and answer (transformers' and vLLM's only reading).
WHOLE_CONTEXT = -1
#: What a generation reports beside its tokens: a backend honours them only where it lists them.
OUTPUT_FIELDS = ("logprobs", "post_sampling_probs")
#: The most ``(token, bias)`` pairs one request may give (a vocabulary's worth is never needed).
MAX_LOGIT_BIAS = 1 << 16
#: The largest token id a bias may name before the backend checks it against its vocabulary.
_TOKEN_LIMIT = 2**31

#: The declared ranges, one source for the library's checks and the server's schema (inclusive
#: bounds; ``top_p`` excludes 0). Every value inside them works on every runtime.
TEMPERATURE_RANGE = (0.0, 2.0)
TOP_P_RANGE = (0.0, 1.0)
PENALTY_RANGE = (-2.0, 2.0)
SEED_LIMIT = 2**63
#: The stop strings a request may send (OpenAI's limit), checked where a request's fields are read
#: (:meth:`Sampling.merged`).
MAX_STOP_STRINGS = 4
#: The stop strings a :class:`Sampling` may hold in all: a served model's defaults ship more than a
#: request may send (an Ollama Modelfile's ``PARAMETER stop`` lines: 4 to 10 on real models).
MAX_DEFAULT_STOP_STRINGS = 32
#: ``top_k`` keeps at most this many tokens (0: no limit); above any vocabulary, so the bound changes nothing.
TOP_K_LIMIT = 1 << 20
MIN_P_RANGE = (0.0, 1.0)
#: vLLM's range (it excludes 0: the penalty divides).
REPETITION_PENALTY_RANGE = (0.0, 2.0)
#: Every number field's declared range: ``(low, high, low excluded)``. ``Sampling`` checks them; the
#: server's schema declares them (the same numbers, never a second check).
RANGES = {
    "temperature": (*TEMPERATURE_RANGE, False), "top_p": (*TOP_P_RANGE, True),
    "frequency_penalty": (*PENALTY_RANGE, False), "presence_penalty": (*PENALTY_RANGE, False),
    "min_p": (*MIN_P_RANGE, False), "repetition_penalty": (*REPETITION_PENALTY_RANGE, True),
}

#: Below this temperature tokens are picked by argmax. Float32 logits that differ at all differ by
#: more than ``1e-10`` times their size, so a draw at such a temperature could only ever split an
#: exact tie: it is greedy decoding, and runtimes that divide float32 logits by the temperature
#: (llama.cpp) would overflow to inf/NaN long before it mattered.
GREEDY_TEMPERATURE = 1e-10
#: The smallest ``top_p`` handed to a runtime. The most likely token of a vocabulary of fewer than
#: 10^8 tokens has a probability above it, so every ``top_p`` up to it keeps exactly that one token:
#: raising a smaller value to it changes nothing, and keeps float32 runtimes from rounding it to 0.
TOP_P_FLOOR = 1e-8


def _number(name: str, value: Any, low: float, high: float, *, open_low: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidInputError(name, f"must be a number, not {type(value).__name__}")
    inside = (low < value if open_low else low <= value) and value <= high
    if not inside:  # NaN fails every comparison: refused here too
        opening = f"greater than {low:g} and" if open_low else f"between {low:g} and"
        raise InvalidInputError(name, f"must be {opening} {'at most ' if open_low else ''}{high:g}, not {value}")


def _integer(name: str, value: Any, high: int, reason: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= high:
        raise InvalidInputError(name, f"{reason}, not {value!r}")


def _stop_strings(stop: Any, limit: int = MAX_DEFAULT_STOP_STRINGS) -> tuple[str, ...]:
    if not isinstance(stop, (tuple, list)) or len(stop) > limit or any(not isinstance(s, str) or not s for s in stop):
        raise InvalidInputError("stop", f"give at most {limit} non-empty strings")
    check_texts(list(stop), "stop")  # a backend request encodes them, and so would a log
    return tuple(stop)


def _logit_bias(pairs: Any) -> tuple[tuple[int, float], ...]:
    """``(token, bias)`` pairs: token ids >= 0, biases finite or ``-inf`` (the token banned)."""
    if not isinstance(pairs, (tuple, list)) or len(pairs) > MAX_LOGIT_BIAS:
        raise InvalidInputError("logit_bias", f"give at most {MAX_LOGIT_BIAS} (token, bias) pairs")
    return tuple(_bias_pair(pair) for pair in pairs)


def _bias_pair(pair: Any) -> tuple[int, float]:
    """One ``(token, bias)`` pair of ``logit_bias``, checked."""
    token, bias = pair if isinstance(pair, (tuple, list)) and len(pair) == 2 else (None, None)
    if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < _TOKEN_LIMIT:
        raise InvalidInputError("logit_bias", f"token ids are non-negative integers, not {token!r}")
    if isinstance(bias, bool) or not isinstance(bias, (int, float)) or math.isnan(bias) or bias == math.inf:
        raise InvalidInputError("logit_bias", f"token {token}: a bias is a finite number or -inf, not {bias!r}")
    return token, float(bias)


@dataclass(frozen=True)
class Sampling:
    """How to pick tokens. The default (``temperature=0``) is greedy decoding.

    ``temperature`` 0 means greedy (OpenAI's convention; ``top_p`` and ``seed`` then change
    nothing), and so does any temperature below :data:`GREEDY_TEMPERATURE`. ``seed`` makes a
    sampled answer repeatable; ``None`` draws a fresh one. ``top_p`` always keeps at least the
    most likely token. ``stop``: generation ends before the first of these strings, which is
    not returned. Penalties follow OpenAI: each generated token's logit drops by
    ``frequency_penalty * count + presence_penalty * (count > 0)``. ``repetition_penalty``
    follows transformers and vLLM (llama.cpp's ``repeat_penalty``): the logit of every token
    already in the prompt's text or the answer is divided by it when positive and multiplied
    by it when negative (1: off), over the last ``repeat_last_n`` tokens of the prompt's text and the answer
    (llama.cpp's and Ollama's window; :data:`WHOLE_CONTEXT`, -1: all of them, the default and the only reading of
    transformers and vLLM; :meth:`merged` reads 0, Ollama's and llama-server's "off", as no penalty). ``top_k`` keeps the k most likely tokens (0: all), ``min_p``
    those whose probability is at least ``min_p`` times the most likely one's (0: all); both
    always keep the most likely token, so with greedy decoding they change nothing. Every
    value accepted here works on every runtime; anything else is an :class:`InvalidInputError`
    naming the field.

    The token constraints, llama-server's: ``logit_bias`` ``(token id, bias)`` pairs added to
    those tokens' logits before anything else (``-inf`` bans one); ``ignore_eos`` bans the
    end-of-generation tokens (llama-server's own reading: a bias of ``-inf`` on each), so the
    answer runs to ``max_new_tokens``, a stop string or the grammar's end; ``grammar`` a GBNF
    grammar the answer must follow (:func:`~refsight.inputs.gbnf.check_gbnf` reads it whole, as
    llama.cpp would parse and run it, and bounds it). A token id, in ``logit_bias`` and in the
    grammar's token references, is the backend's to check against its vocabulary.

    ``logprobs`` (None: off) changes no token: the generation reports each token's log probability
    and its ``logprobs`` most likely alternatives (0: the chosen token's alone), at most
    :data:`~refsight.results.MAX_LOGPROBS`. They are the model's own (a softmax over the raw logits)
    unless ``post_sampling_probs`` (llama-server's field) asks for the sampler chain's: after the
    bias, the grammar, the penalties, top-k, top-p, min-p and the temperature, over the tokens the
    chain kept (greedy decoding keeps one, at probability 1).
    """

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = field(default_factory=tuple)
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    repeat_last_n: int = WHOLE_CONTEXT
    logit_bias: tuple[tuple[int, float], ...] = field(default_factory=tuple)
    ignore_eos: bool = False
    grammar: str | None = None
    logprobs: int | None = None
    post_sampling_probs: bool = False

    def __post_init__(self) -> None:
        # Every rule of a sampling, checked here once: the front ends build a Sampling and keep no copy.
        for name, (low, high, open_low) in RANGES.items():
            _number(name, getattr(self, name), low, high, open_low=open_low)
        _integer("top_k", self.top_k, TOP_K_LIMIT, f"must be an integer from 0 (no limit) to {TOP_K_LIMIT}")
        if self.repeat_last_n != WHOLE_CONTEXT:
            _integer("repeat_last_n", self.repeat_last_n, _TOKEN_LIMIT, "must be -1 (the whole context) or a number of "
                     "tokens")
        if self.seed is not None:
            _integer("seed", self.seed, SEED_LIMIT - 1, "must be a non-negative 64-bit integer")
        object.__setattr__(self, "stop", _stop_strings(self.stop))
        object.__setattr__(self, "logit_bias", _logit_bias(self.logit_bias))
        if not isinstance(self.ignore_eos, bool):
            raise InvalidInputError("ignore_eos", f"must be true or false, not {self.ignore_eos!r}")
        if self.grammar is not None:
            check_gbnf(self.grammar)
        if self.logprobs is not None:
            _integer("logprobs", self.logprobs, MAX_LOGPROBS, f"must be an integer from 0 to {MAX_LOGPROBS}")
        if not isinstance(self.post_sampling_probs, bool):
            raise InvalidInputError("post_sampling_probs", f"must be true or false, not {self.post_sampling_probs!r}")

    @classmethod
    def merged(cls, given: Mapping[str, Any], defaults: Mapping[str, Any] | None = None) -> Sampling:
        """The one merge of a request's sampling: each field as ``given``, else as the served model's
        ``defaults`` set it (an Ollama model's params, the server's ``--temp``), else greedy decoding's.

        ``None`` means "not set". The spellings front ends receive are read here too: ``stop`` as one
        string, ``seed: -1`` (llama-server, Ollama: a fresh seed), ``top_k: -1`` (vLLM: no limit),
        ``repeat_last_n: 0`` (llama-server, Ollama: no repetition penalty); a window without a penalty is no
        window (it cannot change a token, so no backend need honour it). A request sends at most :data:`MAX_STOP_STRINGS` stop strings; the defaults may hold more.
        """
        if isinstance(given.get("stop"), (list, tuple)):
            _stop_strings(given["stop"], MAX_STOP_STRINGS)
        values = {}
        for name in (*SAMPLING_FIELDS, *WINDOW_FIELDS, *TOKEN_FIELDS, *OUTPUT_FIELDS):
            value = given.get(name)
            value = (defaults or {}).get(name) if value is None else value
            if value is not None:
                values[name] = value
        if isinstance(values.get("stop"), str):
            values["stop"] = (values["stop"],)
        if values.get("seed") == -1:
            del values["seed"]
        if values.get("top_k") == -1:
            values["top_k"] = 0
        if values.get("repeat_last_n") == 0:
            values.pop("repetition_penalty", None)
        if values.get("repetition_penalty", 1.0) == 1.0:
            values.pop("repeat_last_n", None)
        return cls(**values)

    @property
    def greedy(self) -> bool:
        """True when tokens are picked by argmax (temperature 0, or below :data:`GREEDY_TEMPERATURE`)."""
        return self.temperature < GREEDY_TEMPERATURE

    @property
    def runtime_top_p(self) -> float:
        """``top_p`` as a runtime gets it: at least :data:`TOP_P_FLOOR` (the same tokens kept)."""
        return max(float(self.top_p), TOP_P_FLOOR)

    def non_default(self) -> list[str]:
        """The fields set away from their defaults (what a backend must honour)."""
        default = Sampling()
        return [f.name for f in fields(self) if getattr(self, f.name) != getattr(default, f.name)]

    def unsupported(self, supported: Any) -> list[str]:
        """The fields this sampling sets that a backend honouring ``supported`` (a set of names) would ignore:
        the one rule every caller refuses them by (the engine as an error, the server as a 400 naming the first)."""
        return [name for name in self.non_default() if name not in supported]


def check_supported(sampling: Sampling | None, supported: Any, backend: str) -> None:
    """Raise :class:`InvalidInputError` naming the first field ``sampling`` sets that ``backend`` would ignore."""
    refused = [] if sampling is None else sampling.unsupported(supported)
    if refused:
        raise InvalidInputError(refused[0], f"{backend} does not support {', '.join(refused)}")


class StopText:
    """Tracks generated text against stop strings.

    ``update(text)`` takes the whole text so far and returns True once a stop string
    appears; :attr:`text` is then cut before it. :meth:`safe_length` is how much of the
    text may be shown now: everything except a tail that could still grow into a stop
    string.
    """

    def __init__(self, stop: tuple[str, ...] | list[str] = ()) -> None:
        self.stop = tuple(stop)
        self.text = ""
        self.stopped = False
        self._hold = max((len(s) for s in self.stop), default=1) - 1

    def update(self, text: str) -> bool:
        """Feed the full text so far; True (and :attr:`text` cut) when a stop string is in it."""
        if self.stopped:
            return True
        cut = min((i for i in (text.find(s) for s in self.stop) if i >= 0), default=-1)
        if cut >= 0:
            self.text, self.stopped = text[:cut], True
            return True
        self.text = text
        return False

    def safe_length(self, final: bool = False) -> int:
        """Characters of :attr:`text` that can no longer change (all of them once final or stopped)."""
        if final or self.stopped or not self.stop:
            return len(self.text)
        # Hold back only the tail that is a prefix of some stop string.
        for start in range(max(0, len(self.text) - self._hold), len(self.text)):
            tail = self.text[start:]
            if any(s.startswith(tail) for s in self.stop):
                return start
        return len(self.text)
