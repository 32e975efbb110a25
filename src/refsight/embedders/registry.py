"""Embedder name → embedder, loaded lazily (the embedder counterpart of the backend registry).

Built-ins register exactly like plugins: a name and a ``"module:attr"`` string naming a
factory ``factory(name) -> Embedder``, imported only when that embedder is first asked for,
so importing this module (and listing the names) imports no torch. Names:

* ``conse`` – the default: EfficientNet-Lite0 + MiniLM ConSE, real weights, offline;
* ``clip:PATH`` – a CLIP or SigLIP dual encoder from a local directory (or a cached hub id);
* ``vlm:MODEL`` – last-token pooling over the VLM backend named ``MODEL`` (e.g. ``vlm:tiny-qwen2-vl``).

Third-party packages add embedders through the entry-point group ``refsight.embedders``
(entry name = embedder name, value = ``"module:factory"``); :func:`register_embedder` adds
one at run time. Every construction goes through the one error-translation helper, so a
runtime failure while loading surfaces as :class:`~refsight.errors.ModelLoadError`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import TYPE_CHECKING

from refsight.errors import ModelLoadError, UnknownModelError
from refsight.embedders._errors import embedder_errors
from refsight.support.plugins import find_target, load_factory

if TYPE_CHECKING:  # pragma: no cover
    from refsight.embedders.base import Embedder

__all__ = [
    "DEFAULT_EMBEDDER",
    "available_embedders",
    "default_embedder",
    "get_embedder",
    "register_embedder",
]

#: The embedder refsight uses when none is named.
DEFAULT_EMBEDDER = "conse"

_BUILTINS: dict[str, str] = {
    "conse": "refsight.embedders.conse:load_conse",
}
#: Name prefixes whose remainder is an argument (a path, a model name), with their factories.
_FAMILIES: dict[str, str] = {
    "clip:": "refsight.embedders.clip:load_clip",
    "vlm:": "refsight.embedders.vlm_embedder:load_vlm",
}
_registered: dict[str, str | Callable[[str], Embedder]] = {}
_instances: dict[str, Embedder] = {}
_lock = threading.Lock()


def register_embedder(name: str, factory: str | Callable[[str], Embedder]) -> None:
    """Register ``factory`` (a callable or a ``"module:attr"`` string) under ``name``; replaces a built one."""
    with _lock:
        _registered[name] = factory
        _instances.pop(name, None)


def _plugin_entries() -> dict[str, str]:
    return {ep.name: ep.value for ep in entry_points(group="refsight.embedders")}


def available_embedders() -> list[str]:
    """Every embedder name: built-ins, plugins, run-time registrations, and the ``clip:PATH`` / ``vlm:MODEL`` forms."""
    families = [f"{prefix}{'PATH' if prefix == 'clip:' else 'MODEL'}" for prefix in _FAMILIES]
    return sorted({*_BUILTINS, *_plugin_entries(), *_registered, *families})


def _factory(name: str) -> Callable[[str], Embedder]:
    target = find_target(name, (_registered, _plugin_entries(), _BUILTINS), _FAMILIES)
    if target is None:
        raise UnknownModelError(name, available_embedders())
    return load_factory(target, name, ModelLoadError, "embedder")


def get_embedder(name: str = DEFAULT_EMBEDDER) -> Embedder:
    """The embedder registered under ``name``, built once per process.

    Raises :class:`~refsight.errors.UnknownModelError` for a name nobody registered and
    :class:`~refsight.errors.ModelLoadError` when the model cannot be loaded.
    """
    if not isinstance(name, str) or not name:
        raise UnknownModelError(str(name), available_embedders())
    with _lock:
        embedder = _instances.get(name)
        if embedder is None:
            factory = _factory(name)
            with embedder_errors(name, ModelLoadError, "cannot load embedder"):
                embedder = factory(name)
            _instances[name] = embedder
        return embedder


def default_embedder() -> Embedder:
    """The offline default (:data:`DEFAULT_EMBEDDER`, the ConSE embedder), one per process."""
    return get_embedder(DEFAULT_EMBEDDER)
