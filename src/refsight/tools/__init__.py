"""Tool calling: the tools a chat offers its model, rendered by its chat template, and the calls read out of its answer.

On the ground floor (it imports the errors and :mod:`refsight.inputs` alone), so the request, the backends and every
front end share one meaning of it:

- :mod:`.offer`: :class:`ToolUse` (the functions offered, ``tool_choice``, ``parallel_tool_calls``; a forced call's
  JSON schema), :class:`ToolTurn` (an assistant turn's calls, a tool result's call id) and :class:`ChatTools` (what a
  chat template is given: its ``tools`` variable and the messages' tool fields), and :func:`checked_tool_turns`, the
  turns' tool fields checked against the chat's roles;
- :mod:`.calls`: :class:`ToolCall`, one call (its id, the function, its arguments as JSON text);
- :mod:`.formats`: the formats models call tools in, as data, and :func:`format_of`, the format a template teaches;
- :mod:`.readers`: one reader per format, on what the real models emit;
- :mod:`.reading`: :class:`ToolReader`, an answer read as text and calls, whole or as it streams.
"""

from __future__ import annotations

from .calls import ToolCall, new_call_id
from .formats import FORMATS, ToolFormat, format_named, format_of
from .offer import MAX_TOOLS, TOOL_CHOICES, ChatTools, ToolTurn, ToolUse, checked_tool_turns
from .reading import ToolReader

__all__ = [
    "ToolCall", "new_call_id", "FORMATS", "ToolFormat", "format_named", "format_of", "MAX_TOOLS", "TOOL_CHOICES",
    "ChatTools", "ToolTurn", "ToolUse", "ToolReader", "checked_tool_turns",
]
