"""The tool fields of every chat dialect, read into refsight's one meaning of them (:mod:`refsight.tools`): a
:class:`~refsight.tools.ToolUse` and each turn's :class:`~refsight.tools.ToolTurn`.

- OpenAI's and vLLM's (llama-server's chat too): ``tools`` (``{"type": "function", "function": {"name",
  "description", "parameters"}}``; another tool type is refused by name), ``tool_choice`` (``auto``, ``none``,
  ``required``, or ``{"type": "function", "function": {"name"}}``), ``parallel_tool_calls``; an assistant message's
  ``tool_calls`` (``id``, ``function.name``, ``function.arguments`` as JSON text) and a ``tool`` message's
  ``tool_call_id`` (and ``name``);
- Ollama's: ``tools`` as OpenAI's, no ``tool_choice`` (the model chooses); an assistant message's ``tool_calls``
  (``function.name``, ``function.arguments`` as an object) and a ``tool`` message's ``tool_name``;
- Anthropic's: ``tools`` (``name``, ``description``, ``input_schema``), ``tool_choice`` (``{"type": "auto" | "any" |
  "tool" | "none", "name", "disable_parallel_tool_use"}``); its ``tool_use`` and ``tool_result`` blocks are read by
  its route into the OpenAI messages below.

``tools`` null or ``[]`` offers nothing (llama-server's reading); ``tool_choice`` ``required`` or a function with no
tools is a 400 naming it. A bad value anywhere is an :class:`~refsight.InvalidInputError` naming the field, which the
server answers as a 400.
"""

from __future__ import annotations

import json
from typing import Any, Iterable

from ... import InvalidInputError
from ...tools import TOOL_CHOICES, ChatTools, ToolCall, ToolTurn, ToolUse
from ..edge.http_errors import ApiError

__all__ = [
    "openai_tool_use", "anthropic_tool_use", "tool_turns_of", "check_tools", "chat_tools_of", "history_call",
    "tool_texts",
]


def openai_tool_use(tools: list[Any] | None, tool_choice: Any = None, parallel: bool | None = None) -> ToolUse | None:
    """OpenAI's (and Ollama's) ``tools``, ``tool_choice`` and ``parallel_tool_calls``; None when no tool is offered."""
    functions = [_function_of(tool, i) for i, tool in enumerate(tools or [])]
    choice, function = _openai_choice(tool_choice)
    return _tool_use(functions, choice, function, parallel)


def _function_of(tool: Any, i: int) -> Any:
    if not isinstance(tool, dict):
        raise InvalidInputError(f"tools[{i}]", "a tool is an object: {\"type\": \"function\", \"function\": {...}}")
    if tool.get("type", "function") != "function" or not isinstance(tool.get("function"), dict):
        raise InvalidInputError(f"tools[{i}].type", "only function tools are supported ({\"type\": \"function\", "
                                "\"function\": {\"name\", \"description\", \"parameters\"}})")
    return tool["function"]


def _openai_choice(value: Any) -> tuple[str, str | None]:
    if value is None:
        return "auto", None
    if isinstance(value, str) and value in TOOL_CHOICES:
        return value, None
    if isinstance(value, dict) and value.get("type") == "function" and isinstance(value.get("function"), dict):
        name = value["function"].get("name")
        if isinstance(name, str):
            return "auto", name
    raise InvalidInputError("tool_choice", f"must be one of {', '.join(TOOL_CHOICES)} or {{\"type\": \"function\", "
                            f"\"function\": {{\"name\": ...}}}}, not {json.dumps(value)[:80]}")


