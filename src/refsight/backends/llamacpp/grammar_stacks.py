"""llama.cpp's grammar stacks, followed in Python beside its sampler: a token is accepted only where it can go on.

llama.cpp's grammar sampler keeps a set of pushdown stacks, one per way the answer so far can be
parsed. Two of its steps take the process down: accepting a token that leaves no stack (its masking
step lets through a token whose first characters match the characters before a token reference and
whose id matches the reference, but its accepting step drops that way: it throws across the C
boundary, and the process aborts), and a grammar so ambiguous that the stacks multiply with every
token (each step tests every token of the vocabulary against each stack: minutes a token, then the
memory). :class:`GrammarStacks` follows the same stacks over the rules
:func:`~refsight.inputs.gbnf.read_gbnf` built (llama.cpp's ids, rewrites and positions: a position is
a rule, an alternative, an item and a character within a literal), and :meth:`GrammarStacks.accept`
refuses, naming ``grammar``, a token that would leave none or more than :data:`MAX_STACKS`, or make more
than :data:`MAX_STEP_WORK` on the way, before llama.cpp accepts it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import InvalidInputError
from ...inputs.gbnf import MAX_BRANCHES, GbnfRules
from ...inputs.gbnf_syntax import matches

__all__ = ["MAX_STACKS", "CheckedGrammar", "GrammarStacks"]

#: The most stacks (ways to parse the answer so far) a grammar may keep: each step of llama.cpp's sampler tests
#: every token of the vocabulary against each one, and its accepting step dedups them pairwise. Measured on a
#: fuzzed grammar whose stacks doubled with each token: 2040 stacks took 0.15 s in llama.cpp's accepting step,
#: 8184 0.46 s, then 32760 14 s (and 21 s here). The same bound as :data:`~refsight.inputs.gbnf.MAX_BRANCHES`.
MAX_STACKS = MAX_BRANCHES
#: The most stacks one token may make on the way (each character of it matched against each stack, and every
#: rule each match then enters): the work of llama.cpp's accepting step, and of this one (about 0.1 s here).
MAX_STEP_WORK = 1 << 16

_Position = tuple[int, int, int, int]  # rule, alternative, item, character within a literal
_Stack = tuple[_Position, ...]
# UTF-8 sequence lengths by a first byte's high nibble (llama.cpp's decode_utf8; 0: a continuation byte).
_LENGTHS = (1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 2, 2, 3, 4)


@dataclass(frozen=True)
class CheckedGrammar:
    """A grammar that passed every check (:func:`.grammar.check_grammar`): its text for llama.cpp, its rules,
    and the id of each of its token references on this runtime."""

    text: str
    rules: GbnfRules
    token_ids: tuple[int, ...]


class GrammarStacks:
    """The stacks llama.cpp's grammar holds for the answer so far (as its sampler builds them at the start)."""

    def __init__(self, grammar: CheckedGrammar, max_stacks: int = MAX_STACKS) -> None:
        rules = grammar.rules
        self.rules, self.terminals, self.references = rules.rules, rules.terminals, rules.tokens
        self.token_ids, self.max_stacks = grammar.token_ids, max_stacks
        self.partial = (0, 0)  # llama.cpp's partial UTF-8 character: its value so far, the bytes still to come
        self.work = 0  # the stacks made for the token being accepted
        self.stacks: set[_Stack] = set()
        root = rules.names["root"]
        for k, alternative in enumerate(self.rules[root]):
            self._advance(((root, k, 0, 0),) if alternative else (), self.stacks)

    @property
    def complete(self) -> bool:
        """Whether the answer so far is a whole sentence of the grammar (it may end here)."""
        return () in self.stacks

    def accept(self, token: int, piece: bytes, end_of_generation: bool) -> None:
        """Follow ``token`` (its text ``piece``, as llama.cpp's grammar reads it) as llama.cpp's accepting step
        does; :class:`InvalidInputError` naming ``grammar`` when that would leave no stack, or too many."""
        if end_of_generation:  # llama.cpp ends the grammar there, and aborts unless it is complete
            if not self.complete:
                raise InvalidInputError("grammar", "the answer cannot end before the grammar is complete")
            return
        code_points, partial = _decode(piece, *self.partial)
        self.work = 0
        accepted: set[_Stack] = set()
        for stack in self.stacks:
            if not stack:
                continue
            described = self._terminal(stack[-1])
            if isinstance(described, int):  # a token reference: the whole token, by its id
                if (self.token_ids[described] == token) != self.references[described].negated:
                    self._advance(self._after(stack), accepted)
                continue
            current = {stack}
            for code_point in code_points:
                following: set[_Stack] = set()
                for state in current:
                    self._accept_char(state, code_point, following)
                current = following
            accepted |= current
            self._bound(accepted)
        if not accepted:
            raise InvalidInputError("grammar", f"llama.cpp's grammar cannot go on with token {token} "
                                               f"({piece[:40]!r}) although its sampler offered it")
        self.stacks, self.partial = accepted, partial

    def _terminal(self, position: _Position) -> int | str | tuple:
        rule, alternative, item, _ = position
        return self.terminals[-1 - self.rules[rule][alternative][item]]

    def _after(self, stack: _Stack) -> _Stack:
        """``stack`` without its top, and the top's next item when its alternative goes on."""
        rule, alternative, item, _ = stack[-1]
        if item + 1 < len(self.rules[rule][alternative]):
            return (*stack[:-1], (rule, alternative, item + 1, 0))
        return stack[:-1]

    def _accept_char(self, stack: _Stack, code_point: int, out: set[_Stack]) -> None:
        """llama_grammar_accept_chr: the stacks after ``stack`` matched ``code_point`` (none if it does not; a
        token reference on top takes no character)."""
        if not stack:  # the grammar was complete: nothing may follow
            return
        self.work += 1
        described = self._terminal(stack[-1])
        if isinstance(described, int):
            return
        if isinstance(described, str):  # a literal, one character at a time
            rule, alternative, item, at = stack[-1]
            if ord(described[at]) != code_point:
                return
            if at + 1 < len(described):
                out.add((*stack[:-1], (rule, alternative, item, at + 1)))
                self._bound(out)
                return
        elif not matches(described, code_point):
            return
        self._advance(self._after(stack), out)

    def _advance(self, stack: _Stack, out: set[_Stack]) -> None:
        """llama_grammar_advance_stack: every stack ``stack`` opens, each topped by something that matches input
        (or empty: the grammar complete), into ``out``."""
        todo, seen = [stack], set()
        while todo:
            current = todo.pop()
            if current in seen:
                continue
            seen.add(current)
            self.work += 1
            self._bound(seen)
            if not current:
                out.add(current)
                continue
            rule, alternative, item, _ = current[-1]
            entered = self.rules[rule][alternative][item]
            if entered < 0:
                out.add(current)
                continue
            base = self._after(current)
            for k, sub in enumerate(self.rules[entered]):
                todo.append((*base, (entered, k, 0, 0)) if sub else base)
        self._bound(out)

    def _bound(self, stacks: set[_Stack]) -> None:
        """Refuse the grammar once ``stacks`` holds more than :attr:`max_stacks`, or the token made too many."""
        if len(stacks) > self.max_stacks or self.work > MAX_STEP_WORK:
            raise InvalidInputError("grammar", f"is too ambiguous: llama.cpp would follow more than {self.max_stacks} "
                                               f"ways to parse the answer at once, or make more than {MAX_STEP_WORK} "
                                               "for one token (it tests every token against each)")


def _decode(piece: bytes, value: int, remaining: int) -> tuple[list[int], tuple[int, int]]:
    """llama.cpp's decode_utf8: the code points ``piece`` completes after a partial character (``value`` with
    ``remaining`` bytes to come), and the partial character it leaves; an invalid byte drops the piece."""
    end = piece.find(b"\0")
    end = len(piece) if end < 0 else end
    points, pos, continued = [], 0, remaining > 0
    while pos < end and remaining > 0:
        if piece[pos] >> 6 != 2:
            return [], (0, -1)
        value, pos, remaining = (value << 6) + (piece[pos] & 0x3F), pos + 1, remaining - 1
    if continued and remaining == 0:
        points.append(value)
    while pos < end:
        remaining = _LENGTHS[piece[pos] >> 4] - 1
        if remaining < 0:
            return [], (0, remaining)
        value, pos = piece[pos] & ((1 << (7 - remaining)) - 1), pos + 1
        while pos < end and remaining > 0:
            value, pos, remaining = (value << 6) + (piece[pos] & 0x3F), pos + 1, remaining - 1
        if remaining == 0:
            points.append(value)
    return points, (value, remaining)
