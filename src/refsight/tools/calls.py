"""One tool call: the model asking for a function with its arguments (read out of its answer), or a client sending
a call back in a conversation's history."""

from __future__ import annotations

import json
import secrets
import string
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidInputError
from ..inputs.text import check_text

__all__ = ["ToolCall", "new_call_id", "arguments_text", "MAX_NAME_CHARS"]

#: The longest function name taken (OpenAI's is 64; a name is written into prompts and grammars).
MAX_NAME_CHARS = 256
_ID_CHARS = string.ascii_letters + string.digits


def new_call_id(length: int | None = None) -> str:
    """A fresh call id: ``call_`` and 24 letters and digits (OpenAI's shape), or ``length`` letters and digits alone
    (Mistral's templates take ids of exactly 9)."""
    chars = "".join(secrets.choice(_ID_CHARS) for _ in range(length or 24))
    return chars if length else f"call_{chars}"


def arguments_text(arguments: Any) -> str:
    """A call's arguments as the JSON text clients read (OpenAI's ``arguments``; vLLM's spelling, non-ASCII kept)."""
    return json.dumps(arguments, ensure_ascii=False)


@dataclass(frozen=True)
class ToolCall:
    """A call of the function ``name`` with ``arguments``, the JSON text of an object, under the call's ``id`` (what a
    tool result answers)."""

    id: str
    name: str
    arguments: str

    def __post_init__(self) -> None:
        for field, value in (("id", self.id), ("name", self.name), ("arguments", self.arguments)):
            if not isinstance(value, str):
                raise InvalidInputError(f"tool_calls.{field}", f"must be a string, not {type(value).__name__}")
            check_text(value, f"tool_calls.{field}")
        if not self.name or len(self.name) > MAX_NAME_CHARS:
            raise InvalidInputError("tool_calls.function.name", f"give 1 to {MAX_NAME_CHARS} characters")

    def argument_values(self) -> Any:
        """The arguments as data: the object they spell, or their text when it is not a JSON object (a client's
        history may hold anything; a template gets what it can render)."""
        try:
            values = json.loads(self.arguments)
        except ValueError:
            return self.arguments
        return values if isinstance(values, dict) else self.arguments

    def template_form(self) -> dict[str, Any]:
        """The call as a chat template reads it: OpenAI's shape with the arguments as an object (what transformers'
        ``apply_chat_template`` and vLLM hand templates, which write them with ``tojson`` or walk their items)."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.argument_values()}}

    def openai_form(self) -> dict[str, Any]:
        """The call in OpenAI's ``tool_calls`` (the arguments as JSON text)."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}
