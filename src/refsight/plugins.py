"""Factories named as ``"module:attr"`` strings, imported on first use (the model and embedder registries).

A registry stores built-ins and plugins alike as a target string, so listing names imports
nothing; :func:`load_factory` imports one when it is asked for, and an import that fails
becomes the registry's own error naming the model.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable

from .errors import RefsightError

__all__ = ["load_factory"]


def load_factory(target: str | Callable[..., Any], name: str, error: type[RefsightError], what: str) -> Callable[..., Any]:
    """``target`` itself when callable, else the attribute its ``"module:attr"`` names; ``error(name, ...)`` if it cannot be imported."""
    if callable(target):
        return target
    module_name, _, attr = target.partition(":")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as e:
        raise error(name, f"cannot import {what} {target}: {e}") from e
