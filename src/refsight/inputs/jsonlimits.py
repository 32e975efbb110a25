"""Limits on the structured text users send (JSON, YAML), checked before or while it is parsed.

Python's ``json.loads`` recurses once per level of nesting, so ``[[[[...]]]]`` a
thousand levels deep raises ``RecursionError`` (and ``json.dumps`` of such data does
too). :func:`json_depth` measures the nesting of JSON *text* iteratively and at C
speed (escapes and strings are removed with regular expressions, every byte that is
not a bracket is dropped, and the running depth is summed in bounded chunks), so a
32 MiB body is checked in milliseconds before anything parses it.

:data:`MAX_JSON_DEPTH` (64 levels) is far above what any refsight input needs:
metadata, rubrics and chat requests are a few levels deep.

YAML adds aliases: ``&a [*b, *b, ...]`` nine levels deep is 400 bytes that stand for a
billion nodes, cheap to parse but not to walk. :func:`load_yaml` therefore reads the
parser's events first (in C when libyaml is there) and refuses anchors and aliases, nesting
deeper than :data:`MAX_JSON_DEPTH` and more than :data:`MAX_NODES` nodes before anything is
composed, so the document then built is a tree no larger than the text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from ..errors import InvalidInputError

__all__ = [
    "MAX_JSON_DEPTH", "MAX_NODES", "check_json_depth", "data_depth", "json_depth", "json_nodes", "load_json", "load_yaml",
]

#: Deepest nesting of arrays and objects accepted in any JSON input (bodies, fields, rubrics).
MAX_JSON_DEPTH = 64
#: Most values (scalars, lists, mappings) a YAML document or a JSON rubric may hold.
MAX_NODES = 10_000

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


def json_nodes(text: str | bytes | bytearray | memoryview) -> int:
    """An upper bound on the values in JSON ``text``: one, plus one per ``,``, ``[`` and ``{`` outside strings."""
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else bytes(text)
    structure = _STRING.sub(b"", _ESCAPE.sub(b"", data))
    return 1 + structure.count(b",") + structure.count(b"[") + structure.count(b"{")


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
    max_nodes: int | None = None,
    error: type[InvalidInputError] = InvalidInputError,
) -> Any:
    """``json.loads`` after the depth check (and, with ``max_nodes``, the size check); malformed JSON
    raises ``error(what, ...)`` too."""
    check_json_depth(text, what, limit=limit, error=error)
    if max_nodes is not None and json_nodes(text) > max_nodes:
        raise error(what, f"JSON holds more than {max_nodes} values (the limit is {max_nodes})")
    try:
        return json.loads(text)
    except (ValueError, UnicodeDecodeError) as e:
        raise error(what, f"not valid JSON ({e})") from None


def load_yaml(
    text: str,
    what: str,
    *,
    limit: int = MAX_JSON_DEPTH,
    max_nodes: int = MAX_NODES,
    malformed: type[InvalidInputError] = InvalidInputError,
) -> Any:
    """``yaml.safe_load`` of ``text`` with bounded work (see the module docstring).

    Anchors and aliases, nesting deeper than ``limit`` and more than ``max_nodes`` values raise
    :class:`InvalidInputError` naming ``what``; YAML that does not parse raises ``malformed(what,
    "malformed YAML at line L, column C: ...")``.
    """
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        _check_yaml_events(yaml.parse(text, Loader=loader), what, limit, max_nodes)
        return yaml.load(text, Loader=loader)  # noqa: S506 - a safe loader, checked to be a small tree
    except yaml.YAMLError as e:
        raise malformed(what, _yaml_problem(e)) from None


def _check_yaml_events(events: Any, what: str, limit: int, max_nodes: int) -> None:
    import yaml

    depth = nodes = 0
    for event in events:
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            raise InvalidInputError(what, f"YAML anchors and aliases (&, *) are not accepted ({_at(event)})")
        if isinstance(event, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
            depth -= 1
            continue
        if not isinstance(event, (yaml.ScalarEvent, yaml.SequenceStartEvent, yaml.MappingStartEvent)):
            continue
        nodes += 1
        if nodes > max_nodes:
            raise InvalidInputError(what, f"YAML holds more than {max_nodes} values (the limit is {max_nodes})")
        if not isinstance(event, yaml.ScalarEvent):
            depth += 1
            if depth > limit:
                raise InvalidInputError(what, f"YAML nested more than {limit} levels deep (the limit is {limit})")


def _at(event: Any) -> str:
    mark = getattr(event, "start_mark", None)
    return f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "in the document"


def _yaml_problem(error: Exception) -> str:
    mark = getattr(error, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    problem = getattr(error, "problem", None) or str(error).splitlines()[0]
    return f"malformed YAML{where}: {problem}"
