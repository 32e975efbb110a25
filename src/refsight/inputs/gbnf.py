"""A caller's GBNF grammar (llama.cpp's grammar language), read completely before any runtime sees it.

llama.cpp compiles a grammar with a recursive parser and runs it as a pushdown automaton; some
grammars it takes crash or hang the process instead of failing: deep nesting overflows its stack,
a character no token can write, a rule that reaches itself before any character or a token
reference right after a character abort it while sampling, a branching rule set makes its
left-recursion check exponential. So :func:`check_gbnf` parses the text as llama.cpp does
(:mod:`.gbnf_syntax`: what llama.cpp's parser refuses, every character no model can write, nesting
past :data:`MAX_NESTING`) and checks the rules llama.cpp builds (:mod:`.gbnf_rules`: undefined
rules, no ``root``, left recursion, rules that can never end, llama.cpp's work, token references
where its sampler fails), within the caller's bounds on size: at most :data:`MAX_GBNF_CHARS`
characters, counts up to :data:`MAX_REPEAT`, repetitions whose copies, counted at the grammar's
length each, stay within :data:`MAX_EXPANSION`, and at most :data:`MAX_ELEMENTS` elements as
llama.cpp stores them (nested repetitions multiply). Each refusal is an
:class:`~refsight.errors.InvalidInputError` naming the grammar and the reason.

Token references (``<[id]>``, ``<text>``) are the vocabulary's to judge: :func:`read_gbnf` gives the
rules and the references to the runtime's own check. This module imports nothing heavy:
:class:`~refsight.sampling.Sampling` calls it.
"""

from __future__ import annotations

from functools import lru_cache

from ..errors import InvalidInputError
from .gbnf_rules import MAX_BRANCHES, MAX_LEFT_CALLS, MAX_LEFT_DEPTH, MAX_TOKEN_REFERENCES, check_rules
from .gbnf_syntax import MAX_NESTING, MAX_REPEAT, GbnfRules, TokenReference, parse_gbnf
from .text import check_text

__all__ = ["check_gbnf", "read_gbnf", "GbnfRules", "TokenReference", "MAX_GBNF_CHARS", "MAX_REPEAT", "MAX_EXPANSION",
           "MAX_ELEMENTS", "MAX_NESTING", "MAX_LEFT_DEPTH", "MAX_LEFT_CALLS", "MAX_BRANCHES", "MAX_TOKEN_REFERENCES"]

#: The longest grammar text taken (llama-server's JSON-schema grammars of real schemas stay far below).
MAX_GBNF_CHARS = 64 * 1024
#: The most symbols the repetitions may copy, each copy counted at the grammar's length (an upper bound).
MAX_EXPANSION = 1 << 22
#: The most elements llama.cpp may store for a grammar (8 bytes each: 32 MiB), nested repetitions multiplied.
MAX_ELEMENTS = 1 << 22


def check_gbnf(grammar: object, name: str = "grammar") -> str:
    """``grammar`` when llama.cpp can parse and run it within the bounds; else :class:`InvalidInputError`
    naming ``name`` with the reason (and, for syntax, the line and column)."""
    if not isinstance(grammar, str) or not grammar.strip():
        raise InvalidInputError(name, "give a GBNF grammar as a non-empty string")
    if len(grammar) > MAX_GBNF_CHARS:
        raise InvalidInputError(name, f"is {len(grammar)} characters; at most {MAX_GBNF_CHARS} are taken")
    read_gbnf(grammar, name, bounded=True)
    return grammar


@lru_cache(maxsize=4)  # Sampling checks a grammar, then the runtime reads it: one parse (a few MiB at most each)
def read_gbnf(grammar: str, name: str = "grammar", *, bounded: bool = True) -> GbnfRules:
    """The rules llama.cpp builds of ``grammar``, after every check of :func:`check_gbnf` (``bounded=False``:
    all but the caller's bounds on size, for a grammar refsight wrote from a checked JSON schema); its token
    references carry the characters that may come right before each."""
    check_text(grammar, name)  # valid text: the runtime takes UTF-8
    if "\x00" in grammar:  # a C string would end there: the runtime would parse another grammar
        raise InvalidInputError(name, "may not contain a NUL character")
    copies = 0

    def expansion(count: int) -> None:
        nonlocal copies
        copies += count
        if bounded and copies * len(grammar) > MAX_EXPANSION:
            raise InvalidInputError(
                name, f"its repetitions ({copies} copies in a grammar of {len(grammar)} characters) could expand "
                f"past {MAX_EXPANSION} symbols; use fewer or smaller repetition counts",
            )

    return check_rules(parse_gbnf(grammar, name, max_elements=MAX_ELEMENTS, on_copies=expansion), name)
