"""GBNF for llama.cpp's grammar sampler: a caller's, checked against the vocabulary; a JSON schema's, tightened.

:func:`check_grammar` is the one door a grammar passes before llama.cpp parses it: the rules
(:mod:`refsight.inputs.gbnf`: what would crash or hang llama.cpp is refused there), then each
token reference against the loaded vocabulary (an id below ``n_vocab``, a ``<text>`` that is one
token; a required token never an end-of-generation token, one without text, nor one whose text could
start inside the characters right before it, which llama.cpp's sampler mishandles and aborts on), then
llama.cpp's own parse. What passes is a :class:`~.grammar_stacks.CheckedGrammar`, whose stacks the
sampler then follows beside llama.cpp's (:mod:`.grammar_stacks`).

A JSON schema's grammar: llama-cpp-python's converter (:func:`llama_cpp.llama_grammar.json_schema_to_gbnf`)
does the work, with two adjustments made here, each to a *stricter* schema or
grammar (so anything the grammar allows is still valid under the original schema):

* ``number`` with both ``minimum`` and ``maximum``: the converter ignores bounds on
  numbers, so such a number becomes an ``enum`` of 101 evenly spaced values within
  the bounds (the judge's ``confidence`` in [0, 1] → 0, 0.01, ..., 1).
* whitespace: the converter allows a space after every token; answers are made
  compact instead, so they never exceed the judge's token budget (counted for
  ``json.dumps``' ``", "`` / ``": "`` separators).
* string characters: the converter's ``char`` admits raw control characters (a
  newline inside a string, which JSON forbids) and ``\\uXXXX`` escapes (lone
  surrogates); here ``char`` is any other character or a one-letter escape.
"""

from __future__ import annotations

import json
import re
from typing import Any, Protocol

from ...errors import InvalidInputError
from ...inputs.gbnf import TokenReference, read_gbnf
from ...inputs.gbnf_syntax import matches
from .grammar_stacks import CheckedGrammar
from .native import NativeError

__all__ = ["GrammarRuntime", "check_grammar", "schema_to_gbnf", "tighten_schema"]


class GrammarRuntime(Protocol):
    """What the check needs of a runtime (:class:`~.native.LlamaRuntime`): its vocabulary and llama.cpp's parser."""

    n_vocab: int

    def is_eog(self, token: int) -> bool: ...

    def piece(self, token: int, special: bool = False) -> bytes: ...

    def tokenize(self, text: str, parse_special: bool, add_special: bool = False) -> list[int]: ...

    def check_grammar(self, grammar: str) -> None: ...


def check_grammar(runtime: GrammarRuntime, grammar: str, name: str = "grammar", *, bounded: bool = True
                  ) -> CheckedGrammar:
    """``grammar`` checked for llama.cpp on this runtime (:class:`InvalidInputError` naming ``name`` if not):
    its rules (with the caller's size bounds unless ``bounded`` is False), its token references, then
    llama.cpp's own parse (the caller holds the runtime's lock)."""
    rules = read_gbnf(grammar, name, bounded=bounded)
    token_ids = tuple(_token_id(runtime, reference, name) for reference in rules.tokens)
    try:
        runtime.check_grammar(grammar)
    except NativeError as e:  # llama.cpp's parser said no after every check above: a case they do not know
        raise InvalidInputError(name, str(e)) from None
    return CheckedGrammar(grammar, rules, token_ids)


def _token_id(runtime: GrammarRuntime, reference: TokenReference, name: str) -> int:
    """The id of one token reference, checked against the runtime's vocabulary as llama.cpp reads it and as its
    sampler can meet it."""
    written = f"<[{reference.id}]>" if reference.text is None else reference.text[:80]
    token = reference.id
    if reference.text is not None:  # llama.cpp tokenizes the brackets too, special tokens parsed
        tokens = runtime.tokenize(reference.text, True)
        if len(tokens) != 1:
            raise InvalidInputError(name, f"{reference.at}: {written} is {len(tokens)} tokens of the vocabulary, "
                                          "not one (write <[id]> for a token by its id)")
        token = tokens[0]
    if token >= runtime.n_vocab:
        raise InvalidInputError(name, f"{reference.at}: token {written} is not in the vocabulary "
                                      f"(0 to {runtime.n_vocab - 1})")
    if not reference.negated:
        _check_required(runtime, reference, token, written, name)
    return token


def _check_required(runtime: GrammarRuntime, reference: TokenReference, token: int, written: str, name: str) -> None:
    """A token the grammar requires must be one llama.cpp's sampler can offer and accept there."""
    # llama.cpp's sampler masks these before the grammar sees them: a grammar waiting on one can never go on.
    if runtime.is_eog(token):
        raise InvalidInputError(name, f"{reference.at}: {written} is an end-of-generation token: the answer ends "
                                      "there by itself, a grammar cannot ask for it")
    piece = runtime.piece(token, True)
    if not piece or piece[0] == 0:
        raise InvalidInputError(name, f"{reference.at}: {written} has no text llama.cpp's grammar can match")
    # Its sampler lets the token through when the characters right before the reference match the start of its
    # text (and the reference the rest); accepting it then finds no way on, and aborts.
    text = piece.decode("utf-8", "replace")
    crossing = next((c for c in text[:-1] for chars in reference.after if matches(chars, ord(c))), None)
    if crossing is not None:
        raise InvalidInputError(name, f"{reference.at}: {written} comes right after an element that matches "
                                      f"{crossing!r}, a character of its own text {text[:40]!r}: llama.cpp cannot "
                                      "run a token that starts inside the characters before it")


_GRID = 100


def tighten_schema(schema: Any) -> Any:
    """A copy of ``schema`` with bounded numbers replaced by a finite grid of values (see module doc)."""
    if isinstance(schema, list):
        return [tighten_schema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: tighten_schema(v) for k, v in schema.items()}
    if not _bounded_number(out):
        return out
    low, high = out["minimum"], out["maximum"]
    values = sorted({_tidy(low + (high - low) * k / _GRID) for k in range(_GRID + 1)})
    # Rounding must never step outside the bounds.
    return {"enum": [v for v in values if low <= v <= high]}


def _bounded_number(schema: dict[str, Any]) -> bool:
    """A number schema with both bounds (the lower not above the upper) and no ``enum`` or ``const`` of its own."""
    low, high = schema.get("minimum"), schema.get("maximum")
    return (
        schema.get("type") == "number"
        and isinstance(low, (int, float))
        and isinstance(high, (int, float))
        and low <= high
        and "enum" not in schema
        and "const" not in schema
    )


def _tidy(value: float) -> int | float:
    value = round(value, 6)
    return int(value) if float(value).is_integer() else value


def schema_to_gbnf(schema: dict[str, Any]) -> str:
    """The GBNF grammar (root rule ``root``) of the tightened ``schema``, without optional whitespace."""
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    grammar = json_schema_to_gbnf(json.dumps(tighten_schema(schema)))
    compact, n = re.subn(r"^space ::= .*$", 'space ::= ""', grammar, flags=re.MULTILINE)
    if n != 1:  # pragma: no cover - a converter that names its whitespace rule differently
        raise ValueError("the JSON-schema converter produced no 'space' rule to compact")
    return re.sub(r"^char ::= .*$", lambda _: _CHAR, compact, flags=re.MULTILINE)


# JSON string characters: no quote, backslash, DEL or control character; or a short escape.
_CHAR = r'char ::= [^"\\\x7F\x00-\x1F] | "\\" ["\\/bfnrt]'
