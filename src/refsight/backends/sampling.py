"""Sampling settings of one generation, and the pieces that honour them on a token stream.

:class:`Sampling` is what a caller asks for (OpenAI names: ``temperature``, ``top_p``,
``seed``, ``stop``, ``frequency_penalty``, ``presence_penalty``). The default is greedy
decoding with no stop strings, so every request that names nothing decodes exactly as
before. A backend lists the fields it honours in ``Backend.sampling_fields``;
:func:`unsupported_fields` names the ones a request sets that a backend would ignore,
so callers refuse them instead of ignoring them silently.

:class:`StopText` cuts a growing text at the first stop string and tells a streamer how
much of it is safe to show (text that could still become a stop string is held back).
This module imports no torch: it is shared by every backend and the server.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from ..errors import InvalidInputError

__all__ = ["Sampling", "StopText", "check_supported", "unsupported_fields", "SAMPLING_FIELDS"]

#: Every field of :class:`Sampling`, in the OpenAI spelling.
SAMPLING_FIELDS = ("temperature", "top_p", "seed", "stop", "frequency_penalty", "presence_penalty")


@dataclass(frozen=True)
class Sampling:
    """How to pick tokens. The default (``temperature=0``) is greedy decoding.

    ``temperature`` 0 means greedy (OpenAI's convention; ``top_p`` and ``seed`` then change
    nothing). ``seed`` makes a sampled answer repeatable; ``None`` draws a fresh one.
    ``stop``: generation ends before the first of these strings, which is not returned.
    Penalties follow OpenAI: each generated token's logit drops by
    ``frequency_penalty * count + presence_penalty * (count > 0)``.
    """

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = field(default_factory=tuple)
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0

    def __post_init__(self) -> None:
        from ..errors import InvalidInputError

        if not 0.0 <= self.temperature <= 2.0:
            raise InvalidInputError("temperature", f"must be between 0 and 2, not {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidInputError("top_p", f"must be greater than 0 and at most 1, not {self.top_p}")
        for name in ("frequency_penalty", "presence_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise InvalidInputError(name, f"must be between -2 and 2, not {getattr(self, name)}")
        if self.seed is not None and not 0 <= self.seed < 2**63:
            raise InvalidInputError("seed", f"must be a non-negative 64-bit integer, not {self.seed}")
        if len(self.stop) > 4 or any(not isinstance(s, str) or not s for s in self.stop):
            raise InvalidInputError("stop", "give at most 4 non-empty strings")

    @property
    def greedy(self) -> bool:
        """True when tokens are picked by argmax (temperature 0)."""
        return self.temperature == 0.0

    def non_default(self) -> list[str]:
        """The fields set away from their defaults (what a backend must honour)."""
        default = Sampling()
        return [f.name for f in fields(self) if getattr(self, f.name) != getattr(default, f.name)]


def unsupported_fields(sampling: Sampling | None, supported: Any) -> list[str]:
    """The fields ``sampling`` sets that a backend honouring ``supported`` (a set of names) would ignore."""
    if sampling is None:
        return []
    return [name for name in sampling.non_default() if name not in supported]


def check_supported(sampling: Sampling | None, supported: Any, backend: str) -> None:
    """Raise :class:`InvalidInputError` naming the first field ``sampling`` sets that ``backend`` would ignore."""
    refused = unsupported_fields(sampling, supported)
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
