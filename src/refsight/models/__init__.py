"""Retired package name: the embedders (retrieval models) live in :mod:`refsight.embedders`.

"model" alone is a VLM backend by registry name (the glossary in ``docs/architecture.md``), so the
package of embedders is named for them. ``refsight.models.NAME`` and ``import refsight.models.MODULE``
are still served, each with a ``DeprecationWarning`` naming the new place, and give the very same
objects and modules (one registry, not a copy); ``refsight.models.embedders`` is
``refsight.embedders.base``.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

from .. import embedders as _embedders
from ..deprecation import warn_renamed

__all__: list[str] = []

_OLD = __name__
_NEW = _embedders.__name__
#: Modules that took a new name in the move (the others kept theirs).
_RENAMED_MODULES = {"embedders": "base"}


def _new_name(old: str) -> str:
    """``refsight.models.X.Y`` → ``refsight.embedders.X'.Y``."""
    first, *rest = old[len(_OLD) + 1 :].split(".")
    return ".".join([_NEW, _RENAMED_MODULES.get(first, first), *rest])


def __getattr__(name: str) -> Any:
    """``refsight.models.NAME``: ``refsight.embedders.NAME``, with a warning."""
    new = _RENAMED_MODULES.get(name, name)
    try:
        value = getattr(_embedders, new)
    except AttributeError:  # a name that never existed (or a module not imported yet: the import finds it)
        raise AttributeError(f"module {_OLD!r} has no attribute {name!r}") from None
    # ``from refsight.models import NAME`` asks twice: the import machinery's hasattr, then the name itself;
    # warn once, at the second
    if sys._getframe(1).f_code.co_name != "_handle_fromlist":
        warn_renamed(f"{_OLD}.{name}", f"{_NEW}.{new}", where=_OLD)
    return value


class _RetiredModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``import refsight.models.MODULE``: the module ``refsight.embedders.MODULE`` itself, with a warning."""

    def find_spec(self, fullname: str, path: Any = None, target: ModuleType | None = None) -> ModuleSpec | None:
        if not fullname.startswith(_OLD + "."):
            return None
        new = _new_name(fullname)
        if importlib.util.find_spec(new) is None:
            return None  # a module that never existed: ModuleNotFoundError, as before
        return importlib.util.spec_from_loader(fullname, self, origin=new, is_package=False)

    def create_module(self, spec: ModuleSpec) -> ModuleType:
        module = importlib.import_module(str(spec.origin))
        spec.loader_state = module.__spec__  # the import machinery sets the alias spec on it; exec_module restores it
        warn_renamed(spec.name, str(spec.origin), where=_OLD)
        return module

    def exec_module(self, module: ModuleType) -> None:
        alias = module.__spec__
        if alias is not None and alias.loader is self:
            module.__spec__ = alias.loader_state


if not any(isinstance(finder, _RetiredModules) for finder in sys.meta_path):
    sys.meta_path.insert(0, _RetiredModules())
