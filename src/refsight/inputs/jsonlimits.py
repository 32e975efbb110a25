"""Limits on the structured text users send (JSON, YAML), checked before or while it is parsed.

Python's ``json.loads`` recurses once per level of nesting, so ``[[[[...]]]]`` a
thousand levels deep raises ``RecursionError`` (and ``json.dumps`` of such data does
too); and each value it builds costs 50-130 bytes, so 32 MiB of ``[[],[],...]`` parses
into 1.4 GB. :func:`json_shape` measures the nesting and the number of values of JSON
*text* before anything parses it, in one streaming pass at C speed (chunks of 256 KiB, each
rid of its escapes and of every byte but quotes, brackets and commas by bytes methods, then
numpy over what is left: which lie inside strings, the running depth), holding a few
megabytes whatever the text: no per-escape or per-bracket Python object, so a
32 MiB body of ``\\"`` escapes costs what a body of spaces does. :func:`json_depth` and
:func:`json_nodes` are its two halves.

:func:`json_utf8` is the one decoding of JSON *bytes*: UTF-8, or UTF-16/UTF-32 as RFC 7159
(section 8.1) and RFC 4627 detect them (a byte-order mark, else the zero bytes of the first
characters), decoded strictly and returned as UTF-8, so invalid bytes and raw lone
surrogates are refused by name (``json.loads(bytes)`` would pass them as surrogates) and
every later check reads one encoding.

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
from collections.abc import Iterator, Mapping
from typing import Any

from ..errors import InvalidInputError

__all__ = [
    "MAX_JSON_DEPTH", "MAX_NODES", "check_json_depth", "data_depth", "json_depth", "json_nodes", "json_shape", "json_utf8",
    "load_json", "load_yaml",
]

#: Deepest nesting of arrays and objects accepted in any JSON input (bodies, fields, rubrics).
MAX_JSON_DEPTH = 64
#: Most values (scalars, lists, mappings) a YAML document or a JSON rubric may hold.
MAX_NODES = 10_000

#: Bytes scanned at a time: each chunk's working arrays are a few MiB whatever the text.
_CHUNK = 1 << 18
_QUOTE = 0x22
#: Every byte but the ones that shape a JSON text: quotes, brackets, commas (deleted before a chunk is scanned).
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b'"[]{},')
_OPENERS, _CLOSERS, _COMMA = (0x5B, 0x7B), (0x5D, 0x7D), 0x2C
#: Byte-order marks, longest first (UTF-32-LE's begins like UTF-16-LE's).
_BOMS = (
    (b"\xff\xfe\x00\x00", "utf-32-le"), (b"\x00\x00\xfe\xff", "utf-32-be"), (b"\xef\xbb\xbf", "utf-8"),
    (b"\xff\xfe", "utf-16-le"), (b"\xfe\xff", "utf-16-be"),
)


def json_utf8(data: bytes | bytearray | memoryview, what: str, *, error: type[InvalidInputError] = InvalidInputError) -> bytes:
    """JSON ``data`` as strict UTF-8 bytes (``data`` itself when it already is); ``error(what, ...)`` otherwise.

    UTF-8, UTF-16 and UTF-32 (either byte order) are read, with or without a byte-order mark, as
    RFC 7159 section 8.1 allows (the encoding of a mark-less text shows in the zero bytes of its
    first two characters). Bytes that do not decode strictly, raw lone surrogates included, are
    refused naming the encoding and the offset.
    """
    data = bytes(data)
    encoding, start = _json_encoding(data)
    try:
        text = data[start:].decode(encoding) if start or encoding != "utf-8" else None
        if text is None:
            data.decode("utf-8")  # strict: the check only, the bytes are already UTF-8
            return data
    except UnicodeDecodeError as e:
        byte = f"0x{data[start + e.start]:02x} " if start + e.start < len(data) else ""
        raise error(what, f"not valid {encoding.upper()} (byte {byte}at offset {start + e.start}: {e.reason})") from None
    return text.encode("utf-8")


def _json_encoding(data: bytes) -> tuple[str, int]:
    """The encoding of JSON ``data`` and where its text starts (after a byte-order mark)."""
    for mark, encoding in _BOMS:
        if data.startswith(mark):
            return encoding, len(mark)
    head = data[:4]
    if len(head) == 4 and head[:3] == b"\x00\x00\x00":
        return "utf-32-be", 0
    if len(head) == 4 and head[1:] == b"\x00\x00\x00":
        return "utf-32-le", 0
    if len(head) >= 2 and head[0] == 0:
        return "utf-16-be", 0
    if len(head) >= 2 and head[1] == 0:
        return "utf-16-le", 0
    return "utf-8", 0


def _outside_strings(data: bytes | bytearray | memoryview) -> Iterator[Any]:
    """Chunk by chunk, the quotes, brackets and commas of UTF-8 JSON ``data`` that lie outside its strings
    (numpy arrays).

    Each chunk is reduced at C speed first: escaped backslashes (``\\\\``) go, then escaped quotes
    (``\\"``: every backslash left escapes the byte after it), then every byte but ``"[]{},``; what is
    left is usually a few bytes, whose quotes simply alternate. A run of backslashes is never split:
    the pairs at a chunk's end go with it, an odd one is carried to the next. Outside strings a
    valid text holds no backslash, so malformed text is measured as well as it can be up to its
    first fault, where the parser stops too.
    """
    import numpy as np

    data = bytes(data) if isinstance(data, memoryview) else data
    inside, carry = 0, b""
    for start in range(0, len(data), _CHUNK):
        chunk = carry + data[start:start + _CHUNK]
        carry = b""
        if b"\\" in chunk:
            plain = chunk.rstrip(b"\\")
            carry = b"\\" if (len(chunk) - len(plain)) % 2 else b""
            chunk = plain.replace(b"\\\\", b"").replace(b'\\"', b"")
        reduced = chunk.translate(None, _NOT_STRUCTURE)
        if not reduced:
            continue
        codes = np.frombuffer(reduced, dtype=np.uint8)
        # A byte is inside a string when an odd number of quotes come up to it (an opening quote is).
        in_string = ((np.cumsum(codes == _QUOTE, dtype=np.int32) + inside) & 1).astype(bool)
        inside = int(in_string[-1])
        yield codes[~in_string]


def json_shape(
    text: str | bytes | bytearray | memoryview, *, max_depth: int | None = None, max_values: int | None = None
) -> tuple[int, int]:
    """``(depth, values)`` of JSON ``text``: the deepest nesting of ``[``/``{`` and an upper bound on its
    values (one, plus one per ``,``, ``[`` and ``{``), both outside strings, in one bounded-memory pass.

    Malformed JSON is measured as well as it can be (the parser refuses it later). The pass stops
    as soon as the depth exceeds ``max_depth`` or the values ``max_values``: the answer then only
    tells which limit is exceeded.
    """
    import numpy as np

    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    depth = deepest = 0
    values = 1
    for structure in _outside_strings(data):
        opens = (structure == _OPENERS[0]) | (structure == _OPENERS[1])
        closes = (structure == _CLOSERS[0]) | (structure == _CLOSERS[1])
        values += int(np.count_nonzero(opens)) + int(np.count_nonzero(structure == _COMMA))
        brackets = opens[opens | closes]
        if len(brackets):
            running = np.cumsum(np.where(brackets, np.int32(1), np.int32(-1)), dtype=np.int64) + depth
            deepest = max(deepest, int(running.max()))
            depth = int(running[-1])
        if (max_depth is not None and deepest > max_depth) or (max_values is not None and values > max_values):
            break
    return deepest, values


def json_depth(text: str | bytes | bytearray | memoryview, *, stop_above: int | None = None) -> int:
    """The deepest nesting of ``[``/``{`` in JSON ``text``, ignoring brackets inside strings.

    Malformed JSON is measured as well as it can be (the parser will refuse it later).
    With ``stop_above`` the answer only tells whether the depth exceeds it (counting stops early).
    """
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    if isinstance(data, (bytes, bytearray)) and b"[" not in data and b"{" not in data:
        return 0  # the common flat text: one C search, no pass
    return json_shape(data, max_depth=stop_above)[0]


def json_nodes(text: str | bytes | bytearray | memoryview) -> int:
    """An upper bound on the values in JSON ``text``: one, plus one per ``,``, ``[`` and ``{`` outside strings."""
    return json_shape(text)[1]


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
    """``json.loads`` after the depth check (and, with ``max_nodes``, the size check); bytes are decoded
    by :func:`json_utf8` first; malformed JSON raises ``error(what, ...)`` too."""
    if not isinstance(text, str):
        text = json_utf8(text, what, error=error)
    depth, values = json_shape(text, max_depth=limit, max_values=max_nodes)
    if depth > limit:
        raise error(what, f"JSON nested more than {limit} levels deep (the limit is {limit})")
    if max_nodes is not None and values > max_nodes:
        raise error(what, f"JSON holds more than {max_nodes} values (the limit is {max_nodes})")
    try:
        return json.loads(text)
    except ValueError as e:
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
