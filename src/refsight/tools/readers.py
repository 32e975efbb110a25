"""The calls in a model's answer, one reader per format (:mod:`.formats` names which format a template teaches).

Each reader takes the answer from where its calls open (the format's opening marker) and returns ``(name,
arguments)`` pairs, the arguments a JSON object: every call complete so far (``final=False``, while the answer
streams), or every call of the whole answer (``final=True``, an unclosed last call taken when it parses); None when
the text is not calls of that format (the caller keeps it as text: no call is ever guessed).

The shapes are what the real models emit (their templates write the same for a call in a conversation's history):

- ``hermes`` (Qwen2.5, Qwen3, Qwen3-VL, Hermes): ``<tool_call>\\n{"name": "f", "arguments": {...}}\\n</tool_call>``;
- ``qwen3_coder`` (Qwen3.5, Qwen3-Coder): ``<tool_call>\\n<function=f>\\n<parameter=p>\\nvalue\\n</parameter>\\n
  </function>\\n</tool_call>``, each value read by its parameter's type;
- ``mistral``: ``[TOOL_CALLS][{"name": "f", "arguments": {...}}]`` (Mistral Nemo, Small 3.1, Pixtral) or
  ``[TOOL_CALLS]f[ARGS]{...}`` (Mistral Small 3.2, Magistral, Devstral: ``[CALL_ID]id`` may stand before ``[ARGS]``);
- ``gemma4`` (Gemma 4): ``<|tool_call>call:f{key:<|"|>text<|"|>,n:3}<tool_call|>``, Gemma's own value syntax;
- ``llama3_json`` (Llama 3.1-3.3, Llama 3.2 Vision, Llama 4): the answer is ``{"name": "f", "parameters": {...}}``
  (after ``<|python_tag|>`` where the model writes it), several separated by ``;``.
"""

from __future__ import annotations

import json
import re
from typing import Any, Callable

__all__ = ["Calls", "read_hermes", "read_qwen3_coder", "read_mistral", "read_gemma4", "read_llama3_json"]

#: ``(name, arguments)`` pairs read out of an answer, or None: not calls.
Calls = list[tuple[str, dict[str, Any]]] | None
#: What a reader is: ``(text from the opening marker, final, the function's parameter types) -> Calls``.
Reader = Callable[[str, bool, Callable[[str, str], str | None]], Calls]

_DECODER = json.JSONDecoder()
_SPACE = re.compile(r"\s*")
_KEY = re.compile(r"([^:{}\[\],]+):")
_SCALAR = re.compile(r"-?\d+(\.\d+)?([eE][-+]?\d+)?|true|false|null")
#: Nesting a Gemma value may have (an answer is at most a few thousand tokens; this bounds the recursion).
MAX_DEPTH = 64


def _object(text: str) -> dict[str, Any] | None:
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _arguments(value: Any) -> dict[str, Any] | None:
    """A call's arguments: an object, or a JSON string spelling one (some models quote them)."""
    if isinstance(value, str):
        value = _object(value)
    return value if isinstance(value, dict) else None


