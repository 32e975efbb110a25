"""Model name → backend factory, loaded lazily.

Built-ins register exactly like plugins: a name and a ``"module:attr"`` string
(their table is :data:`refsight.backends.builtin.BUILTINS`), imported only when that
model is first asked for (so listing models imports no torch). Third-party packages add backends through the entry-point group
``refsight.backends``, whose entry name is the model name and whose value is a
factory ``factory(name, **options) -> Backend``.

Any name of the form ``hf:<hub id or local directory>`` loads a real Hugging Face
model through :mod:`refsight.backends.hf`; ``llamacpp:<model.gguf>`` (option
``mmproj=<mmproj.gguf>``) a GGUF model through :mod:`refsight.backends.llamacpp`;
``vllm:http://HOST:PORT`` generates on a vLLM server through :mod:`refsight.backends.vllm`.
"""

from __future__ import annotations

import threading
from importlib.metadata import entry_points
from typing import Any, Callable

from ..errors import BackendError, InvalidInputError, ModelLoadError, RefsightError, UnknownModelError
from ..package import canonical_json
from ..support.plugins import find_target, load_factory
from .base import Backend
from .builtin import BUILTINS
from .chat_formats import builtin_format

__all__ = [
    "register_backend", "available_models", "get_backend", "release_backend", "resolve_factory", "HF_PREFIX", "LLAMACPP_PREFIX",
    "VLLM_PREFIX",
]

HF_PREFIX = "hf:"
#: ``llamacpp:<model.gguf>`` (with the option ``mmproj=<mmproj.gguf>``) loads a GGUF VLM through llama.cpp.
LLAMACPP_PREFIX = "llamacpp:"
#: ``vllm:http://HOST:PORT`` generates on a vLLM OpenAI server (refsight encodes).
VLLM_PREFIX = "vllm:"
#: ``ollama:NAME[:TAG]`` serves a model of Ollama's store ($OLLAMA_MODELS) through llama.cpp.
OLLAMA_PREFIX = "ollama:"

#: Name prefixes whose remainder names a model of that runtime (a checkpoint, a GGUF, a server's model, an Ollama tag).
_RUNTIMES: dict[str, str] = {
    HF_PREFIX: "refsight.backends.hf:load_hf_backend",
    LLAMACPP_PREFIX: "refsight.backends.llamacpp:load_llamacpp_backend",
    VLLM_PREFIX: "refsight.backends.vllm.loading:load_vllm_backend",
    OLLAMA_PREFIX: "refsight.backends.llamacpp.ollama_store:load_ollama_backend",
}
_registered: dict[str, str | Callable[..., Backend]] = {}
_instances: dict[tuple[str, str], Backend] = {}
_lock = threading.Lock()


def register_backend(name: str, factory: str | Callable[..., Backend]) -> None:
    """Register ``factory`` (a callable or a ``"module:attr"`` string) under ``name``."""
    _registered[name] = factory
    for key in [k for k in _instances if k[0] == name]:
        _instances.pop(key).close()


def _plugin_entries() -> dict[str, str]:
    return {ep.name: ep.value for ep in entry_points(group="refsight.backends")}


def available_models() -> list[str]:
    """Every registered model name (built-ins, plugins, run-time registrations)."""
    return sorted({*BUILTINS, *_plugin_entries(), *_registered})


def resolve_factory(name: str) -> Callable[..., Backend]:
    """The factory registered for ``name``; raises :class:`UnknownModelError`."""
    target = find_target(name, (_registered, _plugin_entries(), BUILTINS), _RUNTIMES)
    if target is None:
        raise UnknownModelError(name, available_models())
    return load_factory(target, name, BackendError, "backend")


def release_backend(backend: Backend) -> None:
    """Close ``backend`` and forget it, so the next :func:`get_backend` of its name and options builds it afresh."""
    with _lock:
        for key in [key for key, built in _instances.items() if built is backend]:
            del _instances[key]
    backend.close()


def get_backend(name: str, **options: Any) -> Backend:
    """The backend for ``name``, built once per process and set of options."""
    # Options may hold mappings (processor settings): key by their canonical JSON.
    key = (name, canonical_json(options))
    # The chat template is no runtime's load option: every backend takes it after its load, in one place,
    # and a backend with its own template is another instance (the key holds the template).
    template = options.pop("chat_template", None)
    jinja = options.pop("jinja", None)
    with _lock:
        backend = _instances.get(key)
        if backend is None:
            factory = resolve_factory(name)
            try:
                backend = factory(name, **options)
            except RefsightError:
                raise
            except Exception as e:  # runtime errors become ours, here and only here
                raise BackendError(name, f"{type(e).__name__}: {e}") from e
            if template is not None or jinja is False:
                _use_template(backend, template, jinja=jinja is not False)
            else:
                _probe_own_template(name, backend)
            _instances[key] = backend
        return backend


def _use_template(backend: Backend, template: str | None, *, jinja: bool) -> None:
    """``backend`` renders chats in ``template`` from now on (probed first), or without Jinja (llama-server's
    ``--no-jinja``) in llama.cpp's built-in format detected from ``template`` (or the model's own); closed again when
    it cannot."""
    try:
        if not jinja:
            # llama.cpp formats a model without a template of its own as ChatML (llama_chat_apply_template's default)
            source = template if template is not None else backend.chat_template_source() or "chatml"
            try:
                template = builtin_format(source)
            except ValueError as e:
                raise InvalidInputError("jinja", str(e)) from None
            # A built-in format renders no tools: llama-server without Jinja refuses them ("tools param requires
            # --jinja flag"), and so does this backend now.
            backend.supports_tools = False
        backend.use_chat_template(template)
    except BaseException:
        backend.close()
        raise


def _probe_own_template(name: str, backend: Backend) -> None:
    """The model's own chat template (a GGUF's, a checkpoint's), where the backend renders one here, tried as a given
    one is (:meth:`~.text_access.TextAccess.probe_chat_template`): a template that cannot serve is refused at load,
    in one line naming the model, never at the first chat. The backend is closed again then."""
    if backend.chat_template_source() is None:
        return  # no template rendered here (the runtime renders its own, or there is none)
    try:
        backend.probe_chat_template()
    except InvalidInputError as e:
        backend.close()
        raise ModelLoadError(name, f"its own chat template {e.reason}; give it another (the chat_template option, "
                              "--chat-template-file)") from None
    except BaseException:
        backend.close()
        raise
