"""Runtimes the suite is meant to prove, and what a test does when one is missing.

Locally, a test whose runtime cannot be set up here (no vLLM env, no PostgreSQL or Redis
binary, llama-cpp-python or psycopg not installed ...) skips, saying what is missing: a
developer without PostgreSQL can still run the rest. In **strict mode** the same test FAILS,
naming what is missing: CI exists to prove those runtimes, and a green run that silently
skipped one would prove nothing. Strict mode is on when ``CI`` is ``true`` (``.ci/run`` sets it;
most CI services set it themselves), ``1`` or ``yes``.

Every skip of a runtime goes through :func:`require_runtime` (or :func:`require_module` for an
import); ``tests/test_architecture_hygiene.py`` refuses ``pytest.importorskip`` and unlisted
``pytest.skip`` calls anywhere else. Skips that are not about a runtime (a platform without
SIGKILL, root ignoring directory permissions) stay ordinary skips.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import NoReturn

import pytest

__all__ = ["STRICT_VALUES", "require_module", "require_runtime", "strict_mode"]

#: Values of ``$CI`` that turn a missing runtime into a failure.
STRICT_VALUES = frozenset({"1", "true", "yes"})


def strict_mode() -> bool:
    """True when ``$CI`` asks for strict mode (a missing runtime fails instead of skipping)."""
    return os.environ.get("CI", "").strip().lower() in STRICT_VALUES


def require_runtime(what: str, why: str) -> NoReturn:
    """The calling test (or module, or fixture) cannot run: ``what`` is missing because ``why``.

    Skips locally; fails in strict mode, so CI cannot be green while ``what`` went untested.
    """
    message = f"{what} is missing: {why}"
    if strict_mode():
        pytest.fail(f"{message} (CI=true: the suite must prove {what}, so this is a failure, not a skip)",
                    pytrace=False)
    pytest.skip(message, allow_module_level=True)


def require_module(name: str, install: str | None = None) -> ModuleType:
    """``import name`` and return it, or :func:`require_runtime` naming it (and how to ``install`` it)."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        hint = f"; {install}" if install else ""
        require_runtime(f"the Python module {name}", f"cannot import it ({exc}){hint}")
