"""llama.cpp's GBNF parser, read in Python: the rules a grammar text makes, or the place it goes wrong.

:func:`parse_gbnf` follows ``llama_grammar_parser`` (``src/llama-grammar.cpp``, as llama-cpp-python
vendors it) step by step, so a text it takes is one llama.cpp parses into the same rules, with the
same ids: ``name ::= alternatives`` up to a newline (one outside parentheses and not after ``|``),
literals and classes with llama.cpp's escapes (``\\x``, ``\\u``, ``\\U`` with 2, 4, 8 hex digits,
``\\t \\n \\r \\\\ \\" \\[ \\] \\-``), ``.``, references, groups, ``* + ? {m} {m,} {m,n}`` written out as
llama.cpp writes them (``S{m,n}``: ``m`` copies of ``S``, then a chain of ``n - m`` optional rules),
``#`` comments, and token references ``<[id]>``, ``<text>``, ``!<...>``. A rule is kept as its
alternatives, tuples of items: rule ids, and terminals (``< 0``) described in
:attr:`GbnfRules.terminals` by what :mod:`.gbnf_rules` analyses. Refused, as
:class:`~refsight.errors.InvalidInputError` naming the grammar, the line and the column: what llama.cpp
refuses, nesting past :data:`MAX_NESTING`, a character that is no Unicode scalar value, a NUL to
match, a class no character matches, a count above :data:`MAX_REPEAT` or a minimum above its maximum,
and more elements than ``max_elements``.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from ..errors import InvalidInputError

__all__ = ["MAX_NESTING", "MAX_REPEAT", "CharSet", "GbnfRules", "TokenReference", "matches", "parse_gbnf"]

#: Characters an element matches: ``(negated, ((low, high), ...))``; ``.`` is ``(True, ())``.
CharSet = tuple[bool, tuple[tuple[int, int], ...]]
#: The deepest nesting of parentheses taken. llama.cpp parses a group by recursion (parse_sequence ->
#: parse_alternates -> parse_sequence), 448 bytes of stack per level, measured on llama-cpp-python 0.3.36
#: (x86-64): an 8 MiB thread stack overflows near 18,700 levels, 1 MiB near 2,340, 256 KiB near 590 (20,000
#: was a segmentation fault). 1024 levels take 448 KiB: a margin of 18 on a thread's default 8 MiB. Written
#: grammars nest a few levels; llama-cpp-python's JSON-schema converter writes ``maxLength: n`` as n nested
#: optional groups (at most 1000: ``MAX_SCHEMA_COUNT``).
MAX_NESTING = 1024
#: The largest count a ``{m}``, ``{m,}`` or ``{m,n}`` may name: llama.cpp's MAX_REPETITION_THRESHOLD.
#: It refuses a larger minimum and reads a larger maximum as none (``{0,3000}`` would become ``*``).
MAX_REPEAT = 2000

_SPACE = re.compile(r"(?:[ \t]+|#[^\r\n\0]*)*")  # llama.cpp's parse_space without newlines
_SPACE_NL = re.compile(r"(?:[ \t\r\n]+|#[^\r\n\0]*)*")  # ... and with them
_NAME = re.compile(r"[a-zA-Z0-9-]+")
_DIGITS = re.compile(r"[0-9]+")
_PLAIN = re.compile(r'[^"\\\0]+')  # literal characters without an escape
_HEX = re.compile(r"[0-9a-fA-F]*")
_ESCAPES = {"t": 9, "r": 13, "n": 10, "\\": 92, '"': 34, "[": 91, "]": 93, "-": 45}
_HEX_DIGITS = {"x": 2, "u": 4, "U": 8}
_WRITABLE = ((1, 0xD7FF), (0xE000, 0x10FFFF))  # scalar values but NUL (llama.cpp ends a token's text there)
# An unsigned 32-bit id (llama.cpp's limit on <[id]>) has at most 10 digits; a count above MAX_REPEAT, 5.
_TOKEN_DIGITS, _COUNT_DIGITS = 10, 5


@dataclass(frozen=True)
class TokenReference:
    """A token reference: ``<[id]>`` (``text`` None) or ``<text>`` (``text`` with its brackets, as llama.cpp
    tokenizes it); ``negated`` for ``!<...>``; ``at`` where it stands (``line L, column C``); ``after``: the
    characters an element right before it may match (filled in by :mod:`refsight.inputs.gbnf`)."""

    id: int | None
    text: str | None
    negated: bool
    at: str
    after: tuple[CharSet, ...] = ()


def matches(chars: CharSet, code_point: int) -> bool:
    """Whether an element matching ``chars`` matches ``code_point``."""
    negated, ranges = chars
    return any(low <= code_point <= high for low, high in ranges) != negated


@dataclass
class GbnfRules:
    """What llama.cpp's parser builds of a grammar: each rule id's alternatives (tuples of items: rule ids, and
    terminals ``-1 - k`` described by ``terminals[k]``: a token reference's index in ``tokens``, a literal's
    text, or the :data:`CharSet` a class or ``.`` matches), the names it knows (``names``: every user name and generated
    symbol, by id), the user rule each id belongs to (``owner``), where each name was first used
    (``used_at``), the token references and how many elements llama.cpp stores (``elements``)."""

    rules: dict[int, tuple[tuple[int, ...], ...]] = field(default_factory=dict)
    terminals: list[int | str | CharSet] = field(default_factory=list)
    names: dict[str, int] = field(default_factory=dict)
    owner: dict[int, str] = field(default_factory=dict)
    used_at: dict[str, str] = field(default_factory=dict)
    tokens: list[TokenReference] = field(default_factory=list)
    elements: int = 0


@dataclass
class _Frame:
    """One rule or group being read: llama.cpp's parse_alternates/parse_sequence locals."""

    rule_id: int
    rule_name: str
    nested: bool
    opened_at: int = 0
    n_rules_before: int = 0
    items: list[int | None] = field(default_factory=list)  # the rule so far, alternatives split by _ALT
    weights: list[int] = field(default_factory=list)  # llama.cpp's elements per item
    last_sym_start: int = 0
    n_prev_rules: int = 1


