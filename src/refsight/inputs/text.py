"""Text that enters refsight must be valid Unicode: one check for every front door.

A Python ``str`` can hold lone surrogates (``"\\ud800"``): JSON's ``\\uXXXX`` escapes
decode to them, and ``sys.argv`` carries undecodable bytes as them (surrogateescape).
Such a string stores fine but cannot be encoded as UTF-8, so every later read that
encodes it (a JSON response, a terminal, PostgreSQL) fails. :func:`check_text` refuses
it at intake, naming the input; :func:`printable_text` is for reads that must never
fail on a value that somehow got in (the bad code points become U+FFFD).
"""

from __future__ import annotations

import re
from typing import Any

from ..errors import InvalidInputError

__all__ = ["check_text", "check_texts", "is_valid_text", "printable_text"]

_SURROGATE = re.compile("[\ud800-\udfff]")


def is_valid_text(value: str) -> bool:
    """True when ``value`` encodes as UTF-8 (no lone surrogates)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_text(value: str, name: str) -> str:
    """Return ``value``; raise :class:`InvalidInputError` naming ``name`` when it is not valid Unicode."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InvalidInputError(
            name, f"is not valid Unicode text (a lone surrogate U+{ord(value[e.start]):04X} at character {e.start})"
        ) from None
    return value


def check_texts(value: Any, name: str) -> Any:
    """:func:`check_text` over every string in nested JSON-like data (keys included); returns ``value``.

    Walks iteratively (no recursion limit to hit); names the first bad string by its path
    (``metadata.colour``, ``criteria[2].text``).
    """
    stack: list[tuple[Any, str]] = [(value, name)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, str):
            check_text(item, where)
        elif isinstance(item, dict):
            for key, child in item.items():
                if isinstance(key, str):
                    check_text(key, f"{where} key {key!r}")
                stack.append((child, f"{where}.{key}"))
        elif isinstance(item, (list, tuple)):
            stack.extend((child, f"{where}[{i}]") for i, child in enumerate(item))
    return value


def printable_text(value: str) -> str:
    """``value`` with any lone surrogate replaced by U+FFFD (for reads that must not fail)."""
    if is_valid_text(value):
        return value
    return _SURROGATE.sub("\ufffd", value)
