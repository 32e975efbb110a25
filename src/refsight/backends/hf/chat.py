"""A transformers checkpoint's chat template, rendered as ``apply_chat_template`` renders it, in the bounded renderer.

``ProcessorMixin.apply_chat_template(processor, messages, tokenize=False, ...)`` resolves the processor's template
(its ``default`` where it holds several), and renders it with the conversation, ``tools`` and ``documents`` (None
when no tool is offered), ``add_generation_prompt`` and the tokenizer's special tokens (``bos_token``,
``eos_token`` ...), all as plain data. :func:`render_chat` gives the template exactly that, in the renderer's
``transformers`` flavour (the environment transformers compiles templates in), so the text is the same byte for byte
(``tests/backends/test_template_renders.py`` holds every built-in family to it) but never runs in this process.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..templates import render

__all__ = ["chat_messages", "render_chat", "resolved_template"]


def chat_messages(segments: list[Any], turns: list[tuple[str, int]] | None, tools: Any = None) -> list[dict[str, Any]]:
    """Chat messages with content parts: text as ``{"type": "text"}``, anything else (an image) as
    ``{"type": "image"}``; a tool result's content as its text (the templates write it as a string, as transformers'
    examples send it), and each message's tool fields from ``tools`` (a :class:`~refsight.tools.ChatTools`)."""
    turns = turns or [("user", len(segments))]
    messages, start = [], 0
    for i, (role, count) in enumerate(turns):
        content: Any = [
            {"type": "text", "text": s} if isinstance(s, str) else {"type": "image"} for s in segments[start:start + count]
        ]
        if role == "tool":
            content = "".join(part.get("text", "") for part in content)
        messages.append({"role": role, "content": content, **(tools.message_fields(i) if tools is not None else {})})
        start += count
    return messages


def resolved_template(processor: Any) -> str:
    """The template ``apply_chat_template`` renders: the processor's, or its ``default`` when it holds several;
    ValueError as transformers words it when there is none."""
    template = processor.chat_template
    if isinstance(template, Mapping):
        if "default" not in template:
            raise ValueError("The processor has multiple chat templates but none of them are named \"default\"")
        return template["default"]
    if template is None:
        raise ValueError("Cannot use apply_chat_template because this processor does not have a chat template.")
    return template


def render_chat(processor: Any, messages: list[dict[str, Any]], generation_prompt: bool, tools: Any = None,
                variables: Mapping[str, Any] | None = None) -> str:
    """``messages`` in the processor's chat template, as ``apply_chat_template(tokenize=False)`` renders them (with the
    ``tools`` its :class:`~refsight.tools.ChatTools` offers); ``variables``: the template's own, as
    ``apply_chat_template``'s keyword arguments hand them over."""
    special = {key: _plain(value) for key, value in processor.tokenizer.special_tokens_map.items()}
    context = {**special, **(variables or {}), "messages": messages, "tools": None, "documents": None,
               "add_generation_prompt": generation_prompt, **(tools.variables() if tools is not None else {})}
    return render(resolved_template(processor), context, flavour="transformers")


def _plain(value: Any) -> Any:
    """A special token's value as transformers' ``_plain_template_data`` hands it to a template: strings (subclasses
    as plain strings), numbers, lists and dicts of them; any other object as a placeholder naming its type."""
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return f"<{type(value).__name__}>"
