"""How large a grammar a schema's regular expression becomes, bounded before any compiler sees it.

Every grammar compiler writes a counted repeat out: llama.cpp's converter writes ``a{1000}``
as a thousand copies of ``a`` (``^a{100000000}$`` took 26 s and 2 GB), and the regex
engines of llguidance and xgrammar unroll it into automaton states. So
:func:`pattern_size` reads a ``pattern`` (or a ``patternProperties`` key) and returns the
number of atoms it expands to: each character, class or ``.`` counts one, a repeat
multiplies what it repeats by its largest count (an open repeat ``{m,}``, ``*`` or ``+``
by its least count plus one: the compilers write it as ``m`` copies and a loop), and
alternatives add up. It refuses, as :class:`~refsight.errors.InvalidInputError` naming the
place, a count above ``max_repeat`` and an expansion above ``max_size``.

Python's own parser (:mod:`re._parser`) gives the structure. The compilers do not all read
a pattern as Python does, though: llama.cpp's converter takes ``a{ 5 }``, ``a{1_000}`` and
``a{١٠}`` as counts where Python sees literal text, and reads ``[]`` as an empty class
where Python reads ``]`` as its first member. So the text is scanned too: a brace that any
of them could read as a count must be written as Python reads one (``{m}``, ``{m,}``,
``{m,n}``, digits 0-9), every such count is bounded wherever it stands (inside a class
too), and all of them together may not exceed ``max_size``.
"""

from __future__ import annotations

import re
from re import _constants as sre
from re import _parser
from typing import Any

from ..errors import InvalidInputError

__all__ = ["pattern_size"]

_REPEATS = (sre.MAX_REPEAT, sre.MIN_REPEAT, sre.POSSESSIVE_REPEAT)
# Python's own form of a counted repeat; anything else a compiler might take as one is refused.
_CANONICAL = re.compile(r"[0-9]*(?:,[0-9]*)?")
# Characters a lenient reader (llama.cpp's converter: int() after strip) takes inside a count.
_COUNTISH = re.compile(r"[\d\s_,]*\d[\d\s_,]*")


class _TooLarge(Exception):
    """The expansion passed the bound (caught once, at the top, and reported with the place)."""


def pattern_size(pattern: Any, where: str, *, max_repeat: int, max_size: int) -> int:
    """Atoms ``pattern`` expands to (see the module doc), at least its length; :class:`InvalidInputError` on
    ``where`` when it is longer than ``max_size``, is not a regular expression, repeats more than
    ``max_repeat`` times or expands past ``max_size``."""
    if not isinstance(pattern, str):
        raise InvalidInputError(where, "must be a regular expression (a string)")
    if len(pattern) > max_size:  # parsing and compiling cost time by the character: bounded first
        raise InvalidInputError(where, f"is {len(pattern)} characters; a pattern may be at most {max_size}")
    _check_braces(pattern, where, max_repeat, max_size)
    try:
        tree = _parser.parse(pattern)  # the syntax; what only a compiler refuses (look-behinds ...) is its to say
    except (re.error, RecursionError, OverflowError) as e:
        raise InvalidInputError(where, f"is not a regular expression: {e}") from None
    try:
        return max(_size(tree, max_repeat, max_size), len(pattern))
    except _TooLarge:
        raise InvalidInputError(
            where, f"expands to more than {max_size} characters (the counts of nested repeats multiply)"
        ) from None


def _check_braces(pattern: str, where: str, max_repeat: int, max_size: int) -> None:
    """Every ``{...}`` some compiler reads as a count: in Python's form, each count and their sum bounded."""
    total = 0
    for start, content in _braces(pattern):
        if not _COUNTISH.fullmatch(content):
            continue  # {name}, {}, {,}: no count for any reader
        if not _CANONICAL.fullmatch(content):
            raise InvalidInputError(where, f"{{{content}}} at character {start}: write a repeat count as {{m}}, "
                                           "{m,} or {m,n} with the digits 0-9, and a literal brace as \\{")
        counts = [int(n) for n in content.split(",") if n]
        if max(counts) > max_repeat:
            raise InvalidInputError(where, f"repeats {max(counts)} times; a count may be at most {max_repeat} "
                                           "(as maxLength)")
        total += max(counts)
        if total > max_size:
            raise InvalidInputError(where, f"its repeat counts add up to more than {max_size}")


def _braces(pattern: str):
    """(index, text inside) of every ``{`` not escaped by a backslash, up to the next ``}``."""
    escaped = False
    for i, char in enumerate(pattern):
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == "{":
            end = pattern.find("}", i + 1)
            if end != -1:
                yield i, pattern[i + 1:end]


def _size(items: Any, max_repeat: int, max_size: int) -> int:
    """Atoms of a parsed (sub)pattern; raises :class:`_TooLarge` as soon as the bound is passed."""
    total = 0
    for op, av in items:
        total += _item_size(op, av, max_repeat, max_size)
        if total > max_size:
            raise _TooLarge
    return total


def _item_size(op: Any, av: Any, max_repeat: int, max_size: int) -> int:
    if op in _REPEATS:
        low, high, sub = av
        # The text scan bounded every count Python reads; an open repeat is written as low copies and a loop.
        copies = low + 1 if high == sre.MAXREPEAT else high
        return max(copies, 1) * _size(sub, max_repeat, max_size)
    if op is sre.SUBPATTERN:
        return _size(av[-1], max_repeat, max_size)
    if op is sre.ATOMIC_GROUP:
        return _size(av, max_repeat, max_size)
    if op in (sre.ASSERT, sre.ASSERT_NOT):
        return _size(av[1], max_repeat, max_size)
    if op is sre.BRANCH:
        return sum(_size(branch, max_repeat, max_size) for branch in av[1])
    if op is sre.GROUPREF_EXISTS:
        return sum(_size(branch, max_repeat, max_size) for branch in av[1:] if branch is not None)
    return 1  # a character, a class, ".", an anchor, a back-reference
