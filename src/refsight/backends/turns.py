"""Chat turns of a request: checked against its segments, or folded into text for a backend without turns;
and how the rendered prompt ends (:data:`refsight.requests.PROMPT_ENDS`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import InvalidInputError

__all__ = ["ROLES", "plan_turns", "check_prompt_form", "split_final_turn", "tool_texts"]

#: The chat roles a turn may have (``tool``: a tool's result, :class:`refsight.tools.ToolTurn` names its call).
ROLES = ("system", "user", "assistant", "tool")


def plan_turns(
    segments: list[Any], turns: Sequence[tuple[str, int]] | None, supported: bool
) -> tuple[list[Any], list[tuple[str, int]] | None]:
    """Check ``turns`` against ``segments``; for a backend without turns, label them in text instead."""
    if turns is None:
        return segments, None
    turns = _checked_turns(turns, len(segments))
    if len(turns) == 1 and turns[0][0] == "user":
        return segments, None  # one user turn is the plain prompt
    if supported:
        return segments, turns
    return _labelled(segments, turns), None


def _checked_turns(turns: Sequence[tuple[str, int]], segments: int) -> list[tuple[str, int]]:
    """``(role, count)`` pairs, each a known role and a count, together covering the ``segments`` exactly."""
    turns = [(str(role), int(count)) for role, count in turns]
    for i, (role, count) in enumerate(turns):
        if role not in ROLES:
            raise InvalidInputError(f"turns[{i}]", f"role must be one of {', '.join(ROLES)}, not {role!r}")
        if count < 0:
            raise InvalidInputError(f"turns[{i}]", "a turn's segment count cannot be negative")
    if sum(count for _, count in turns) != segments:
        raise InvalidInputError("turns", f"the turns cover {sum(c for _, c in turns)} segments, not {segments}")
    return turns


def _labelled(segments: list[Any], turns: list[tuple[str, int]]) -> list[Any]:
    """The segments of a backend that renders one user turn: each turn introduced by its role in the text."""
    labelled: list[Any] = []
    start = 0
    for role, count in turns:
        labelled.append(f"{role}:")
        labelled += segments[start:start + count]
        start += count
    return labelled


def check_prompt_form(backend: Any, i: int, request: Any) -> None:
    """InvalidInputError for a raw prompt ``backend`` cannot take (or one with turns), or a ``prompt_end`` it does
    not render (its ``prompt_ends``), template variables where it renders no template, or a ``prompt_end`` the prompt
    cannot take: ``continue`` needs a final assistant turn of text
    only (its text is written as is after the opening of the answer's turn)."""
    _check_raw_prompt(backend, i, request)
    _check_tools(backend, request)
    if request.template_variables and not backend.renders_template_variables:
        raise InvalidInputError("template_variables", f"{backend.name} renders no chat template to hand them to")
    if request.prompt_end != "generation_prompt" and request.prompt_end not in backend.prompt_ends:
        raise InvalidInputError("prompt_end", f"{backend.name} cannot end a prompt with {request.prompt_end!r}")
    if request.prompt_end == "continue":
        _check_continued(request)


def _check_raw_prompt(backend: Any, i: int, request: Any) -> None:
    """A raw prompt only where ``backend`` takes one, and never with turns (it is the whole prompt)."""
    if request.raw_prompt and not backend.supports_raw_prompt:
        raise InvalidInputError(f"requests[{i}].raw_prompt", f"{backend.name} renders every prompt in its chat template")
    if request.raw_prompt and request.turns is not None:
        raise InvalidInputError(f"requests[{i}].raw_prompt", "a raw prompt is the whole prompt: it takes no turns")


def _check_tools(backend: Any, request: Any) -> None:
    """Tools (offered, or in the turns) only where refsight renders the template that shows them to the model."""
    if request.chat_tools is None or (backend.supports_tools and not request.raw_prompt):
        return
    where = "tools" if request.tools is not None else "messages"
    if request.raw_prompt:
        raise InvalidInputError(where, "a raw prompt is the whole prompt: it takes no tools or tool turns")
    raise InvalidInputError(where, f"{backend.name} cannot offer tools to its model: tool calling needs the chat "
                            "template rendered by refsight (the transformers and llama.cpp runtimes)")


def _check_continued(request: Any) -> None:
    """``continue``'s prompt: a final assistant turn of text only, and no tool calls in it (llama-server's rule)."""
    turns, segments = request.turns, request.segments
    if not turns or turns[-1][0] != "assistant":
        raise InvalidInputError("prompt_end", "continue needs a final assistant turn to continue")
    if any(not isinstance(s, str) for s in segments[len(segments) - int(turns[-1][1]):]):
        raise InvalidInputError("prompt_end", "the continued assistant turn takes text only")
    if request.tool_turns and request.tool_turns[-1] is not None and request.tool_turns[-1].calls:
        raise InvalidInputError("messages", "cannot continue an assistant message that holds tool calls "
                                "(llama-server's rule): send its result as a tool message")


def split_final_turn(
    segments: Sequence[Any], turns: Sequence[tuple[str, int]]
) -> tuple[list[Any], list[tuple[str, int]], str]:
    """The segments and turns before the final turn, and the final turn's text: a continued prompt is the
    earlier turns with the opening of the answer's turn, then that text (as llama-server renders a prefill)."""
    count = int(turns[-1][1])
    head = list(segments)[: len(segments) - count]
    return head, [(str(role), int(n)) for role, n in turns[:-1]], "".join(segments[len(segments) - count:])


def tool_texts(backend: Any, request: Any) -> list[str]:
    """The text a request's tools add to its prompt where ``backend``'s template renders them (the definitions, the
    calls in its turns), counted in its size."""
    tools = request.chat_tools
    return tools.texts(backend.chat_template_reads) if tools is not None else []
