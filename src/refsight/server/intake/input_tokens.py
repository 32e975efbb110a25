"""A chat's prompt tokens counted before anything runs: llama-server's ``/chat/completions/input_tokens`` and
Anthropic's ``/v1/messages/count_tokens`` share this one count.

The count is the chat template's tokens with each image as the media marker, then each image's own tokens
where the marker stood, where the backend can tell them before encoding (a stored reference by its package's
layout; transformers by the image's size). A fresh image on llama.cpp, whose layout mtmd decides as it encodes,
counts as nothing: the count is then a lower bound.
"""

from __future__ import annotations

from typing import Any

from .messages import Message, PartResolver, messages_to_segments, template_segments

__all__ = ["template_tokens", "input_tokens"]


def template_tokens(service: Any, messages: list[Message], prompt_end: str, tools: Any = None,
                    variables: Any = None) -> int:
    """The prompt's tokens as the chat template renders it (with its ``variables``), ended as ``prompt_end``, each
    image as the media marker, given ``tools`` (a :class:`~refsight.tools.ChatTools`: the tools' definitions and calls
    count as the chat's)."""
    texts, turns = template_segments(messages, service.media_marker)
    text = service.render_chat(texts, turns, prompt_end, tools, variables)
    return len(service.tokenize(text, add_special=True, parse_special=True))


def input_tokens(service: Any, messages: list[Message], prompt_end: str, resolver: PartResolver, namespace: str,
                 tools: Any = None, variables: Any = None) -> int:
    """The prompt's tokens, each image's where the backend can tell them (see the module's note)."""
    total = template_tokens(service, messages, prompt_end, tools, variables)
    segments, _ = messages_to_segments(messages, resolver)
    marker = len(service.tokenize(service.media_marker, add_special=False, parse_special=True))
    # An image takes its own tokens where the marker stood (a stored reference: as its package lays it out).
    images = [s for s in segments if not isinstance(s, str)]
    return total + sum((service.image_token_count(s, namespace=namespace) or 0) - marker for s in images)
