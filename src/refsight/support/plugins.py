"""The registries' shared parts (models and embedders): names to factories, factories imported on first use.

A registry stores built-ins and plugins alike as a target string, so listing names imports
nothing; :func:`find_target` is the ONE way a name is looked up (exact names first, then a
``prefix:REST`` form such as ``hf:Qwen/...`` or ``clip:PATH``); :func:`load_factory` imports
the target when it is asked for, and an import that fails becomes the registry's own error
naming the model.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from typing import Any, Callable, TypeVar

from ..errors import RefsightError

__all__ = ["find_target", "load_factory"]

Target = TypeVar("Target")


def find_target(name: str, named: Sequence[Mapping[str, Target]], prefixed: Mapping[str, Target]) -> Target | None:
    """What ``name`` is registered as: the first of the ``named`` tables that holds it (run-time
    registrations, plugins, built-ins: the caller's order), else the ``prefixed`` entry whose
    ``"prefix:"`` opens ``name`` with something after it (``hf:MODEL``, ``clip:PATH``); None if neither."""
    for table in named:
        if name in table:
            return table[name]
    prefix, colon, rest = name.partition(":")
    return prefixed.get(prefix + colon) if colon and rest else None


def load_factory(target: str | Callable[..., Any], name: str, error: type[RefsightError], what: str) -> Callable[..., Any]:
    """``target`` itself when callable, else the attribute its ``"module:attr"`` names; ``error(name, ...)`` if it cannot be imported."""
    if callable(target):
        return target
    module_name, _, attr = target.partition(":")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as e:
        raise error(name, f"cannot import {what} {target}: {e}") from e