_ALT = None  # between alternatives, within a _Frame's items


class _Parser:
    def __init__(self, text: str, name: str, max_elements: int, on_copies: Callable[[int], None]) -> None:
        self.s = text + "\0\0"  # llama.cpp reads a C string: its NUL ends every loop (a NUL within is refused before)
        self.text, self.name, self.max_elements, self.on_copies = text, name, max_elements, on_copies
        self.lines = [m.end() for m in re.finditer("\n", text)]  # where each line after the first starts
        self.out = GbnfRules()

    def at(self, i: int) -> str:
        """``line L, column C`` of offset ``i`` (both from 1)."""
        line = bisect.bisect_right(self.lines, i)
        return f"line {line + 1}, column {i - (self.lines[line - 1] if line else 0) + 1}"

    def fail(self, i: int, reason: str) -> InvalidInputError:
        """The refusal of the grammar at offset ``i``."""
        return InvalidInputError(self.name, f"{self.at(i)}: {reason}")

    def symbol(self, name: str, i: int) -> int:
        """get_symbol_id: a name's id, the next one when it is new."""
        if name not in self.out.names:
            self.out.names[name] = len(self.out.names)
            self.out.used_at[name] = self.at(i)
        return self.out.names[name]

    def generated(self, rule_name: str) -> int:
        """generate_symbol_id: a fresh id for a group or repetition rule of ``rule_name``."""
        new_id = len(self.out.names)
        self.out.names[f"{rule_name}_{new_id}"] = new_id  # '_' is no name character: never a user's name
        self.out.owner[new_id] = rule_name
        return new_id

    def add_rule(self, rule_id: int, alternatives: tuple[tuple[int, ...], ...], i: int) -> None:
        """add_rule: the rule's alternatives (tuples: the collector need not track them), its END counted here
        (the rest as it was made)."""
        self.out.rules[rule_id] = alternatives
        self.count(1, i)

    def count(self, elements: int, i: int) -> None:
        """``elements`` more llama.cpp elements (every one made counts, kept or not); refused past the bound."""
        self.out.elements += elements
        if self.out.elements > self.max_elements:
            raise self.fail(i, f"makes more than {self.max_elements} grammar elements (repetitions write their item "
                               "out once per count); use fewer or smaller repetition counts")

    def space(self, i: int, newline_ok: bool) -> int:
        return (_SPACE_NL if newline_ok else _SPACE).match(self.s, i).end()

    def parse(self) -> GbnfRules:
        i = self.space(0, True)
        while self.s[i] != "\0":
            i = self.rule(i)
        return self.out

    def rule(self, i: int) -> int:
        """parse_rule: ``name ::= alternatives`` and the line's end."""
        match = _NAME.match(self.s, i)
        if match is None:
            raise self.fail(i, "expecting a rule name")
        name = match.group()
        rule_id = self.symbol(name, i)
        self.out.owner.setdefault(rule_id, name)
        i = self.space(match.end(), False)
        if not self.s.startswith("::=", i):
            raise self.fail(i, f"expecting ::= after the rule name {name!r}")
        i = self.alternatives(self.space(i + 3, True), _Frame(rule_id, name, nested=False))
        if self.s[i] == "\r":
            i += 2 if self.s[i + 1] == "\n" else 1
        elif self.s[i] == "\n":
            i += 1
        elif self.s[i] != "\0":
            raise self.fail(i, f"expecting a newline or the end, found {self.s[i]!r}")
        return self.space(i, True)

    def alternatives(self, i: int, top: _Frame) -> int:
        """parse_alternates with its groups read in a loop, not by recursion (their depth is bounded here)."""
        frames = [top]
        while True:
            frame = frames[-1]
            i, opened = self.sequence(i, frame)
            if opened is not None:
                if len(frames) > MAX_NESTING:
                    raise self.fail(opened, f"parentheses nest deeper than {MAX_NESTING} levels")
                before = len(self.out.names)
                frames.append(_Frame(self.generated(frame.rule_name), frame.rule_name, True, opened, before))
                i = self.space(i, True)
                continue
            if self.s[i] == "|":
                self.push(frame, _ALT, 1, i)
                frame.last_sym_start = len(frame.items)
                i = self.space(i + 1, True)
                continue
            self.add_rule(frame.rule_id, _split(frame.items), i)
            frames.pop()
            if not frames:
                return i
            parent = frames[-1]
            self.push(parent, frame.rule_id, 1, i)
            parent.n_prev_rules = max(1, len(self.out.names) - frame.n_rules_before)
            if self.s[i] != ")":
                raise self.fail(i, f"expecting ')' to close the group opened at {self.at(frame.opened_at)}")
            i = self.space(i + 1, parent.nested)

    def push(self, frame: _Frame, item: int, weight: int, i: int) -> None:
        """A new symbol of ``weight`` elements at the sequence's end (what a repetition after it repeats)."""
        frame.last_sym_start, frame.n_prev_rules = len(frame.items), 1
        if weight:
            frame.items.append(item)
            frame.weights.append(weight)
            self.count(weight, i)

    def sequence(self, i: int, frame: _Frame) -> tuple[int, int | None]:
        """parse_sequence up to the first character it does not take; ``(i, None)``, or ``(i, where)`` at a
        ``(`` (the caller opens the group and goes on reading inside it)."""
        s = self.s
        while True:
            c = s[i]
            if c == '"':
                i, weight, last = self.literal(i + 1)
                self.push(frame, self.terminal(last), weight, i)
            elif c == "[":
                i, weight, chars = self.char_class(i + 1)
                self.push(frame, self.terminal(chars), weight, i)
            elif c in "<!":
                i = self.token(i)
                self.push(frame, self.terminal(len(self.out.tokens) - 1), 1, i)
            elif c == ".":
                i += 1
                self.push(frame, self.terminal((True, ())), 1, i)
            elif c == "(":
                return i + 1, i
            elif c in "*+?{":
                i = self.repetition(i, frame)
                continue
            else:
                match = _NAME.match(s, i)
                if match is None:
                    return i, None
                self.push(frame, self.symbol(match.group(), i), 1, i)
                i = match.end()
            i = self.space(i, frame.nested)

    def terminal(self, described: int | str | CharSet) -> int:
        """A new terminal item (``-1 - k``) described by ``described``."""
        self.out.terminals.append(described)
        return -len(self.out.terminals)

    def literal(self, i: int) -> tuple[int, int, str]:
        """A ``"..."`` literal (``i`` after the quote): the end, its element count and its characters."""
        chars, s = [], self.s
        while s[i] != '"':
            plain = _PLAIN.match(s, i)
            if plain is not None:  # characters of the text itself are scalar values (checked text, no NUL)
                chars.append(plain.group())
                i = plain.end()
                continue
            if s[i] == "\0":
                raise self.fail(i, "a literal is not closed (expecting '\"')")
            at = i
            cp, i = self.char(i)
            if cp == 0:
                raise self.fail(at, "a literal may not contain code point 0 (NUL): no model writes it")
            chars.append(chr(cp))
        text = "".join(chars)
        return i + 1, len(text), text

    def char_class(self, i: int) -> tuple[int, int, CharSet]:
        """A ``[...]`` class (``i`` after the bracket): the end, its element count and what it matches; refused
        when no character a model can write matches it, or a range runs backwards."""
        s, start, elements = self.s, i - 1, 0
        negated = s[i] == "^"
        i += negated
        ranges: list[tuple[int, int]] = []
        while s[i] != "]":
            if s[i] == "\0":
                raise self.fail(start, "a character class is not closed (expecting ']')")
            at = i
            low, i = self.char(i)
            high = low
            elements += 1
            if s[i] == "-" and s[i + 1] != "]":
                if s[i + 1] == "\0":
                    raise self.fail(start, "a character class is not closed (expecting ']')")
                high, i = self.char(i + 1)
                elements += 1
                if high < low:
                    raise self.fail(at, f"the range {s[at:i]} runs backwards (U+{low:04X} to U+{high:04X})")
            ranges.append((low, high))
        if ranges and not _matches_some(ranges, negated):
            raise self.fail(start, f"the class {s[start:i + 1]} matches no character a model can write")
        return i + 1, elements, (negated, tuple(ranges))

    def char(self, i: int) -> tuple[int, int]:
        """parse_char: one character or escape, as a code point; refused unless a Unicode scalar value."""
        s = self.s
        if s[i] != "\\":
            return ord(s[i]), i + 1
        kind = s[i + 1]
        if kind in _HEX_DIGITS:
            size = _HEX_DIGITS[kind]
            digits = _HEX.match(s, i + 2, i + 2 + size).group()
            if len(digits) != size:
                raise self.fail(i, f"the escape \\{kind} takes {size} hex digits")
            cp = int(digits, 16)
            if cp > 0x10FFFF or 0xD800 <= cp <= 0xDFFF:
                raise self.fail(i, f"{s[i:i + 2 + size]} is not a Unicode character "
                                   f"({'a surrogate' if cp <= 0x10FFFF else 'above U+10FFFF'})")
            return cp, i + 2 + size
        if kind in _ESCAPES:
            return _ESCAPES[kind], i + 2
        raise self.fail(i, f"unknown escape {s[i:i + 2]!r} (known: \\x \\u \\U \\t \\n \\r \\\\ \\\" \\[ \\] \\-)")

    def token(self, i: int) -> int:
        """parse_token: ``<[id]>``, ``<text>`` or either after ``!``; recorded for the vocabulary check."""
        s, start = self.s, i
        negated = s[i] == "!"
        i += negated
        if s[i] != "<":
            raise self.fail(i, "expecting '<' (a token reference: <[id]>, <text>, !<...>)")
        if s[i + 1] != "[":
            end = s.find(">", i)
            if end < 0:
                raise self.fail(i, "a token reference is not closed (expecting '>')")
            self.out.tokens.append(TokenReference(None, s[i:end + 1], negated, self.at(start)))
            return end + 1
        digits = _DIGITS.match(s, i + 2)
        if digits is None:
            raise self.fail(i + 2, "expecting a token id after '<['")
        if len(digits.group()) > _TOKEN_DIGITS or int(digits.group()) > 0xFFFFFFFF:
            raise self.fail(i + 2, "the token id is above 4294967295")
        end = digits.end()
        if s[end] != "]" or s[end + 1] != ">":
            raise self.fail(end, "expecting ']>' after the token id")
        self.out.tokens.append(TokenReference(int(digits.group()), None, negated, self.at(start)))
        return end + 2

    def repetition(self, i: int, frame: _Frame) -> int:
        """``*``, ``+``, ``?`` or ``{...}`` after a symbol: the bounds read, then llama.cpp's rewrite."""
        at, c = i, self.s[i]
        if c != "{":
            i = self.space(i + 1, frame.nested)
            self.rewrite(frame, *{"*": (0, None), "+": (1, None), "?": (0, 1)}[c], at)
            return i
        i, low, high = self.counts(self.space(i + 1, frame.nested), frame.nested, at)
        if max(low, high or 0) > MAX_REPEAT:
            raise self.fail(at, f"repetition {self.s[at:i].strip()}: counts above {MAX_REPEAT} are not taken")
        if high is not None and low > high:
            raise self.fail(at, f"repetition {self.s[at:i].strip()}: the minimum is above the maximum")
        self.on_copies(max(low, high or 0))
        self.rewrite(frame, low, high, at)
        return i

    def counts(self, i: int, nested: bool, at: int) -> tuple[int, int, int | None]:
        """The counts of ``{m}``, ``{m,}`` or ``{m,n}`` (``i`` after the brace): the end, ``m`` and ``n``."""
        low = _DIGITS.match(self.s, i)
        if low is None:
            raise self.fail(i, "expecting a count after '{'")
        i = self.space(low.end(), nested)
        high: int | None = _count(low.group())
        if self.s[i] == ",":
            i = self.space(i + 1, nested)
            high_match = _DIGITS.match(self.s, i)
            high = None
            if high_match is not None:
                high = _count(high_match.group())
                i = self.space(high_match.end(), nested)
        elif self.s[i] != "}":
            raise self.fail(i, "expecting ',' or '}' in a repetition")
        if self.s[i] != "}":
            raise self.fail(i, "expecting '}' to close the repetition")
        return self.space(i + 1, nested), _count(low.group()), high

    def rewrite(self, frame: _Frame, low: int, high: int | None, at: int) -> None:
        """handle_repetitions: ``S{low,high}`` becomes ``low`` copies of ``S`` then a chain of optional rules
        (``S'(k) ::= S S'(k-1) |``; without a maximum one rule ``S' ::= S S' |``)."""
        start = frame.last_sym_start
        if start == len(frame.items):
            raise self.fail(at, f"{self.s[at]!r} repeats nothing (expecting an item before it)")
        prev, prev_weights = frame.items[start:], frame.weights[start:]
        total = high if high else (low or 1)
        if frame.n_prev_rules * total > MAX_REPEAT:  # llama.cpp's own refusal, word for word in spirit
            raise self.fail(at, f"this repetition makes {frame.n_prev_rules * total} copies of rules; llama.cpp "
                                f"takes at most {MAX_REPEAT}")
        if low == 0:
            del frame.items[start:], frame.weights[start:]
        else:
            self.count(sum(prev_weights) * (low - 1), at)
            frame.items.extend(prev * (low - 1))
            frame.weights.extend(prev_weights * (low - 1))
        last = 0
        for k in range(1 if high is None else high - low):
            rule_id = self.generated(frame.rule_name)
            tail = (rule_id if high is None else last,) if (k > 0 or high is None) else ()
            self.count(sum(prev_weights) + len(tail) + 1, at)  # S, the reference, the ALT
            self.add_rule(rule_id, ((*prev, *tail), ()), at)
            last = rule_id
        n_prev_rules = frame.n_prev_rules
        if high is None or high > low:
            self.push(frame, last, 1, at)
            frame.last_sym_start = start
        frame.n_prev_rules = n_prev_rules * total


