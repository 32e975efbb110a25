"""The rules llama.cpp builds of a grammar (:mod:`.gbnf_syntax`), checked as llama.cpp will run them.

:func:`check_rules` refuses, naming the grammar and the rule: a rule used but never defined, a grammar
without ``root``; left recursion, both as llama.cpp detects it (through rules with an empty
alternative: it refuses those) and hidden behind rules that match "" otherwise (llama.cpp misses
those and grows its stack forever); rules with no finite text; more work than a fixed budget in
llama.cpp's recursive left-recursion check (:data:`MAX_LEFT_DEPTH` deep, :data:`MAX_LEFT_CALLS` calls:
it enters a shared rule once per path to it) and in one step of its automaton (:data:`MAX_BRANCHES`
alternatives opened before a character); and a token reference right after a character. llama.cpp's
sampler lets a token through when its first characters match the characters before such a reference
and the reference matches the token, but accepting it then finds no way on and aborts the process: a
``!<...>`` there is refused (nearly every token would do), a ``<...>`` carries the characters before
it (:attr:`~.gbnf_syntax.TokenReference.after`) for the runtime to hold against its token's text.
All of it runs without recursion, in time linear in the rules (token references: times their count).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace

from ..errors import InvalidInputError
from .gbnf_syntax import CharSet, GbnfRules, TokenReference

__all__ = ["MAX_LEFT_DEPTH", "MAX_LEFT_CALLS", "MAX_BRANCHES", "MAX_TOKEN_REFERENCES", "check_rules"]

#: The deepest recursion of llama.cpp's left-recursion check (one level per rule it enters at a rule's start,
#: 140 bytes of stack each, measured on llama-cpp-python 0.3.36: a 64 KiB thread stack overflows near 456
#: levels, an 8 MiB one near 60,000). 4096 levels take 560 KiB: a margin of 14 on a thread's default 8 MiB.
MAX_LEFT_DEPTH = 4096
#: The most calls llama.cpp's left-recursion check may make (a chain of 40 rules ``a ::= b | b`` takes 2^40;
#: 2^20 took 52 ms).
MAX_LEFT_CALLS = 1 << 20
#: The most alternatives one step of llama.cpp's automaton may open before it matches a character (each a
#: stack it keeps and tests every token of the vocabulary against, at every step; its runtime follows as many
#: at most: ``backends/llamacpp/grammar_stacks.py``).
MAX_BRANCHES = 1 << 12
#: The most token references a grammar may hold (each one followed through the rules).
MAX_TOKEN_REFERENCES = 256

_Rules = dict[int, tuple[tuple[int, ...], ...]]
_Edge = tuple[int, int, bool]  # (rule, rule it enters at the start, whether that reference ends its alternative)


def check_rules(grammar: GbnfRules, name: str) -> GbnfRules:
    """``grammar``, refused (naming ``name``) unless its rules are all defined, ``root`` among them, none is
    left-recursive, each can end, llama.cpp's work on them stays within the budgets and no token reference
    stands where llama.cpp's sampler mishandles it; its token references' :attr:`~TokenReference.after` set."""
    _check_defined(grammar, name)
    rules = grammar.rules
    nullable = _closure(rules, lambda alternative: min(alternative, default=0) >= 0)
    edges = list(_start_edges(rules, nullable))
    components = _components(rules, edges)
    llama_edges, llama_components = _check_left_recursion(grammar, name, nullable, edges, components)
    _check_endless(grammar, name)
    _check_left_walk(grammar, name, llama_edges, llama_components)
    _check_branches(grammar, name, edges, components)
    grammar.tokens = _placed_tokens(grammar, name, nullable, edges)
    return grammar


def _check_defined(grammar: GbnfRules, name: str) -> None:
    """Every rule used is defined, and ``root`` among them."""
    for rule_name, rule_id in grammar.names.items():
        if rule_id not in grammar.rules:
            raise InvalidInputError(name, f"rule {rule_name!r} is used ({grammar.used_at[rule_name]}) but never defined")
    if "root" not in grammar.names:
        raise InvalidInputError(name, "has no 'root' rule (generation starts from root ::= ...)")


def _check_left_recursion(
    grammar: GbnfRules, name: str, nullable: set[int], edges: list[_Edge], components: dict[int, int],
) -> tuple[list[_Edge], dict[int, int]]:
    """No rule reaches itself before a character, as llama.cpp sees it or hidden from it; llama.cpp's own start edges
    and their components (what its left-recursion check walks)."""
    rules = grammar.rules
    # llama.cpp refuses a cycle through the rules it knows to be empty (those with an empty alternative). It
    # misses the cycles through rules that match "" otherwise; with more to match after the reference, its
    # stack then grows forever. A cycle of references that each end their alternative (``("a"?)*``) keeps the
    # stack's size: it runs. Its edges are a subset of these: without a cycle here, it has none either.
    cyclic = any(components[rule] == components[child] for rule, child, _ in edges)
    llama_edges = list(_start_edges(rules, {r for r, alternatives in rules.items() if () in alternatives}))
    llama_components = _components(rules, llama_edges) if cyclic else components
    cycles = [(r, c) for r, c, last in edges if components[r] == components[c] and not last]
    cycles += [(r, c) for r, c, _ in llama_edges if llama_components[r] == llama_components[c]]
    if cycles:
        raise InvalidInputError(name, f"{_where(grammar, cycles[0][0])} is left-recursive: it can reach itself "
                                      "before matching any character, which llama.cpp cannot run")
    return llama_edges, llama_components


def _check_endless(grammar: GbnfRules, name: str) -> None:
    """Every rule matches some finite text."""
    endless = sorted(set(grammar.rules) - _closure(grammar.rules, lambda alternative: True))
    if endless:
        owners = list(dict.fromkeys(grammar.owner[rule] for rule in endless))
        raise InvalidInputError(name, f"{'rule' if len(owners) == 1 else 'rules'} {', '.join(map(repr, owners[:5]))} "
                                      "can never end: no finite text matches them (each alternative needs a rule "
                                      "that never ends)")


def _where(grammar: GbnfRules, rule: int) -> str:
    """A rule as the caller wrote it: ``rule 'x'``, or ``a group or repetition in rule 'x'``."""
    owner = grammar.owner[rule]
    return f"rule {owner!r}" if grammar.names.get(owner) == rule else f"a group or repetition in rule {owner!r}"


def _check_left_walk(grammar: GbnfRules, name: str, edges: list[_Edge], components: dict[int, int]) -> None:
    """llama.cpp's left-recursion check walks ``edges`` (no cycle now; ``components`` a topological numbering)
    depth first from each rule it has not visited, in id order, entering a shared rule once per path to it:
    its depth and its calls, bounded."""
    children: dict[int, list[int]] = defaultdict(list)
    for rule, child, _ in edges:
        children[rule].append(child)
    depth: dict[int, int] = {}  # rules entering none are left out: 1 and 1
    calls: dict[int, int] = {}
    for rule in sorted(children, key=components.__getitem__):  # a rule after the rules it enters
        entered = children[rule]
        depth[rule] = 1 + max(depth.get(child, 1) for child in entered)
        calls[rule] = min(MAX_LEFT_CALLS + 1, 1 + sum(calls.get(child, 1) for child in entered))
        if depth[rule] > MAX_LEFT_DEPTH:
            raise InvalidInputError(name, f"{_where(grammar, rule)} starts with a chain of more than "
                                          f"{MAX_LEFT_DEPTH} rules, deeper than llama.cpp's recursive check takes")
    total, visited = 0, set()
    for start in sorted(grammar.rules):
        if start in visited:
            continue
        total += calls.get(start, 1)
        if total > MAX_LEFT_CALLS:
            raise InvalidInputError(name, f"its rules branch into more than {MAX_LEFT_CALLS} paths at their starts "
                                          "(llama.cpp's left-recursion check walks each one)")
        todo = [start]
        while todo:
            rule = todo.pop()
            if rule not in visited:
                visited.add(rule)
                todo.extend(children.get(rule, ()))


def _check_branches(grammar: GbnfRules, name: str, edges: list[_Edge], components: dict[int, int]) -> None:
    """How many places one step of llama.cpp's automaton can open from a rule before it matches a character:
    each alternative of each rule it enters (a stack each, tested against every token; a cycle's rules
    counted once, as llama.cpp visits a stack once), bounded."""
    opened: dict[int, int] = defaultdict(int)
    for rule, alternatives in grammar.rules.items():
        opened[components[rule]] += len(alternatives)
    outgoing: dict[int, list[int]] = defaultdict(list)
    for rule, child, _ in edges:
        if components[rule] != components[child]:
            outgoing[components[rule]].append(components[child])
    for component in sorted(opened):  # a component after those it enters
        if component in outgoing:
            opened[component] = min(MAX_BRANCHES + 1, opened[component] + sum(opened[c] for c in outgoing[component]))
        if opened[component] > MAX_BRANCHES:
            rule = next(r for r in sorted(grammar.rules) if components[r] == component)
            raise InvalidInputError(name, f"{_where(grammar, rule)} opens more than {MAX_BRANCHES} alternatives "
                                          "before its first character (llama.cpp keeps and tests a stack for each)")


def _closure(rules: _Rules, usable: Callable[[tuple[int, ...]], bool]) -> set[int]:
    """The rules with a ``usable`` alternative whose references all lie in the result (a least fixpoint):
    with ``usable`` refusing terminals, the rules that match the empty text; with all usable, those that
    match some finite text."""
    ready, open_refs, owners, waiting = _alternatives_waiting(rules, usable)
    found: set[int] = set()
    while ready:
        rule = ready.pop()
        if rule in found:
            continue
        found.add(rule)
        for k in waiting.pop(rule, ()):
            open_refs[k] -= 1
            if open_refs[k] == 0:
                ready.append(owners[k])
    return found


def _alternatives_waiting(
    rules: _Rules, usable: Callable[[tuple[int, ...]], bool],
) -> tuple[list[int], list[int], list[int], dict[int, list[int]]]:
    """Where :func:`_closure` starts: the rules with a usable alternative of terminals only (``ready``), and per
    usable alternative waiting on references how many are not found yet (``open_refs``) and its rule (``owners``);
    ``waiting``: a rule -> the alternatives that wait on it."""
    ready: list[int] = []
    open_refs: list[int] = []
    owners: list[int] = []
    waiting: dict[int, list[int]] = defaultdict(list)
    for rule, alternatives in rules.items():
        for alternative in filter(usable, alternatives):
            refs = {item for item in alternative if item >= 0}
            if not refs:
                ready.append(rule)
                continue
            for ref in refs:
                waiting[ref].append(len(open_refs))
            open_refs.append(len(refs))
            owners.append(rule)
    return ready, open_refs, owners, waiting


def _start_edges(rules: _Rules, passable: set[int]) -> Iterator[_Edge]:
    """Each reference a rule enters before matching a character: those at an alternative's start, or after
    references to ``passable`` rules only (llama.cpp's ``rules_may_be_empty``, or every rule matching "")."""
    for rule, alternatives in rules.items():
        for alternative in alternatives:
            for k, item in enumerate(alternative):
                if item < 0:
                    break
                yield rule, item, k == len(alternative) - 1
                if item not in passable:
                    break


def _components(rules: _Rules, edges: list[_Edge]) -> dict[int, int]:
    """Each rule's strongly connected component along ``edges``, numbered in reverse topological order
    (a component's successors get lower numbers): Tarjan's algorithm, without recursion."""
    tarjan = _Tarjan(edges)
    for rule in rules:
        if rule not in tarjan.index:
            tarjan.walk(rule)
    return tarjan.component


class _Tarjan:
    """The state of Tarjan's walk: each rule's visit order and lowest reachable order, its component once
    closed, and the rules of the components still open."""

    def __init__(self, edges: list[_Edge]) -> None:
        self.children: dict[int, list[int]] = defaultdict(list)
        for rule, child, _ in edges:
            self.children[rule].append(child)
        self.index: dict[int, int] = {}
        self.low: dict[int, int] = {}
        self.component: dict[int, int] = {}
        self.open: list[int] = []
        self.closed = 0

    def walk(self, start: int) -> None:
        """Visit everything reachable from ``start`` depth first, a stack of (rule, next child) for recursion."""
        work = [(start, 0)]
        while work:
            rule, k = work.pop()
            if k == 0:
                self.index[rule] = self.low[rule] = len(self.index)
                self.open.append(rule)
            entered = self.children.get(rule, ())
            if k < len(entered):
                work.append((rule, k + 1))
                child = entered[k]
                if child not in self.index:
                    work.append((child, 0))
                elif child not in self.component:
                    self.low[rule] = min(self.low[rule], self.index[child])
                continue
            if self.low[rule] == self.index[rule]:
                self.close(rule)
            if work:
                parent = work[-1][0]
                self.low[parent] = min(self.low[parent], self.low[rule])

    def close(self, root: int) -> None:
        """Number the component ``root`` heads: the open rules down to it."""
        while True:
            member = self.open.pop()
            self.component[member] = self.closed
            if member == root:
                break
        self.closed += 1


def _placed_tokens(grammar: GbnfRules, name: str, nullable: set[int], edges: list[_Edge]) -> list[TokenReference]:
    """The token references, each with the characters an element right before it may match; a ``!<...>``
    with any refused."""
    if not grammar.tokens:
        return []
    if len(grammar.tokens) > MAX_TOKEN_REFERENCES:
        raise InvalidInputError(name, f"has {len(grammar.tokens)} token references; at most {MAX_TOKEN_REFERENCES} "
                                      "are taken")
    before = _chars_before_tokens(grammar, nullable, edges)
    placed = []
    for k, reference in enumerate(grammar.tokens):
        if reference.negated and before[k]:
            raise InvalidInputError(name, f"{reference.at}: a !<...> token reference may not follow a character "
                                          "directly (llama.cpp's sampler would let through a token that starts with "
                                          "that character and abort); put a token reference before it")
        placed.append(replace(reference, after=tuple(sorted(before[k]))))
    return placed


def _chars_before_tokens(grammar: GbnfRules, nullable: set[int], edges: list[_Edge]) -> dict[int, set[CharSet]]:
    """For each token reference (by index), what the elements that can come right before it match: each
    character terminal followed by the tokens that can start what follows it (``first``), or what follows
    its rule when the rest of its alternative can be empty (``follow``, a fixpoint)."""
    rules, terminals = grammar.rules, grammar.terminals
    first = _first_tokens(grammar, nullable, edges)
    follow: dict[int, int] = defaultdict(int)  # a rule -> the tokens that can come right after it (a bit each)
    feeds: dict[int, list[int]] = defaultdict(list)  # a rule -> the rules at the open end of its alternatives
    chars_then: set[tuple[CharSet, int, int | None]] = set()  # (characters, tokens after, rule whose follow too)
    for rule, alternatives in rules.items():
        for alternative in alternatives:
            after, open_end = 0, True
            for item in reversed(alternative):
                if item >= 0:
                    follow[item] |= after
                    if open_end:
                        feeds[rule].append(item)
                    after = first[item] | (after if item in nullable else 0)
                    open_end = open_end and item in nullable
                    continue
                described = terminals[-1 - item]
                if isinstance(described, int):
                    after = 1 << described
                else:  # a class or ``.``, or a literal: its last character
                    last = (False, ((ord(described[-1]),) * 2,)) if isinstance(described, str) else described
                    chars_then.add((last, after, rule if open_end else None))
                    after = 0
                open_end = False
    _spread(follow, feeds, rules)
    return _by_token(chars_then, follow)


def _by_token(chars_then: set[tuple[CharSet, int, int | None]], follow: dict[int, int]) -> dict[int, set[CharSet]]:
    """Each token reference's (by index) characters before it, from each character terminal's tokens after it (and
    its rule's follow where the rest of its alternative can be empty)."""
    before: dict[int, set[CharSet]] = defaultdict(set)
    for chars, after, rule in chars_then:
        tokens = after | (follow[rule] if rule is not None else 0)
        while tokens:
            lowest = tokens & -tokens
            before[lowest.bit_length() - 1].add(chars)
            tokens ^= lowest
    return before


def _first_tokens(grammar: GbnfRules, nullable: set[int], edges: list[_Edge]) -> dict[int, int]:
    """For each rule, the tokens (a bit each) that can start it: those at its alternatives' starts (after
    references to rules that can be empty), then those of the rules it enters there (a fixpoint)."""
    first: dict[int, int] = defaultdict(int)
    for rule, alternatives in grammar.rules.items():
        for alternative in alternatives:
            for item in alternative:
                if item >= 0 and item in nullable:
                    continue
                if item < 0 and isinstance(grammar.terminals[-1 - item], int):
                    first[rule] |= 1 << grammar.terminals[-1 - item]
                break
    parents: dict[int, list[int]] = defaultdict(list)
    for rule, child, _ in edges:
        parents[child].append(rule)
    _spread(first, parents, grammar.rules)
    return first


def _spread(bits: dict[int, int], onward: dict[int, list[int]], rules: Iterable[int]) -> None:
    """Each rule's ``bits`` into the rules ``onward`` of it, and on, until nothing changes (each bit crosses each
    edge once at most)."""
    todo = list(rules)
    while todo:
        source = todo.pop()
        for target in onward.get(source, ()):
            if bits[source] & ~bits[target]:
                bits[target] |= bits[source]
                todo.append(target)
