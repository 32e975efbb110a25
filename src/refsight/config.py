"""Retired module name: the ``REFSIGHT_*`` defaults live in :mod:`refsight.environment`.

``refsight.config`` read as "the config file" (that is :mod:`refsight.settings`) and as the
server's options (:class:`refsight.server.ServerConfig`); its names are still served from here,
each with a ``DeprecationWarning`` naming the new module.
"""

from __future__ import annotations

from typing import Any

from . import environment as _environment
from .deprecation import warn_renamed

__all__: list[str] = []


def __getattr__(name: str) -> Any:
    """``refsight.config.NAME``: ``refsight.environment.NAME``, with a warning."""
    value = getattr(_environment, name)  # AttributeError for a name that never existed
    warn_renamed(f"refsight.config.{name}", f"refsight.environment.{name}", where="refsight.config")
    return value
