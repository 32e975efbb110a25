"""The tools a chat offers the model (:class:`ToolUse`), the tool fields of its turns (:class:`ToolTurn`), and what its
chat template is given of both (:class:`ChatTools`).

``tool_choice`` means what it means to llama-server and vLLM: ``auto`` (the model may call), ``none`` (the tools are
still rendered, as both servers render them, but the answer is read as text), ``required`` (at least one call) or
one named function. A forced call (``required``, named) is vLLM's: the answer is constrained to a JSON schema made
from the tools' ``parameters`` (:meth:`ToolUse.forced_schema`: the named function's parameters; for ``required`` an
array of ``{"name", "parameters"}`` objects, at most one without ``parallel``), whatever the template, so it holds on
every runtime with a constrained decoder.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Callable

from ..errors import InvalidInputError
from ..inputs.json_schema import check_json_schema
from ..inputs.text import check_texts
from .calls import MAX_NAME_CHARS, ToolCall

__all__ = ["ToolUse", "ToolTurn", "ChatTools", "TOOL_CHOICES", "MAX_TOOLS", "NO_PARAMETERS", "checked_tool_turns"]

#: What ``tool_choice`` may say besides a function's name.
TOOL_CHOICES = ("auto", "none", "required")
#: The most tools one request may offer (OpenAI's limit).
MAX_TOOLS = 128
#: A function's parameters when it names none: OpenAI's meaning of an omitted ``parameters``, no arguments.
NO_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


def _checked_function(function: Any, where: str) -> dict[str, Any]:
    """A function definition (``name``, ``description``, ``parameters``) as templates get it; InvalidInputError
    naming ``where`` for anything else."""
    if not isinstance(function, Mapping):
        raise InvalidInputError(where, f"a tool is a function definition object, not {type(function).__name__}")
    name, description = _checked_name(function.get("name"), where), function.get("description")
    parameters = function.get("parameters")
    if description is not None and not isinstance(description, str):
        raise InvalidInputError(f"{where}.description", "must be a string")
    if parameters is not None and not isinstance(parameters, Mapping):
        raise InvalidInputError(f"{where}.parameters", "must be a JSON schema object")
    checked = {"name": name, "description": description or "",
               "parameters": dict(parameters) if parameters is not None else dict(NO_PARAMETERS)}
    return check_texts(checked, where)


def _checked_name(name: Any, where: str) -> str:
    """A function's name: what a call names it by, so one word of bounded length."""
    if not isinstance(name, str) or not name or len(name) > MAX_NAME_CHARS or any(c.isspace() for c in name):
        raise InvalidInputError(f"{where}.name", f"a function's name is 1 to {MAX_NAME_CHARS} characters, no spaces")
    return name


def _checked_functions(functions: Any) -> tuple[dict[str, Any], ...]:
    """The offered function definitions, checked: a list of 1 to :data:`MAX_TOOLS`, no name twice."""
    if isinstance(functions, (str, bytes, Mapping)) or not isinstance(functions, Sequence):
        raise InvalidInputError("tools", "a list of function definitions")
    if not 1 <= len(functions) <= MAX_TOOLS:
        raise InvalidInputError("tools", f"offer 1 to {MAX_TOOLS} tools (none: leave tools out)")
    checked = tuple(_checked_function(f, f"tools[{i}].function") for i, f in enumerate(functions))
    names = [f["name"] for f in checked]
    if len(set(names)) != len(names):
        twice = next(n for n in names if names.count(n) > 1)
        raise InvalidInputError("tools", f"the function {twice!r} is offered twice")
    return checked


@dataclass(frozen=True)
class ToolUse:
    """The functions a chat offers (``functions``: OpenAI's function objects, ``name``, ``description``,
    ``parameters``), ``choice`` (:data:`TOOL_CHOICES`), ``function`` (the one function the model must call: OpenAI's
    named choice, Anthropic's ``{"type": "tool"}``) and ``parallel`` (more than one call in an answer)."""

    functions: Sequence[Mapping[str, Any]]
    choice: str = "auto"
    function: str | None = None
    parallel: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "functions", _checked_functions(self.functions))
        if self.choice not in TOOL_CHOICES:
            raise InvalidInputError("tool_choice", f"must be one of {', '.join(TOOL_CHOICES)} or a function, "
                                    f"not {self.choice!r}")
        if self.function is not None and self.function not in self.names:
            raise InvalidInputError("tool_choice", f"names the function {self.function!r}, which no tool offers")
        if not isinstance(self.parallel, bool):
            raise InvalidInputError("parallel_tool_calls", "must be true or false")

    @property
    def names(self) -> tuple[str, ...]:
        """The offered functions' names, in order."""
        return tuple(f["name"] for f in self.functions)

    @property
    def forces_call(self) -> bool:
        """Whether the answer must be a call (``required``, or a named function): a JSON-constrained answer."""
        return self.function is not None or self.choice == "required"

    def parameters(self, name: str) -> dict[str, Any]:
        """The JSON schema of ``name``'s arguments."""
        return next(f["parameters"] for f in self.functions if f["name"] == name)

    def template_tools(self) -> list[dict[str, Any]]:
        """The ``tools`` a chat template reads: OpenAI's ``{"type": "function", "function": {...}}`` entries."""
        return [{"type": "function", "function": dict(f)} for f in self.functions]

    def forced_schema(self) -> dict[str, Any] | None:
        """The JSON schema a forced call's answer follows (vLLM's): the named function's parameters, or for
        ``required`` an array of ``{"name", "parameters"}`` calls (one at most without ``parallel``); None when the
        model chooses. Each function's parameters are checked as any JSON schema is, naming the tool."""
        if not self.forces_call:
            return None
        chosen = [self.function] if self.function is not None else list(self.names)
        schemas = {name: self._checked_parameters(name) for name in chosen}
        if self.function is not None:
            return schemas[self.function]
        definitions: dict[str, Any] = {}
        calls = [{"type": "object", "properties": {"name": {"type": "string", "enum": [name]},
                                                  "parameters": _hoisted(schema, definitions, name)},
                  "required": ["name", "parameters"]} for name, schema in schemas.items()]
        forced: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": calls}}
        if not self.parallel:
            forced["maxItems"] = 1
        if definitions:
            forced["$defs"] = definitions
        return forced

    def _checked_parameters(self, name: str) -> dict[str, Any]:
        where = f"tools[{self.names.index(name)}].function.parameters"
        return check_json_schema(self.parameters(name), where)


