"""The prompt-token limit of the chat endpoint, checked before any model work.

A 300 KB message with ``max_tokens: 1`` still makes the model read every prompt
token (minutes on a CPU, a worker held throughout), so a prompt's *text* tokens are
bounded by ``ServerConfig.max_prompt_tokens``. Two steps, cheapest first:

1. characters: a text over ``MAX_CHARS_PER_TOKEN`` characters per allowed token is
   refused without tokenizing (no tokenizer needs to see a huge body);
2. tokens: the rest is counted with the backend's tokenizer
   (:meth:`refsight.backends.base.Backend.count_text_tokens`), off the event loop
   but outside the model workers.

Images are counted in the worker, once their tokens are known and before any prefill: the
engine adds each image's tokens to the text's and refuses a prompt over the same limit or the
context with llama-server's ``exceed_context_size_error`` (:mod:`refsight.inputs.prompt_size`; the
service hands it ``max_prompt_tokens``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from ..edge.http_errors import ApiError

__all__ = ["MAX_CHARS_PER_TOKEN", "check_prompt_chars", "check_prompt_tokens", "prompt_texts"]

#: Characters per token above which a prompt is refused before tokenizing: tokenizers
#: in use average 3-5 characters a token on text, so no real prompt comes near this.
MAX_CHARS_PER_TOKEN = 16


def prompt_texts(messages: Iterable[Any]) -> list[str]:
    """Every text of the chat messages (string contents and text parts), in order."""
    texts: list[str] = []
    for message in messages:
        content = message.content
        if isinstance(content, str):
            texts.append(content)
        elif content is not None:
            texts.extend(part.text for part in content if part.type == "text" and part.text)
    return texts


def _too_long(what: str, limit: int, field: str) -> ApiError:
    return ApiError(400, "invalid_input", f"{field}: the prompt has {what}, over the limit of {limit} prompt tokens", param=field)


def check_prompt_chars(texts: list[str], limit: int, field: str = "messages") -> None:
    """400 naming ``field`` when the texts hold more characters than ``limit`` tokens could ever be."""
    chars = sum(len(t) for t in texts)
    if chars > limit * MAX_CHARS_PER_TOKEN:
        raise _too_long(f"{chars} characters (more than {MAX_CHARS_PER_TOKEN} a token)", limit, field)


def check_prompt_tokens(texts: list[str], limit: int, count: Callable[[str], int], field: str = "messages") -> int:
    """The prompt's text tokens by ``count``; 400 naming ``field`` when over ``limit`` (call after check_prompt_chars)."""
    tokens = count("\n".join(texts)) if texts else 0
    if tokens > limit:
        raise _too_long(f"{tokens} text tokens", limit, field)
    return tokens
