"""The tool-call formats models are trained on, as data: what a chat template holds that names the format, what
opens the calls in an answer, and the reader of its calls (:mod:`.readers`).

A model calls tools in the format its chat template teaches it (and writes its history in), so the format is read
off the template, as llama.cpp picks its parser by the template's text: :func:`format_of` is the first entry whose
``signature`` strings the template all holds, among templates that read the ``tools`` variable. A template that
reads no ``tools`` has no format: the model is offered nothing it was taught to call, and its answer is text
(llama-server renders such a template with the tools it ignores and parses no call either). The order matters where
one format's signature holds another's (Qwen3.5's XML calls sit inside ``<tool_call>`` as Qwen2.5's JSON does).

The families refsight serves, by the format their real templates carry: Qwen2.5-VL's and Qwen2-VL's templates teach
none (Qwen's text models: ``hermes``); Qwen3-VL (``qwen3_vl``, ``qwen3_vl_moe``): ``hermes``; Qwen3.5
(``qwen3_5``, ``qwen3_5_moe``): ``qwen3_coder``; Mistral Small 3.1/3.2 and Pixtral (``mistral3``, ``llava`` with
Pixtral): ``mistral``; Gemma 4 (``gemma4``): ``gemma4`` (Gemma 3's template teaches none); Llama 3.2 Vision
(``mllama``) and Llama 4 (``llama4``): ``llama3_json``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from .readers import Reader, read_gemma4, read_hermes, read_llama3_json, read_mistral, read_qwen3_coder

__all__ = ["ToolFormat", "FORMATS", "format_of", "format_named"]


@dataclass(frozen=True)
class ToolFormat:
    """One format: its ``name``, the strings its templates hold (``signature``, all of them), what opens the calls in
    an answer (``opens``; ``leading``: only at the answer's start, after spaces), the ``reader`` of its calls, and the
    length of the call ids its templates take (``id_length``; None: any, OpenAI's shape)."""

    name: str
    signature: tuple[str, ...]
    opens: tuple[str, ...]
    reader: Reader
    leading: bool = False
    id_length: int | None = None


#: Every format refsight reads, in the order :func:`format_of` tries them.
FORMATS: tuple[ToolFormat, ...] = (
    ToolFormat("qwen3_coder", ("<tool_call>", "<function=", "<parameter="), ("<tool_call>",), read_qwen3_coder),
    ToolFormat("hermes", ("<tool_call>",), ("<tool_call>",), read_hermes),
    # Mistral's templates refuse history call ids of other lengths than 9 (as mistral_common does).
    ToolFormat("mistral", ("[TOOL_CALLS]",), ("[TOOL_CALLS]",), read_mistral, id_length=9),
    ToolFormat("gemma4", ("<|tool_call>",), ("<|tool_call>",), read_gemma4),
    ToolFormat("llama3_json", ('"parameters": ',), ("<|python_tag|>", "{"), read_llama3_json, leading=True),
)

_READS_TOOLS = re.compile(r"(?<![\w.'\"])tools(?![\w'\"])")


@lru_cache(maxsize=16)
def _format_of(template: str) -> ToolFormat | None:
    if not _READS_TOOLS.search(template):
        return None
    return next((f for f in FORMATS if all(s in template for s in f.signature)), None)


def format_of(template: Any) -> ToolFormat | None:
    """The format ``template`` (a chat template's Jinja source) teaches its model, or None: it reads no ``tools``,
    or teaches a format refsight does not read (its answers are then text)."""
    return _format_of(template) if isinstance(template, str) else None


def format_named(name: str) -> ToolFormat:
    """The format called ``name`` (KeyError for another)."""
    return {f.name: f for f in FORMATS}[name]