def _hoisted(schema: dict[str, Any], definitions: dict[str, Any], name: str) -> dict[str, Any]:
    """``schema`` with its ``$defs`` moved into ``definitions`` (the array schema's root, where ``#/$defs/X`` points
    once the parameters sit inside it); two tools defining one name differently cannot share the root."""
    own = schema.get("$defs")
    if not isinstance(own, Mapping):
        return schema
    for key, value in own.items():
        if key in definitions and definitions[key] != value:
            raise InvalidInputError("tools", f"the tools define $defs.{key} differently ({name!r} among them): "
                                    "tool_choice required cannot join them into one schema")
        definitions[key] = value
    return {k: v for k, v in schema.items() if k != "$defs"}


@dataclass(frozen=True)
class ToolTurn:
    """The tool fields of one chat turn: an assistant turn's ``calls``; a tool turn's ``call_id`` (the call it
    answers) and ``name`` (the function's, where the client gave it)."""

    calls: Sequence[ToolCall] = ()
    call_id: str | None = None
    name: str | None = None

    def __post_init__(self) -> None:
        calls = tuple(self.calls)
        if not all(isinstance(c, ToolCall) for c in calls):
            raise InvalidInputError("tool_turns", "a turn's calls are ToolCall values")
        object.__setattr__(self, "calls", calls)
        for where, value in (("tool_call_id", self.call_id), ("name", self.name)):
            if value is not None and not isinstance(value, str):
                raise InvalidInputError(where, "must be a string")
            check_texts(value, where)

    def belongs_on(self, role: str) -> bool:
        """Whether these fields may sit on a turn of ``role``: calls on an assistant's, a call id on a tool's."""
        return not ((self.calls and role != "assistant") or (self.call_id and role != "tool"))


def checked_tool_turns(tool_turns: Sequence[ToolTurn | None], turns: Sequence[tuple[str, int]] | None,
                       ) -> tuple[ToolTurn | None, ...] | None:
    """A chat's tool fields as a tuple, one entry per turn of ``turns`` (``(role, count)`` pairs), each on a turn of
    the role its fields belong to (calls on an assistant's, a call id on a tool's); None where no turn has any."""
    checked = tuple(tool_turns)
    if any(t is not None and not isinstance(t, ToolTurn) for t in checked):
        raise InvalidInputError("tool_turns", "each turn's tool fields are a ToolTurn or None")
    if all(t is None for t in checked):
        return None  # no turn has any: the same request as without them (its turns may be planned away)
    if turns is None or len(checked) != len(turns):
        raise InvalidInputError("tool_turns", "give one entry (or None) per turn")
    for i, (turn, (role, _)) in enumerate(zip(checked, turns)):
        if turn is not None and not turn.belongs_on(role):
            raise InvalidInputError(f"tool_turns[{i}]", f"a {role} turn carries no calls or call id")
    return checked


@dataclass(frozen=True)
class ChatTools:
    """What a chat template is given about tools: ``use`` (the offered functions, its ``tools`` variable; None: the
    variable is not given) and ``turns``, each turn's :class:`ToolTurn` (or None) in turn order."""

    use: ToolUse | None = None
    turns: tuple[ToolTurn | None, ...] = field(default=())

    def variables(self) -> dict[str, Any]:
        """The template variables: ``tools`` where tools are offered."""
        return {"tools": self.use.template_tools()} if self.use is not None else {}

    def message_fields(self, index: int) -> dict[str, Any]:
        """What turn ``index``'s message adds: an assistant's ``tool_calls`` (and ``content`` ""), a tool result's
        ``tool_call_id`` and ``name`` (the called function's, found by its id where the client left it out)."""
        turn = self.turns[index] if index < len(self.turns) else None
        if turn is None:
            return {}
        fields: dict[str, Any] = {}
        if turn.calls:
            fields["tool_calls"] = [call.template_form() for call in turn.calls]
        if turn.call_id is not None:
            fields["tool_call_id"] = turn.call_id
        name = turn.name if turn.name is not None else self._called(turn.call_id, index)
        if name is not None:
            fields["name"] = name
        return fields

    def _called(self, call_id: str | None, before: int) -> str | None:
        earlier = (call for turn in self.turns[:before] if turn is not None for call in turn.calls)
        return next((call.name for call in earlier if call_id is not None and call.id == call_id), None)

    def texts(self, reads: Callable[[str], bool]) -> list[str]:
        """The text tools add to a prompt whose template ``reads`` a variable (``tools``, ``tool_calls``), for its
        size: the offered definitions, the calls' names and arguments; none a template leaves out."""
        texts = [json.dumps(self.use.template_tools(), ensure_ascii=False)] if (
            self.use is not None and reads("tools")) else []
        if reads("tool_calls"):
            for turn in self.turns:
                texts += [f"{call.name} {call.arguments}" for call in (turn.calls if turn is not None else ())]
        return texts