def anthropic_tool_use(tools: list[Any] | None, tool_choice: dict[str, Any] | None) -> ToolUse | None:
    """Anthropic's ``tools`` and ``tool_choice`` (``any`` is ``required``, ``tool`` names the function,
    ``disable_parallel_tool_use`` asks for one call at most)."""
    functions = []
    for i, tool in enumerate(tools or []):
        if not isinstance(tool, dict):
            raise InvalidInputError(f"tools[{i}]", "a tool is an object with name, description and input_schema")
        if tool.get("type") not in (None, "custom"):
            raise InvalidInputError(f"tools[{i}].type", f"server tools ({str(tool.get('type'))[:40]}) are not "
                                    "supported: give client tools (name, description, input_schema)")
        functions.append({"name": tool.get("name"), "description": tool.get("description"),
                          "parameters": tool.get("input_schema")})
    choice = tool_choice or {}
    kind = choice.get("type", "auto")
    if kind not in ("auto", "any", "tool", "none"):
        raise InvalidInputError("tool_choice.type", f"must be auto, any, tool or none, not {str(kind)[:40]!r}")
    function = choice.get("name") if kind == "tool" else None
    if kind == "tool" and not isinstance(function, str):
        raise InvalidInputError("tool_choice.name", "a tool choice of type tool names the tool")
    disable = choice.get("disable_parallel_tool_use")
    if disable is not None and not isinstance(disable, bool):
        raise InvalidInputError("tool_choice.disable_parallel_tool_use", "must be true or false")
    mapped = {"auto": "auto", "any": "required", "tool": "auto", "none": "none"}[kind]
    return _tool_use(functions, mapped, function, None if disable is None else not disable)


def _tool_use(functions: list[Any], choice: str, function: str | None, parallel: bool | None) -> ToolUse | None:
    if not functions:
        if function is not None or choice == "required":
            raise InvalidInputError("tool_choice", "asks for a tool call, but no tools are offered")
        return None
    return ToolUse(functions, choice, function, True if parallel is None else parallel)


def history_call(call_id: Any, name: Any, arguments: Any, where: str) -> ToolCall:
    """A call a client sends back in its history: ``arguments`` as JSON text (OpenAI's) or an object (Ollama's)."""
    if not isinstance(name, str):
        raise InvalidInputError(f"{where}.function.name", "a tool call names its function")
    text = arguments if isinstance(arguments, str) else json.dumps(arguments if arguments is not None else {},
                                                                   ensure_ascii=False)
    if call_id is not None and not isinstance(call_id, str):
        raise InvalidInputError(f"{where}.id", "must be a string")
    return ToolCall(call_id or "", name, text)


def tool_turns_of(messages: Iterable[Any]) -> list[ToolTurn | None] | None:
    """Each OpenAI message's tool fields (an assistant's ``tool_calls``, a tool result's ``tool_call_id`` and
    ``name``), in turn order; None when no message has any."""
    turns: list[ToolTurn | None] = []
    for i, message in enumerate(messages):
        calls = [history_call(c.id, c.function.name, c.function.arguments, f"messages[{i}].tool_calls[{j}]")
                 for j, c in enumerate(message.tool_calls or [])]
        if calls and message.role != "assistant":
            raise InvalidInputError(f"messages[{i}].tool_calls", "only an assistant message calls tools")
        if message.role == "tool":
            turns.append(ToolTurn(call_id=message.tool_call_id, name=getattr(message, "name", None)))
        else:
            turns.append(ToolTurn(calls) if calls else None)
    return turns if any(t is not None for t in turns) else None


def check_tools(service: Any, use: ToolUse | None, turns: list[ToolTurn | None] | None) -> None:
    """400 naming ``tools`` (or ``messages``, for tool calls and results alone) where the served backend cannot offer
    tools to its model: tool calling needs the chat template rendered here (the transformers and llama.cpp runtimes;
    a vLLM server renders its own)."""
    if (use is not None or turns) and not service.generation_support().tools:
        field = "tools" if use is not None else "messages"
        if service.config.backend_options.jinja is False:  # llama-server's words: "tools param requires --jinja flag"
            raise ApiError(400, "unsupported", f"{field}: tools need the Jinja chat template; this server renders "
                           "chats without it (--no-jinja), as llama-server refuses them there", param=field)
        raise ApiError(400, "unsupported", f"{field}: the served backend ({service.model}) cannot offer tools to its "
                       "model: tool calling needs its chat template rendered by refsight (the transformers and "
                       "llama.cpp runtimes)", param=field)


def chat_tools_of(use: ToolUse | None, turns: list[ToolTurn | None] | None) -> ChatTools | None:
    """What the chat template is given (``/apply-template``, the token counts, ``verbose``); None: nothing."""
    return ChatTools(use, tuple(turns or ())) if use is not None or turns else None


def tool_texts(use: ToolUse | None, turns: list[ToolTurn | None] | None, service: Any) -> list[str]:
    """The text the tools add to a prompt where the served template renders them (counted against the prompt limit
    before any model work)."""
    tools = chat_tools_of(use, turns)
    return tools.texts(service.template_reads) if tools is not None else []