def _named_call(obj: Any, *keys: str) -> tuple[str, dict[str, Any]] | None:
    """``(name, arguments)`` of a ``{"name": ..., KEY: {...}}`` object, the first of ``keys`` present (none: no
    arguments); None when it is not one."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    key = next((k for k in keys if k in obj), None)
    arguments = _arguments(obj[key]) if key is not None else {}
    return None if arguments is None else (obj["name"], arguments)


def read_hermes(text: str, final: bool, types: Callable[[str, str], str | None]) -> Calls:
    """``<tool_call>{"name", "arguments"}</tool_call>`` blocks."""
    calls = []
    for match in re.finditer(r"<tool_call>(.*?)(</tool_call>|\Z)", text, re.S):
        if not match.group(2) and not final:
            break  # still streaming in
        call = _named_call(_object(match.group(1).strip()), "arguments", "parameters")
        if call is None:
            return None
        calls.append(call)
    return calls


def read_qwen3_coder(text: str, final: bool, types: Callable[[str, str], str | None]) -> Calls:
    """``<tool_call><function=f><parameter=p>value</parameter></function></tool_call>`` blocks; a value is text
    unless its parameter's type says otherwise (then read as JSON, as vLLM's reader does)."""
    calls = []
    for match in re.finditer(r"<tool_call>(.*?)(</tool_call>|\Z)", text, re.S):
        if not match.group(2) and not final:
            break
        function = re.search(r"<function=([^>\n]+)>(.*?)(</function>|\Z)", match.group(1), re.S)
        if function is None:
            return None
        name, arguments = function.group(1).strip(), {}
        for parameter in re.finditer(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", function.group(2), re.S):
            key, raw = parameter.group(1).strip(), parameter.group(2)
            arguments[key] = raw if types(name, key) in (None, "string") else _json_or_text(raw)
        calls.append((name, arguments))
    return calls


def _json_or_text(raw: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def read_mistral(text: str, final: bool, types: Callable[[str, str], str | None]) -> Calls:
    """``[TOOL_CALLS]`` and a JSON array of ``{"name", "arguments"}``, or ``[TOOL_CALLS]`` per call with the name,
    ``[CALL_ID]`` and ``[ARGS]`` before the arguments object."""
    calls: list[tuple[str, dict[str, Any]]] = []
    for chunk in text.split("[TOOL_CALLS]")[1:]:
        found, state = _mistral_chunk(chunk.strip())
        if state == "bad" or (state == "open" and final):
            return None
        if state == "open":
            return calls  # the calls before it; the rest may still be streaming
        calls += found
    return calls


def _mistral_chunk(chunk: str) -> tuple[list[tuple[str, dict[str, Any]]], str]:
    """One ``[TOOL_CALLS]`` chunk's calls, and how it reads: "done", "open" (its JSON is not complete: more may come)
    or "bad" (no call can be read from it)."""
    if chunk.startswith("["):
        found = _decoded(chunk)
        if found is None:
            return [], "open"
        listed = [_named_call(item, "arguments", "parameters") for item in (found if isinstance(found, list) else [None])]
        return (listed, "done") if None not in listed else ([], "bad")
    named = re.match(r"([^\s\[{]+)\s*(?:\[CALL_ID\][^\[{]*)?(?:\[ARGS\])?\s*", chunk)
    if named is None:
        return [], "bad"
    arguments = _decoded(chunk[named.end():])
    if arguments is None:
        return [], "open"
    return ([(named.group(1), arguments)], "done") if isinstance(arguments, dict) else ([], "bad")


def _decoded(text: str) -> Any:
    """The JSON value ``text`` opens with, or None while it is incomplete or not JSON."""
    try:
        return _DECODER.raw_decode(text)[0]
    except ValueError:
        return None


def read_llama3_json(text: str, final: bool, types: Callable[[str, str], str | None]) -> Calls:
    """``{"name", "parameters"}`` objects (``arguments`` taken too), separated by ``;``, after ``<|python_tag|>``."""
    rest = text.strip().removeprefix("<|python_tag|>").lstrip()
    calls = []
    while rest:
        try:
            obj, end = _DECODER.raw_decode(rest)
        except ValueError:
            return calls if not final else None
        call = _named_call(obj, "parameters", "arguments")
        if call is None:
            return None
        calls.append(call)
        rest = rest[end:].strip()
        if rest and not rest.startswith(";"):
            return None  # text after a call: not an answer of calls
        rest = rest[1:].lstrip()
    return calls


def read_gemma4(text: str, final: bool, types: Callable[[str, str], str | None]) -> Calls:
    """``<|tool_call>call:NAME{...}<tool_call|>`` blocks, the arguments in Gemma's syntax (:class:`_Gemma`)."""
    calls = []
    for match in re.finditer(r"<\|tool_call>(.*?)(<tool_call\|>|\Z)", text, re.S):
        if not match.group(2) and not final:
            break
        body = match.group(1).strip()
        named = re.match(r"call:([^{\s]+)", body)
        if named is None:
            return None
        parser = _Gemma(body, named.end())
        try:
            arguments = parser.value(0)
        except ValueError:
            return None
        if not isinstance(arguments, dict) or body[parser.at:].strip():
            return None
        calls.append((named.group(1), arguments))
    return calls


class _Gemma:
    """Gemma 4's value syntax: ``{key:value,...}`` with bare keys, ``[...]``, strings between ``<|"|>`` marks,
    numbers, ``true``/``false``/``null``; ValueError where the text is not that."""

    QUOTE = '<|"|>'

    def __init__(self, text: str, at: int) -> None:
        self.text, self.at = text, at

    def value(self, depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise ValueError("nested too deeply")
        text, at = self.text, self.at
        if text.startswith(self.QUOTE, at):
            end = text.find(self.QUOTE, at + len(self.QUOTE))
            if end < 0:
                raise ValueError("an unclosed string")
            self.at = end + len(self.QUOTE)
            return text[at + len(self.QUOTE):end]
        if text.startswith("{", at) or text.startswith("[", at):
            return self._container(depth)
        scalar = _SCALAR.match(text, at)
        if scalar is None:
            raise ValueError(f"no value at {at}")
        self.at = scalar.end()
        return json.loads(scalar.group(0))

    def _container(self, depth: int) -> Any:
        opening = self.text[self.at]
        closing, items = ("}" if opening == "{" else "]"), []
        self.at += 1
        self._space()
        if self.text.startswith(closing, self.at):
            self.at += 1
            return {} if opening == "{" else []
        while True:
            if opening == "{":
                key = _KEY.match(self.text, self.at)
                if key is None:
                    raise ValueError("a key without a colon")
                self.at = key.end()
                self._space()
                items.append((key.group(1).strip(), self.value(depth + 1)))
            else:
                items.append(self.value(depth + 1))
            self._space()
            if self.text.startswith(",", self.at):
                self.at += 1
                self._space()
            elif self.text.startswith(closing, self.at):
                self.at += 1
                return dict(items) if opening == "{" else items
            else:
                raise ValueError(f"a missing comma at {self.at}")

    def _space(self) -> None:
        self.at = _SPACE.match(self.text, self.at).end()
