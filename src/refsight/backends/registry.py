"""Model name → backend factory, loaded lazily.

Built-ins register exactly like plugins: a name and a ``"module:attr"`` string,
imported only when that model is first asked for (so listing models imports no
torch). Third-party packages add backends through the entry-point group
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

from ..errors import BackendError, RefsightError, UnknownModelError
from ..package import canonical_json
from ..plugins import find_target, load_factory
from .base import Backend
from .tiny_families import FAMILY_SPECS

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

_BUILTINS: dict[str, str] = {
    "toy": "refsight.backends.toy:ToyBackend",
    "tiny-qwen2-vl": "refsight.backends.tiny:load_tiny",
    "tiny-qwen2.5-vl": "refsight.backends.tiny:load_tiny",
    "tiny-qwen3-vl": "refsight.backends.tiny:load_tiny",
    "tiny-smolvlm": "refsight.backends.tiny:load_tiny",
    "shape-qwen2-vl-2b": "refsight.backends.tiny:load_tiny",
    "shape-qwen2-vl-2b-full": "refsight.backends.tiny:load_tiny",
    "shape-smolvlm-256m": "refsight.backends.tiny:load_tiny",
    "shape-gemma3-4b": "refsight.backends.tiny:load_tiny",
    "shape-qwen3.5-0.8b": "refsight.backends.tiny:load_tiny",
    # llama.cpp (GGUF) built-ins: need the ``llamacpp`` extra
    "tiny-qwen2-vl-gguf": "refsight.backends.llamacpp:load_builtin",
    "tiny-qwen2.5-vl-gguf": "refsight.backends.llamacpp:load_builtin",
    "tiny-smolvlm-gguf": "refsight.backends.llamacpp:load_builtin",
    "shape-qwen2-vl-2b-gguf": "refsight.backends.llamacpp:load_builtin",
    "tiny-qwen3-vl-gguf": "refsight.backends.llamacpp:load_builtin",
    # more families, from the transformers tiny-family recipes (see backends/llamacpp/families.py)
    "tiny-gemma3-gguf": "refsight.backends.llamacpp:load_builtin",
    "tiny-internvl-gguf": "refsight.backends.llamacpp:load_builtin",
    "tiny-mistral3-gguf": "refsight.backends.llamacpp:load_builtin",
    "tiny-lfm2-vl-gguf": "refsight.backends.llamacpp:load_builtin",
    "tiny-llama4-gguf": "refsight.backends.llamacpp:load_builtin",
    "tiny-glm4v-gguf": "refsight.backends.llamacpp:load_builtin",
    "tiny-minicpmv4-6-gguf": "refsight.backends.llamacpp:load_builtin",
    "tiny-qwen3.5-gguf": "refsight.backends.llamacpp:load_builtin",
    "tiny-qwen3.5-moe-gguf": "refsight.backends.llamacpp:load_builtin",
    "tiny-gemma4-gguf": "refsight.backends.llamacpp:load_builtin",
    # quantized GGUFs (llama.cpp's quantizer over an f16 base; see backends/llamacpp/quantized.py)
    "tiny-qwen2-vl-gguf-q8": "refsight.backends.llamacpp.quantized:load_quantized",
    "tiny-qwen2-vl-gguf-q4": "refsight.backends.llamacpp.quantized:load_quantized",
    "tiny-qwen2-vl-256-gguf-q4": "refsight.backends.llamacpp.quantized:load_quantized",
    "tiny-gemma3-gguf-q4": "refsight.backends.llamacpp.quantized:load_quantized",
    "shape-qwen2-vl-2b-gguf-q8": "refsight.backends.llamacpp.quantized:load_quantized",
    "shape-qwen2-vl-2b-gguf-q4": "refsight.backends.llamacpp.quantized:load_quantized",
    "shape-qwen2-vl-2b-full-gguf-q4": "refsight.backends.llamacpp.quantized:load_quantized",
    "shape-gemma3-4b-gguf-q4": "refsight.backends.llamacpp.quantized:load_quantized",
    "tiny-qwen2-vl-vllm": "refsight.backends.vllm.tiny:load_tiny_vllm",
    "tiny-qwen2.5-vl-vllm": "refsight.backends.vllm.tiny:load_tiny_vllm",
    "tiny-qwen3-vl-vllm": "refsight.backends.vllm.tiny:load_tiny_vllm",
    "shape-qwen2-vl-2b-vllm": "refsight.backends.vllm.tiny:load_tiny_vllm",
    "tiny-gemma3-vllm": "refsight.backends.vllm.families:load_family_vllm",
    "tiny-llava-vllm": "refsight.backends.vllm.families:load_family_vllm",
    "tiny-internvl-vllm": "refsight.backends.vllm.families:load_family_vllm",
    "tiny-mistral3-vllm": "refsight.backends.vllm.families:load_family_vllm",
    "tiny-smolvlm-vllm": "refsight.backends.vllm.families:load_family_vllm",
    "tiny-qwen3.5-vllm": "refsight.backends.vllm.families:load_family_vllm",
    "tiny-qwen3.5-moe-vllm": "refsight.backends.vllm.families:load_family_vllm",
    "tiny-llava-next-vllm": "refsight.backends.vllm.families:load_family_vllm",
    "tiny-llava-onevision-vllm": "refsight.backends.vllm.families:load_family_vllm",
    "tiny-minicpmv4-6-vllm": "refsight.backends.vllm.families:load_family_vllm",
    "tiny-qwen3-vl-moe-vllm": "refsight.backends.vllm.families:load_family_vllm",
    "tiny-glm4v-vllm": "refsight.backends.vllm.families:load_family_vllm",
    "tiny-glm4v-moe-vllm": "refsight.backends.vllm.families:load_family_vllm",
    "tiny-paddleocr-vl-vllm": "refsight.backends.vllm.families:load_family_vllm",
    "tiny-exaone4-5-vllm": "refsight.backends.vllm.families:load_family_vllm",
    "tiny-idefics3-vllm": "refsight.backends.vllm.families:load_family_vllm",
    "tiny-gemma4-vllm": "refsight.backends.vllm.families:load_family_vllm",
}
# The tiny checkpoints of the families the generic transformers backend serves (tiny_families.py).
_BUILTINS.update({name: "refsight.backends.tiny:load_tiny" for name in FAMILY_SPECS})
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
    return sorted({*_BUILTINS, *_plugin_entries(), *_registered})


def resolve_factory(name: str) -> Callable[..., Backend]:
    """The factory registered for ``name``; raises :class:`UnknownModelError`."""
    target = find_target(name, (_registered, _plugin_entries(), _BUILTINS), _RUNTIMES)
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
            _instances[key] = backend
        return backend
