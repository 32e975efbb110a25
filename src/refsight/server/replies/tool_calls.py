"""An answer's tool calls in each dialect's reply (OpenAI's and vLLM's, Ollama's, Anthropic's).

- OpenAI: the message's ``tool_calls`` (``id``, ``type: "function"``, ``function.name``, ``function.arguments`` as
  JSON text), its ``content`` null when the answer said nothing besides, ``finish_reason: "tool_calls"``; streamed,
  one ``delta.tool_calls`` entry per call, whole (``index``, ``id``, ``type``, ``name`` and ``arguments`` at once: a
  client joins deltas by ``index``, so one delta is a complete call);
- Ollama: ``message.tool_calls`` entries of ``{"id", "function": {"index", "name", "arguments"}}``, the arguments
  an object; streamed, a line of its own;
- Anthropic: a ``tool_use`` block per call (``id``, ``name``, ``input``), ``stop_reason: "tool_use"``; streamed,
  ``content_block_start`` with the block, one ``input_json_delta`` with the arguments, ``content_block_stop``.
"""

from __future__ import annotations

from typing import Any, Sequence

from ...tools import ToolCall

__all__ = ["openai_message", "openai_delta", "ollama_calls", "anthropic_block"]


def openai_message(text: str, calls: Sequence[ToolCall]) -> dict[str, Any]:
    """The assistant message of a whole answer: its text, and its calls where it made any."""
    if not calls:
        return {"role": "assistant", "content": text}
    return {"role": "assistant", "content": text or None, "tool_calls": [call.openai_form() for call in calls]}


def openai_delta(call: ToolCall, index: int) -> dict[str, Any]:
    """The ``delta`` of a streamed chunk carrying one whole call, the answer's ``index``-th."""
    return {"tool_calls": [{"index": index, **call.openai_form()}]}


def ollama_calls(calls: Sequence[ToolCall], first: int = 0) -> list[dict[str, Any]]:
    """Ollama's ``message.tool_calls`` of ``calls`` (numbered from ``first``), the arguments as an object."""
    return [{"id": call.id, "function": {"index": first + i, "name": call.name, "arguments": _object(call)}}
            for i, call in enumerate(calls)]


def anthropic_block(call: ToolCall) -> dict[str, Any]:
    """Anthropic's ``tool_use`` block of a call."""
    return {"type": "tool_use", "id": call.id, "name": call.name, "input": _object(call)}


def _object(call: ToolCall) -> Any:
    values = call.argument_values()
    return values if isinstance(values, dict) else {}
