"""llama-server's ``timings`` object, measured where llama-server measures it.

llama-server splits a request's time at its first generated token: everything before it
(encoding the images, loading cached packages, prefilling the prompt, sampling that token)
is ``prompt_ms`` over ``prompt_n`` tokens evaluated (``cache_n`` more were served by the KV
prefix cache); everything after is ``predicted_ms``. The generation rate therefore covers
the tokens after the first: a one-token answer has rate 0, never a division by zero.

The engines report their own stage timings (``timings_ms``) but not when the first token
came, so a :class:`TokenClock` watches the text callback of a streamed answer on the worker
thread. An answer that is not streamed keeps the engines' own path (no callback: a callback
would move it to the streaming path, which batches differently), so its split is the engines'
stage timings instead: encoding, reference loading and prefix building or loading are the
prompt's, the rest is the answer's. Every number is finite (JSON has no infinity).
"""

from __future__ import annotations

import time
from typing import Any, Callable

from ...results import GenerateResult

__all__ = ["TokenClock", "rate"]


def rate(count: int, ms: float) -> tuple[float, float]:
    """(ms per token, tokens per second) of ``count`` tokens in ``ms`` (the ``ms`` the reply shows: a client that
    recomputes the rate from it gets the same number, unrounded as llama-server's); zeros when either is zero."""
    if count <= 0 or ms <= 0:
        return 0.0, 0.0
    return ms / count, 1e3 / ms * count


class TokenClock:
    """When one request's model work began, when its first piece of text came, and the pieces so far."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.first: float | None = None
        self.end: float | None = None
        self.pieces = 0

    def begin(self) -> None:
        """Start the clock (called in the worker, so time queued for a slot is not counted)."""
        self.start, self.first, self.end, self.pieces = time.perf_counter(), None, None, 0

    def stop(self) -> None:
        """Note the end of the answer (called in the worker when the model returns)."""
        self.end = time.perf_counter()

    def wrap(self, on_text: Callable[[str], None] | None) -> Callable[[str], None] | None:
        """``on_text`` behind a callback that notes each piece's arrival (None stays None: not streamed)."""
        if on_text is None:
            return None

        def tick(piece: str) -> None:
            if self.first is None:
                self.first = time.perf_counter()
            self.pieces += 1
            on_text(piece)

        return tick

    def _split(self, result: GenerateResult | None = None) -> tuple[float, float]:
        """(prompt ms, predicted ms so far); for an answer that was not streamed, the engine's split of it."""
        now = self.end if self.end is not None else time.perf_counter()
        if self.first is None and result is not None and result.timings_ms:
            ms = result.timings_ms
            prompt = sum(float(ms.get(k, 0.0)) for k in ("encode", "reference_load", "prefix_build", "prefix_load"))
            total = max((now - self.start) * 1000.0, prompt)
            return prompt, total - prompt
        first = self.first if self.first is not None else now
        return max(first - self.start, 0.0) * 1000.0, max(now - first, 0.0) * 1000.0

    def partial(self) -> dict[str, Any]:
        """The ``timings`` of a streamed chunk (``timings_per_token``): the pieces sent so far.

        The prompt's token count is known only when the answer ends, so it is in the final timings only.
        """
        prompt_ms, predicted_ms = (round(ms, 3) for ms in self._split())
        per_token, per_second = rate(self.pieces - 1, predicted_ms)
        return {"prompt_ms": prompt_ms, "predicted_n": self.pieces, "predicted_ms": predicted_ms,
                "predicted_per_token_ms": per_token, "predicted_per_second": per_second}

    def final(self, result: GenerateResult) -> dict[str, Any]:
        """llama-server's ``timings`` of a finished answer (call when the work has returned)."""
        prompt_ms, predicted_ms = (round(ms, 3) for ms in self._split(result))
        cache_n = int(result.prefix_tokens_reused or 0)
        prompt_n = max(int(result.prompt_tokens) - cache_n, 0)
        predicted_n = len(result.tokens)
        prompt_per_token, prompt_per_second = rate(prompt_n, prompt_ms)
        per_token, per_second = rate(predicted_n - 1, predicted_ms)
        return {
            "cache_n": cache_n, "prompt_n": prompt_n, "prompt_ms": prompt_ms,
            "prompt_per_token_ms": prompt_per_token, "prompt_per_second": prompt_per_second,
            "predicted_n": predicted_n, "predicted_ms": predicted_ms,
            "predicted_per_token_ms": per_token, "predicted_per_second": per_second,
        }
