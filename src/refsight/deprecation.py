"""Earlier names of public keywords, still taken: one way to accept them, warn, and refuse a clash.

The glossary in ``docs/architecture.md`` lists each idea's one word and the words it retired;
a retired word stays accepted where callers may still write it (a keyword, a config key, a
flag), through :func:`renamed`, which warns with ``DeprecationWarning`` naming the new word.
"""

from __future__ import annotations

import warnings
from typing import Any

from .errors import InvalidInputError

__all__ = ["renamed", "warn_renamed"]


def warn_renamed(old: str, new: str, *, where: str, stacklevel: int = 3) -> None:
    """Warn that ``old`` (in ``where``) is deprecated in favour of ``new``."""
    warnings.warn(f"{where}: {old} is deprecated; use {new}", DeprecationWarning, stacklevel=stacklevel)


def renamed(old: str, old_value: Any, new: str, new_value: Any, *, where: str, default: Any = None) -> Any:
    """The value meant for keyword ``new``: ``new_value``, or ``old_value`` given under the earlier name
    ``old`` (None: not given), with a ``DeprecationWarning``. ``old`` given while ``new`` is not at its
    ``default`` is an :class:`~refsight.errors.InvalidInputError` naming ``old``: one of them, not both."""
    if old_value is None:
        return new_value
    if new_value != default:
        raise InvalidInputError(old, f"is the deprecated name of {new}: give one of them, not both")
    warn_renamed(old, new, where=where, stacklevel=4)
    return old_value
