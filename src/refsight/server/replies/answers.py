"""One generation as the text routes answer it, typed to the edge, and the OpenAI pieces every route shares.

:class:`Answer` is the engine's :class:`~refsight.results.GenerateResult` (its strings printable)
plus what a route learned around it: the vLLM uuids it used, whether llama-server's context ran
out (``truncated``), and the prompt / answer split of Ollama's durations. The routes format it
by attribute, never by string key. :func:`usage`, :func:`refsight_extra` and :func:`finish_reason`
exist once, for OpenAI's chat and completions and for Ollama's ``refsight`` object.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Sequence

from ... import __version__
from ...results import GenerateResult

__all__ = ["Answer", "usage", "refsight_extra", "ignored_extra", "ignored_object", "finish_reason", "RANDOM_WEIGHTS_NOTICE", "SYSTEM_FINGERPRINT"]

#: OpenAI's ``system_fingerprint`` (llama-server sends its build): the refsight version that answered.
SYSTEM_FINGERPRINT = f"refsight-{__version__}"

RANDOM_WEIGHTS_NOTICE = "random weights: this text is meaningless (timings and caching are real)"


@dataclass
class Answer(GenerateResult):
    """A :class:`GenerateResult` with what the route added (see the module docstring)."""

    #: what each vLLM uuid of the request did (``refsight.media_uuids``)
    media_uuids: list[dict[str, Any]] = field(default_factory=list)
    #: llama-server's ``truncated``: the context ran out (``n_predict: -1``)
    truncated: bool = False
    #: seconds to the first token and after it (Ollama's ``prompt_eval_duration`` / ``eval_duration``)
    prompt_s: float = 0.0
    eval_s: float = 0.0
    #: llama-server's ``stopping_word``: the stop string that ended the answer ("" when none), found in the worker
    stopping_word: str = ""

    @classmethod
    def of(cls, result: GenerateResult, **added: Any) -> Answer:
        """``result`` with the route's ``added`` fields."""
        return cls(**{f.name: getattr(result, f.name) for f in fields(GenerateResult)}, **added)


def usage(answer: GenerateResult) -> dict[str, Any]:
    """OpenAI's ``usage``: the real prompt (text and image tokens), the answer, and the cached image tokens."""
    completion = len(answer.tokens)
    return {
        "prompt_tokens": answer.prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": answer.prompt_tokens + completion,
        "prompt_tokens_details": {"cached_tokens": answer.cached_tokens},
    }


def refsight_extra(answer: GenerateResult, ignored: Sequence[str] = ()) -> dict[str, Any]:
    """The ``refsight`` object of an answer: random weights (and the notice), references cached, timings, uuids, and
    the request's fields refsight did not use (:func:`ignored_extra`)."""
    extra: dict[str, Any] = {
        "random_weights": answer.random_weights,
        "references_cached": answer.references_cached,
        "timings_ms": answer.timings_ms,
    }
    if getattr(answer, "media_uuids", None):
        extra["media_uuids"] = answer.media_uuids
    if answer.random_weights:
        extra["notice"] = RANDOM_WEIGHTS_NOTICE
    return {**extra, **ignored_extra(ignored)}


def ignored_extra(ignored: Sequence[str]) -> dict[str, Any]:
    """``{"ignored": [...]}``: the paths of the request's fields that refsight did not use (unknown fields and hints,
    :mod:`~..intake.dialect_body`), where there are any; else nothing."""
    return {"ignored": list(ignored)} if ignored else {}


def ignored_object(ignored: Sequence[str]) -> dict[str, Any]:
    """``{"refsight": {"ignored": [...]}}`` for a reply that carries no ``refsight`` object otherwise (a count, a
    template, tokens, Anthropic's message, Ollama's load), where any field was ignored; else nothing."""
    return {"refsight": ignored_extra(ignored)} if ignored else {}


def finish_reason(answer: GenerateResult) -> str:
    """The finish reason a client may be sent: ``length``, ``tool_calls`` (the answer called tools), else ``stop`` (a
    cancelled answer has no reader)."""
    return answer.finish_reason if answer.finish_reason in ("length", "tool_calls") else "stop"
