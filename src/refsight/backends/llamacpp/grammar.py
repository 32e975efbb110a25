"""JSON schema → GBNF for llama.cpp's grammar sampler, tightened so every answer fits the judge.

llama-cpp-python's converter (:func:`llama_cpp.llama_grammar.json_schema_to_gbnf`)
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
from typing import Any

__all__ = ["schema_to_gbnf", "tighten_schema"]

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
