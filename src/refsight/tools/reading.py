"""A generation's answer read as text and tool calls (:class:`ToolReader`), whole or as it streams.

How an answer is read follows from its request (llama-server's and vLLM's rules):

- no tools, ``tool_choice: none``, or a template that teaches no format (:func:`~.formats.format_of`): the answer is
  text, as it comes;
- a forced call (``required``, a named function): the answer is the JSON its schema constrained it to
  (:meth:`~.offer.ToolUse.forced_schema`), read into calls; JSON that does not read (a cut answer) stays text;
- ``auto`` with a format: text up to where the format's calls open, then the calls (:mod:`.readers`), whatever
  JSON schema the caller constrained the answer to (vLLM and Ollama read calls under ``response_format``/``format``
  too; a format whose calls are bare JSON, Llama 3's, then reads a call the schema shaped). A call of a function not
  offered, or calls that do not read, leave the whole answer text: no call is ever guessed.

Streamed, text leaves as soon as it cannot be the start of a call (a piece that may begin an opening marker waits
for the next), and each call once it is complete, so the pieces and calls sent add up to what the whole answer
reads as. Without ``parallel`` only the first call is kept.
"""

from __future__ import annotations

import json
from typing import Any, Callable

from .calls import ToolCall, arguments_text, new_call_id
from .formats import ToolFormat
from .offer import ToolUse

__all__ = ["ToolReader"]


class ToolReader:
    """Reads one generation's answer (see the module docstring); :meth:`watch` while it streams, :meth:`finish` once
    it is whole."""

    def __init__(self, use: ToolUse | None, fmt: ToolFormat | None) -> None:
        self.use = use
        forced = use is not None and use.forces_call
        self.mode = "forced" if forced else (
            "format" if use is not None and use.choice == "auto" and fmt is not None else "text")
        self.format = fmt
        self.made: list[ToolCall] = []
        self.text, self.sent_text, self.sent_calls = "", 0, 0
        self.opened: int | None = None
        self.on_text: Callable[[str], None] | None = None
        self.on_call: Callable[[ToolCall], None] | None = None

    @classmethod
    def of(cls, request: Any, fmt: ToolFormat | None) -> ToolReader:
        """The reader of a :class:`~refsight.requests.GenerationRequest`'s answer, its model's template teaching
        ``fmt``."""
        return cls(request.tools, fmt)

    def watch(self, on_text: Callable[[str], None] | None,
              on_call: Callable[[ToolCall], None] | None) -> Callable[[str], None] | None:
        """The ``on_text`` to stream the generation through: ``on_text`` itself when the answer is text, else one that
        passes its text on to ``on_text`` and its calls to ``on_call`` as they are read (None: not streamed)."""
        if self.mode == "text" or on_text is None:
            return on_text
        self.on_text, self.on_call = on_text, on_call
        return self._piece

    def finish(self, text: str) -> tuple[str, tuple[ToolCall, ...]]:
        """The whole answer ``text`` as text and calls; streamed, what was not sent yet is sent now."""
        self.text = text
        content, calls = self._read(text)
        if self.on_text is not None:
            if len(content) > self.sent_text:
                self.on_text(content[self.sent_text:])
                self.sent_text = len(content)
            self._send(calls)
        return content, calls

    # ---------------------------------------------------------------- reading

    def _read(self, text: str) -> tuple[str, tuple[ToolCall, ...]]:
        if self.mode == "text":
            return text, ()
        if self.mode == "forced":
            calls = self._forced(text)
            return ("", calls) if calls else (text, ())
        opened = self._opening(text)
        pairs = self.format.reader(text[opened:], True, self._type) if opened is not None else None
        calls = self._calls(pairs)
        if not calls and not self.made:
            return text, ()
        return text[:opened], calls

    def _forced(self, text: str) -> tuple[ToolCall, ...]:
        """A forced call's JSON: the named function's arguments, or ``required``'s array of ``{name, parameters}``."""
        try:
            value = json.loads(text)
        except ValueError:
            return ()
        if self.use.function is not None:
            return self._calls([(self.use.function, value)] if isinstance(value, dict) else None)
        if not isinstance(value, list):
            return ()
        pairs = [(item.get("name"), item.get("parameters")) for item in value if isinstance(item, dict)]
        return self._calls(pairs if len(pairs) == len(value) else None)

    def _calls(self, pairs: list[tuple[Any, Any]] | None) -> tuple[ToolCall, ...]:
        """The calls of ``pairs`` (the ids of those made before kept); none unless every one is an offered function
        with object arguments."""
        if not pairs or any(name not in self.use.names or not isinstance(args, dict) for name, args in pairs):
            return tuple(self.made)
        pairs = pairs if self.use.parallel else pairs[:1]
        id_length = self.format.id_length if self.format is not None else None
        for name, arguments in pairs[len(self.made):]:
            self.made.append(ToolCall(new_call_id(id_length), name, arguments_text(arguments)))
        return tuple(self.made[:len(pairs)])

    def _type(self, function: str, parameter: str) -> str | None:
        """The JSON type of ``function``'s ``parameter`` (what an untyped format's value is read as), if declared."""
        if function not in self.use.names:
            return None
        declared = (self.use.parameters(function).get("properties") or {}).get(parameter)
        kind = declared.get("type") if isinstance(declared, dict) else None
        return kind if isinstance(kind, str) else None

    def _opening(self, text: str) -> int | None:
        """Where the format's calls open in ``text``, or None."""
        if self.format.leading:
            stripped = text.lstrip()
            return len(text) - len(stripped) if stripped.startswith(self.format.opens) else None
        found = [at for at in (text.find(mark) for mark in self.format.opens) if at >= 0]
        return min(found) if found else None

    def _held(self, text: str) -> int:
        """How many characters at the end of ``text`` may still become an opening marker (they wait)."""
        if self.format.leading:
            stripped = text.lstrip()
            return len(text) if any(mark.startswith(stripped) for mark in self.format.opens) else 0
        return max((n for mark in self.format.opens for n in range(1, len(mark)) if text.endswith(mark[:n])),
                   default=0)

    # ---------------------------------------------------------------- streaming

    def _piece(self, piece: str) -> None:
        self.text += piece
        if self.mode == "forced":
            return  # JSON until the end: read whole
        if self.opened is None:
            self.opened = self._opening(self.text)
            safe = self.opened if self.opened is not None else len(self.text) - self._held(self.text)
            if safe > self.sent_text:
                self.on_text(self.text[self.sent_text:safe])
                self.sent_text = safe
            if self.opened is None:
                return
        pairs = self.format.reader(self.text[self.opened:], False, self._type)
        if pairs:
            self._send(self._calls(pairs))

    def _send(self, calls: tuple[ToolCall, ...]) -> None:
        if self.on_call is None:
            return
        for call in calls[self.sent_calls:]:
            self.on_call(call)
        self.sent_calls = max(self.sent_calls, len(calls))
