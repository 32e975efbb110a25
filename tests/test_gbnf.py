"""A caller's GBNF grammar, read as llama.cpp reads it (refsight.inputs.gbnf): what passes, and every refusal.

Each refusal here is a grammar llama.cpp refuses, or one it takes and then crashes or hangs on (issue
60: 20,000 nested parentheses were a segmentation fault, ``"\\x00"`` and ``<[100000000]>`` aborts); the
real llama.cpp's side of it is tests/backends/llamacpp/test_gbnf_differential.py and the running server's
tests/server/test_grammar_bounds.py. :class:`GrammarStacks` (the stacks the sampler follows beside
llama.cpp's) needs no runtime: it is tested here on rules alone.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from refsight import InvalidInputError, Sampling
from refsight.backends.llamacpp.grammar_stacks import CheckedGrammar, GrammarStacks
from refsight.inputs.gbnf import (
    MAX_BRANCHES,
    MAX_ELEMENTS,
    MAX_LEFT_CALLS,
    MAX_LEFT_DEPTH,
    MAX_NESTING,
    MAX_REPEAT,
    MAX_TOKEN_REFERENCES,
    check_gbnf,
    read_gbnf,
)

GRAMMARS = Path(__file__).parent / "data" / "llama_cpp_grammars"

SOUND = [
    'root ::= ("yes" | "no") " " [a-z]{1,3}',
    'root ::= "\\x41\\u00e9\\U0001F600\\t\\n\\r\\\\\\"\\[\\]\\-" [^\\x00-\\x1F\\x7F] [\\x01-\\U0010FFFF] . [a-] [-a]',
    "# a comment\r\nroot ::= item+ # trailing\r\nitem ::= [0-9]{2} | [a-z]{0,} | \"x\"{ 1 , 3 } | \"y\"?\n",
    'root ::= (\n  "a" |\n  "b"\n)*  "." ',
    'root ::= x\nx ::= "(" x ")" | "a"',  # recursion after a character: runs
    'root ::= ("a"?)* "b"',  # a cycle through a rule matching "" that keeps the stack's size: llama.cpp runs it
    'root ::= "" | "a" root',
    'root ::= <[5]> !<[5]>* <think> t </think> .*\nt ::= !<[7]>*',  # llama.cpp's README example, as written there
    'root ::= "Reasoning: " <[9]> [a-z]+',  # a token after characters: the runtime holds its text against them
    'root ::= ' + "(" * MAX_NESTING + '"a"' + ")" * MAX_NESTING,
    'root ::= "a"{' + str(MAX_REPEAT) + "}",
    'root ::= "{99999}" [{}]{2} "<[5]>"',  # braces and token syntax inside literals are characters
]


@pytest.mark.parametrize("grammar", SOUND)
def test_a_sound_grammar_passes(grammar):
    assert check_gbnf(grammar) == grammar
    assert Sampling(grammar=grammar).grammar == grammar


def test_llama_cpps_own_grammars_pass():
    files = sorted(GRAMMARS.glob("*.gbnf"))
    assert len(files) == 8, files
    for path in files:
        assert check_gbnf(path.read_text()), path


def _refused(grammar: str, *words: str) -> str:
    with pytest.raises(InvalidInputError) as e:
        Sampling(grammar=grammar)
    assert e.value.input == "grammar", e.value
    for word in words:
        assert word in e.value.reason, (grammar[:80], e.value.reason)
    return e.value.reason


REFUSED = [
    # llama.cpp's syntax, with the place
    ('root ::= ("a"', "expecting ')'", "line 1, column 14"), ('root ::= "a', "not closed"),
    ("root ::= [ab", "not closed"), ('root ::= "a"\n | "b"', "line 2, column 2", "rule name"),
    ('root = "a"', "expecting ::="), ('root ::= "a" )', "newline or the end"), ('root ::= "\\q"', "unknown escape"),
    ('root ::= "\\x4"', "2 hex digits"), ('root ::= "\\u00e"', "4 hex digits"), ('root ::= "\\U0000000"', "8 hex"),
    ('root ::= *"a"', "repeats nothing"), ('root ::= ""*', "repeats nothing"), ('root ::= "a"{0}?', "repeats nothing"),
    ('root ::= "a"{,5}', "expecting a count"), ('root ::= "a"{5', "expecting ',' or '}'"),
    ("root ::= <[12]", "']>'"), ("root ::= <[x]>", "token id"), ("root ::= !x", "expecting '<'"),
    ("root ::= <think", "not closed"), ("root ::= <[4294967296]>", "above 4294967295"),
    # characters no model writes, and classes that match none
    ('root ::= "\\x00"', "code point 0"), ('root ::= "a\\u0000"', "code point 0"),
    ('root ::= "\\U00000000"', "code point 0"), ("root ::= [\\x00]", "matches no character"),
    ("root ::= [\\u0000-\\u0000]", "matches no character"), ("root ::= [^\\x01-\\U0010FFFF]", "matches no character"),
    ("root ::= [^\\x01-\\uD7FF\\uE000-\\U0010FFFF]", "matches no character"),
    ('root ::= "\\U00110000"', "above U+10FFFF"), ('root ::= "\\uD800"', "surrogate"), ("root ::= [\\uDFFF]", "surrogate"),
    ("root ::= [z-a]", "runs backwards"),
    # counts
    (f'root ::= "a"{{{MAX_REPEAT + 1}}}', "counts above"), (f'root ::= "a"{{0,{MAX_REPEAT + 1}}}', "counts above"),
    ('root ::= "a"{99999999999999999999999}', "counts above"), ('root ::= "a"{5,2}', "minimum is above"),
    ('root ::= ("a"){40}{60}', "2400 copies"),
    # the rules
    ("root ::= item", "'item'", "never defined", "line 1, column 10"), ('item ::= "a"', "no 'root'"),
    ('root ::= root "a" | "b"', "'root'", "left-recursive"), ('root ::= x\nx ::= y | "a"\ny ::= x', "left-recursive"),
    ('root ::= a root "x" | "y"\na ::= b\nb ::= ""', "'root'", "left-recursive"),  # hidden: bad_alloc in llama.cpp
    ('root ::= "a"?* "b"', "left-recursive"), ('root ::= ("")* "b"', "left-recursive"),
    ('root ::= "a" x\nx ::= "b" x', "'root', 'x'", "never end"),
    ('root ::= "a" !<[5]>', "!<...>", "follow a character"), ('root ::= x !<[5]>\nx ::= [a-z]', "follow a character"),
    ('root ::= ("a" | <[3]>)+ !<[5]>', "follow a character"),
]


@pytest.mark.parametrize(("grammar", "words"), [(case[0], case[1:]) for case in REFUSED])
def test_a_grammar_llama_cpp_refuses_or_cannot_run_is_refused_by_name(grammar, words):
    _refused(grammar, *words)


def test_nesting_is_bounded_whatever_the_bracket_and_the_issues_20000_levels_are_refused():
    _refused("root ::= " + "(" * (MAX_NESTING + 1) + '"a"' + ")" * (MAX_NESTING + 1), f"deeper than {MAX_NESTING}")
    _refused("root ::= " + "(" * 20000 + '"a"' + ")" * 20000, "nest deeper")
    _refused("root ::= " + '("a" | ' * 2000 + '"b"' + ")*" * 2000, "nest deeper")
    assert check_gbnf("root ::= " + "[(]" * 5000)  # a class's bracket nests nothing


def test_llama_cpps_work_is_bounded():
    depth = "root ::= a{0,2000}\na ::= \"\" | b{0,2000}\nb ::= \"\" | c{0,200}\nc ::= \"\" | \"x\""
    _refused(depth, f"more than {MAX_LEFT_DEPTH} rules")
    branching = "root ::= a0\n" + "".join(f"a{i} ::= a{i + 1} | a{i + 1}\n" for i in range(22)) + 'a22 ::= "x"'
    _refused(branching, f"more than {MAX_LEFT_CALLS} paths")
    _refused("root ::= " + "x?" * (MAX_BRANCHES // 2) + '\nx ::= "a"', f"more than {MAX_BRANCHES} alternatives")
    _refused("root ::= " + "<[5]>" * (MAX_TOKEN_REFERENCES + 1), f"at most {MAX_TOKEN_REFERENCES}")
    _refused('root ::= "' + "a" * 1000 + '"{40}{50} x\nx ::= "' + "b" * 1000 + '"{40}{50} y\ny ::= "'
             + "c" * 1000 + '"{40}{50}', f"more than {MAX_ELEMENTS} grammar elements")
    _refused('root ::= "' + "a" * 3000 + '"{1500}', "could expand")  # the caller's bound on copies, as before


def test_the_caller_bounds_do_not_apply_to_a_grammar_refsight_wrote():
    long = "root ::= " + " ".join(f'"{i:05}"' for i in range(11000))
    _refused(long, "characters")
    assert read_gbnf(long, "json_schema", bounded=False).tokens == []


def test_token_references_carry_what_may_come_right_before_them():
    tokens = read_gbnf('root ::= "x" <[9]> a <think> !<[3]>*\na ::= [a-c] | .').tokens
    assert [(t.id, t.text, t.negated) for t in tokens] == [(9, None, False), (None, "<think>", False), (3, None, True)]
    assert tokens[0].after == ((False, ((120, 120),)),)  # the literal's last character
    assert set(tokens[1].after) == {(False, ((97, 99),)), (True, ())}  # through the end of rule a
    assert tokens[2].after == ()  # only tokens before it


def _stacks(grammar: str, token_ids: tuple[int, ...] = (), max_stacks: int = 1 << 14) -> GrammarStacks:
    return GrammarStacks(CheckedGrammar(grammar, read_gbnf(grammar), token_ids), max_stacks)


def test_the_stacks_follow_llama_cpp_through_literals_classes_tokens_and_split_characters():
    stacks = _stacks('root ::= "ab" [0-9]+ <[7]> ("é" | "x")', (7,))
    for piece in (b"a", b"b1", b"23"):
        stacks.accept(1, piece, False)
    assert not stacks.complete
    stacks.accept(7, b"<think>", False)  # the reference takes the whole token, by its id
    stacks.accept(2, b"\xc3", False)  # half of "é": kept as llama.cpp keeps it
    stacks.accept(3, b"\xa9", False)
    assert stacks.complete
    stacks.accept(0, b"", True)  # the end of generation, the grammar complete


def test_the_stacks_refuse_what_would_abort_llama_cpp():
    with pytest.raises(InvalidInputError, match="cannot go on"):
        _stacks('root ::= "ab"').accept(1, b"ac", False)
    # A token through the characters before a reference: llama.cpp's sampler offers it, its grammar cannot take it.
    crossing = _stacks("root ::= . <[9]>", (9,))
    with pytest.raises(InvalidInputError, match="cannot go on"):
        crossing.accept(9, b"<|vision_start|>", False)
    with pytest.raises(InvalidInputError, match="before the grammar is complete"):
        _stacks('root ::= "a"').accept(0, b"", True)


def test_a_grammar_whose_stacks_multiply_is_stopped():
    stacks = _stacks('root ::= x\nx ::= "a" x "b" | "a" x "c" | "a"', max_stacks=64)
    with pytest.raises(InvalidInputError, match="too ambiguous") as e:
        for _ in range(10):  # each "a" doubles the ways to parse it (a "b" or a "c" owed at every level)
            stacks.accept(1, b"a", False)
    assert e.value.input == "grammar"
