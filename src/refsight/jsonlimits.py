"""A nesting limit for JSON (and YAML) that users send, checked without recursion.

Python's ``json.loads`` recurses once per level of nesting, so ``[[[[...]]]]`` a
thousand levels deep raises ``RecursionError`` (and ``json.dumps`` of such data does
too). :func:`json_depth` measures the nesting of JSON *text* iteratively and at C
speed (escapes and strings are removed with regular expressions, every byte that is
not a bracket is dropped, and the running depth is summed in bounded chunks), so a
32 MiB body is checked in milliseconds before anything parses it.

:data:`MAX_JSON_DEPTH` (64 levels) is far above what any refsight input needs:
metadata, rubrics and chat requests are a few levels deep.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from .errors import InvalidInputError

__all__ = ["MAX_JSON_DEPTH", "check_json_depth", "data_depth", "json_depth", "load_json"]

#: Deepest nesting of arrays and objects accepted in any JSON input (bodies, fields, rubrics).
MAX_JSON_DEPTH = 64

_ESCAPE = re.compile(rb"\\.", re.DOTALL)
_STRING = re.compile(rb'"[^"]*"')
_NOT_BRACKET = bytes(b for b in range(256) if b not in b"[]{}")
_CHUNK = 1 << 20


def json_depth(text: str | bytes | bytearray | memoryview, *, stop_above: int | None = None) -> int:
    """The deepest nesting of ``[``/``{`` in JSON ``text``, ignoring brackets inside strings.

    Malformed JSON is measured as well as it can be (the parser will refuse it later).
    With ``stop_above`` the answer only tells whether the depth exceeds it (counting stops
    early, and a small input may report an upper bound instead of its exact depth).
    """
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else bytes(text)
    if b"[" not in data and b"{" not in data:
        return 0
    # Escapes first (an escaped quote does not end a string), then strings, then non-brackets.
    brackets = _STRING.sub(b"", _ESCAPE.sub(b"", data)).translate(None, _NOT_BRACKET)
    if stop_above is not None and len(brackets) <= stop_above:
        return min(len(brackets), stop_above)  # cannot be deeper than its bracket count
    import numpy as np

    depth = deepest = 0
    for start in range(0, len(brackets), _CHUNK):
        codes = np.frombuffer(brackets, dtype=np.uint8, count=min(_CHUNK, len(brackets) - start), offset=start)
        steps = np.where((codes == ord("[")) | (codes == ord("{")), 1, -1).astype(np.int32)
        running = np.cumsum(steps, dtype=np.int64) + depth
        deepest = max(deepest, int(running.max()))
        depth = int(running[-1])
        if stop_above is not None and deepest > stop_above:
            break
    return deepest


def data_depth(value: Any, *, stop_above: int | None = None) -> int:
    """The nesting depth of decoded data (lists, tuples and mappings), walked without recursion."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, Mapping):
            children = list(item.values())
        elif isinstance(item, (list, tuple)):
            children = list(item)
        else:
            continue
        depth += 1
        deepest = max(deepest, depth)
        if stop_above is not None and deepest > stop_above:
            return deepest
        stack.extend((child, depth) for child in children)
    return deepest


def check_json_depth(
    text: str | bytes | bytearray | memoryview,
    what: str,
    *,
    limit: int = MAX_JSON_DEPTH,
    error: type[InvalidInputError] = InvalidInputError,
) -> None:
    """Raise ``error(what, ...)`` when ``text`` nests deeper than ``limit``."""
    depth = json_depth(text, stop_above=limit)
    if depth > limit:
        raise error(what, f"JSON nested more than {limit} levels deep (the limit is {limit})")


def load_json(
    text: str | bytes | bytearray,
    what: str,
    *,
    limit: int = MAX_JSON_DEPTH,
    error: type[InvalidInputError] = InvalidInputError,
) -> Any:
    """``json.loads`` after the depth check; malformed JSON raises ``error(what, ...)`` too."""
    check_json_depth(text, what, limit=limit, error=error)
    try:
        return json.loads(text)
    except (ValueError, UnicodeDecodeError) as e:
        raise error(what, f"not valid JSON ({e})") from None