def _split(items: list[int | None]) -> tuple[tuple[int, ...], ...]:
    """A rule's items split at each ``_ALT`` into its alternatives."""
    if _ALT not in items:
        return (tuple(items),)
    alternatives, start = [], 0
    for k, item in enumerate(items):
        if item is _ALT:
            alternatives.append(tuple(items[start:k]))
            start = k + 1
    alternatives.append(tuple(items[start:]))
    return tuple(alternatives)


def _count(digits: str) -> int:
    """A repetition count; more digits than any count taken is read as one past the limit (int() of a
    huge digit string is slow, and Python refuses over 4300 digits)."""
    return int(digits) if len(digits) <= _COUNT_DIGITS else MAX_REPEAT + 1


def _matches_some(ranges: list[tuple[int, int]], negated: bool) -> bool:
    """Whether a class of these inclusive ranges matches a code point a model can write (:data:`_WRITABLE`)."""
    if not negated:
        return any(low <= hi and high >= lo for low, high in ranges for lo, hi in _WRITABLE)
    for lo, hi in _WRITABLE:  # the complement: walk each writable span past the ranges that cover its start
        point = lo
        for low, high in sorted(ranges):
            if low > point:
                break
            point = max(point, high + 1)
        if point <= hi:
            return True
    return False


def parse_gbnf(text: str, name: str, *, max_elements: int, on_copies: Callable[[int], None] = lambda n: None
               ) -> GbnfRules:
    """The rules llama.cpp's parser makes of ``text`` (no NUL in it), or :class:`InvalidInputError` naming
    ``name`` with the line, the column and the reason. ``max_elements`` bounds the elements llama.cpp would
    store; ``on_copies`` hears each ``{...}`` repetition's largest count as it is read (it may refuse)."""
    return _Parser(text, name, max_elements, on_copies).parse()
