"""Bounds on a caller's GBNF grammar (llama.cpp's grammar language), checked before any runtime parses it.

A grammar is code the runtime compiles: its parser copies the symbols of an element once per
repetition (``x{m,n}`` becomes ``n`` copies of ``x``), so a short text can ask for a huge rule
set (``"abc"{1000000}``). :func:`check_gbnf` refuses what would cost more than a small, fixed
budget, by name, with the reason: a text over :data:`MAX_GBNF_CHARS`, a repetition count over
:data:`MAX_REPEAT`, or repetitions whose copies, counted at most the grammar's own length each,
exceed :data:`MAX_EXPANSION`. The grammar's syntax is the runtime's to judge (llama.cpp's parser,
before decoding). This module imports nothing heavy: :class:`~refsight.sampling.Sampling`
calls it.
"""

from __future__ import annotations

import re

from ..errors import InvalidInputError
from .text import check_text

__all__ = ["check_gbnf", "MAX_GBNF_CHARS", "MAX_REPEAT", "MAX_EXPANSION"]

#: The longest grammar text taken (llama-server's JSON-schema grammars of real schemas stay far below).
MAX_GBNF_CHARS = 64 * 1024
#: The largest count a ``{m}``, ``{m,}`` or ``{m,n}`` repetition may name.
MAX_REPEAT = 4096
#: The most symbols the repetitions may copy, each copy counted at the grammar's length (an upper bound).
MAX_EXPANSION = 1 << 22

# A repetition outside quotes and character classes: {m}, {m,}, {,n} or {m,n}.
_REPEAT = re.compile(r"\{\s*(\d*)\s*(,?)\s*(\d*)\s*\}")
# Quoted literals and character classes, whose braces are characters, not repetitions (escapes kept inside).
_LITERAL = re.compile(r'"(?:[^"\\]|\\.)*"|\[(?:[^\]\\]|\\.)*\]', re.DOTALL)
_COMMENT = re.compile(r"#[^\n]*")


def check_gbnf(grammar: object, name: str = "grammar") -> str:
    """``grammar`` when it is a non-empty text within the bounds; else :class:`InvalidInputError` naming ``name``."""
    if not isinstance(grammar, str) or not grammar.strip():
        raise InvalidInputError(name, "give a GBNF grammar as a non-empty string")
    if len(grammar) > MAX_GBNF_CHARS:
        raise InvalidInputError(name, f"is {len(grammar)} characters; at most {MAX_GBNF_CHARS} are taken")
    check_text(grammar, name)  # valid text: the runtime takes UTF-8
    if "\x00" in grammar:  # a C string would end there: the runtime would parse another grammar
        raise InvalidInputError(name, "may not contain a NUL character")
    if "root" not in grammar:
        raise InvalidInputError(name, "has no 'root' rule (generation starts from root ::= ...)")
    copies = _repetition_copies(_COMMENT.sub("", _LITERAL.sub('""', grammar)), name)
    if copies * len(grammar) > MAX_EXPANSION:
        raise InvalidInputError(
            name, f"its repetitions ({copies} copies in a grammar of {len(grammar)} characters) could expand past "
            f"{MAX_EXPANSION} symbols; use fewer or smaller repetition counts",
        )
    return grammar


def _repetition_copies(code: str, name: str) -> int:
    """The copies the repetitions of ``code`` (a grammar without literals or comments) make at most, each
    repetition checked: counts up to :data:`MAX_REPEAT`, the minimum not above the maximum."""
    copies = 0
    for match in _REPEAT.finditer(code):
        low, comma, high = match.groups()
        counts = [int(n) for n in (low, high) if n]
        if any(n > MAX_REPEAT for n in counts):
            raise InvalidInputError(name, f"repetition {match.group(0)}: counts above {MAX_REPEAT} are not taken")
        if comma and low and high and int(low) > int(high):
            raise InvalidInputError(name, f"repetition {match.group(0)}: the minimum is above the maximum")
        copies += max(counts, default=0)
    return copies
