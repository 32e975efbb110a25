"""The built-in models as backends: a registry name resolved to the folder it is built into, then loaded.

The backends' one seam into :mod:`refsight.builtin_models` (the offline builders of the
``tiny-*`` and ``shape-*`` checkpoints, their GGUFs and vLLM variants): :data:`BUILTINS` is
the registry's table of built-in names, each factory here builds its model once into the
model cache (``builtin_models`` does that, knowing nothing of the backends) and hands the
folder to the runtime's own loader, the same path a user's checkpoint or GGUF takes.
:func:`vllm_model_folder` is the same resolution for ``refsight vllm-serve --model NAME``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Collection

from ..builtin_models.family_checkpoints import FAMILY_SPECS
from ..errors import InvalidInputError, UnknownModelError
from .base import Backend

__all__ = [
    "BUILTINS", "load_tiny", "load_gguf", "load_quantized", "load_tiny_vllm", "load_family_vllm", "vllm_model_folder",
    "vllm_model_names",
]


def _factories(factory: str, *names: str) -> dict[str, str]:
    return {name: f"refsight.backends.builtin:{factory}" for name in names}


#: Built-in model name → its registry factory (``"module:attr"``, imported when that model is first asked for).
BUILTINS: dict[str, str] = {
    "toy": "refsight.backends.toy:ToyBackend",
    **_factories(
        "load_tiny", "tiny-qwen2-vl", "tiny-qwen2.5-vl", "tiny-qwen3-vl", "tiny-smolvlm", "shape-qwen2-vl-2b",
        "shape-qwen2-vl-2b-full", "shape-smolvlm-256m", "shape-gemma3-4b", "shape-qwen3.5-0.8b",
        # the tiny checkpoints of the families the generic transformers backend serves
        *FAMILY_SPECS,
    ),
    # llama.cpp (GGUF) built-ins: need the ``llamacpp`` extra; the families' from the transformers
    # tiny-family recipes (builtin_models/gguf_families.py)
    **_factories(
        "load_gguf", "tiny-qwen2-vl-gguf", "tiny-qwen2.5-vl-gguf", "tiny-smolvlm-gguf", "shape-qwen2-vl-2b-gguf",
        "tiny-qwen3-vl-gguf", "tiny-gemma3-gguf", "tiny-internvl-gguf", "tiny-mistral3-gguf", "tiny-lfm2-vl-gguf",
        "tiny-llama4-gguf", "tiny-glm4v-gguf", "tiny-minicpmv4-6-gguf", "tiny-qwen3.5-gguf", "tiny-qwen3.5-moe-gguf",
        "tiny-gemma4-gguf",
    ),
    # quantized GGUFs (llama.cpp's quantizer over an f16 base; builtin_models/gguf_quantized.py)
    **_factories(
        "load_quantized", "tiny-qwen2-vl-gguf-q8", "tiny-qwen2-vl-gguf-q4", "tiny-qwen2-vl-256-gguf-q4",
        "tiny-gemma3-gguf-q4", "shape-qwen2-vl-2b-gguf-q8", "shape-qwen2-vl-2b-gguf-q4", "shape-qwen2-vl-2b-full-gguf-q4",
        "shape-gemma3-4b-gguf-q4", "shape-qwen3.5-0.8b-gguf-q4",
    ),
    **_factories("load_tiny_vllm", "tiny-qwen2-vl-vllm", "tiny-qwen2.5-vl-vllm", "tiny-qwen3-vl-vllm", "shape-qwen2-vl-2b-vllm"),
    **_factories(
        "load_family_vllm", "tiny-gemma3-vllm", "tiny-llava-vllm", "tiny-internvl-vllm", "tiny-mistral3-vllm",
        "tiny-smolvlm-vllm", "tiny-qwen3.5-vllm", "tiny-qwen3.5-moe-vllm", "tiny-llava-next-vllm",
        "tiny-llava-onevision-vllm", "tiny-minicpmv4-6-vllm", "tiny-qwen3-vl-moe-vllm", "tiny-glm4v-vllm",
        "tiny-glm4v-moe-vllm", "tiny-paddleocr-vl-vllm", "tiny-exaone4-5-vllm", "tiny-idefics3-vllm", "tiny-gemma4-vllm",
    ),
}


def load_tiny(name: str, **options: Any) -> Backend:
    """The registry factory for ``tiny-*`` and ``shape-*``: build once, then ``from_pretrained``.

    ``options`` are those of :func:`refsight.backends.hf.load_hf_backend` (every
    :class:`~refsight.backends.options.BackendOptions` field but ``revision``, ``mmproj``
    and ``encoder``, which are refused by name, plus ``tile_size`` ...).
    """
    from ..builtin_models.checkpoints import ensure_model_dir

    return _load_hf(name, ensure_model_dir, options)


def load_tiny_vllm(name: str, **options: Any) -> Backend:
    """Registry factory: the tiny vLLM Qwen variant as a plain refsight HF backend (its encoder)."""
    from ..builtin_models.vllm_qwen import ensure_vllm_model_dir

    return _load_hf(name, ensure_vllm_model_dir, options)


def load_family_vllm(name: str, **options: Any) -> Backend:
    """Registry factory: the tiny vLLM family model as a plain refsight HF backend (its encoder side)."""
    from ..builtin_models.vllm_families import ensure_family_dir

    return _load_hf(name, ensure_family_dir, options)


def _load_hf(name: str, ensure: Callable[[str], Path], options: dict[str, Any]) -> Backend:
    """A built-in checkpoint that ``ensure(name)`` builds offline once, loaded as a refsight HF backend."""
    from .hf import load_hf_backend
    from .hf.loading import refuse_other_backend_options

    # Refuse before the (possibly long) first build.
    refuse_other_backend_options(options)
    if options.get("revision") is not None:
        raise InvalidInputError("revision", f"{name} is built locally and has no hub revision (its files are hashed)")
    directory = ensure(name)
    options.setdefault("model_id", f"refsight/{name}")
    return load_hf_backend(name, source=str(directory), random_weights=True, **options)


def load_gguf(name: str, **options: Any) -> Backend:
    """The registry factory for the built-in ``*-gguf`` models: build once (:mod:`refsight.builtin_models.gguf`), then load."""
    from ..builtin_models.gguf import ensure_gguf

    return _load_llamacpp(name, ensure_gguf, options)


def load_quantized(name: str, **options: Any) -> Backend:
    """The registry factory of the quantized built-ins: build once (base, then quantize), then load."""
    from ..builtin_models.gguf_quantized import QUANTIZED_GGUF_MODELS, ensure_quantized_gguf

    return _load_llamacpp(name, ensure_quantized_gguf, options, known=QUANTIZED_GGUF_MODELS)


def _load_llamacpp(name: str, ensure: Callable[[str], tuple[Path, Path]], options: dict[str, Any], *,
                   known: Collection[str] | None = None) -> Backend:
    """A built-in GGUF pair that ``ensure(name)`` builds offline once, loaded as a refsight llama.cpp backend."""
    from .llamacpp import _require_runtime, _settings, load_llamacpp_backend

    if options.get("mmproj") is not None:
        raise InvalidInputError("mmproj", f"{name} is a built-in model with its own mmproj")
    if known is not None and name not in known:
        raise UnknownModelError(name, list(known))
    _settings(options)  # refuse bad options before a possibly long build
    _require_runtime(name)
    model_path, mmproj_path = ensure(name)
    return load_llamacpp_backend(name, source=str(model_path), **{**options, "mmproj": str(mmproj_path)})


def vllm_model_names() -> list[str]:
    """The built-in models ``refsight vllm-serve`` serves by name."""
    from ..builtin_models import vllm_families, vllm_qwen

    return [*vllm_qwen.VLLM_TINY_MODELS, *vllm_families.VLLM_FAMILY_SPECS, *vllm_families.VLLM_FAMILY_MODELS]


def vllm_model_folder(name: str) -> Path | None:
    """The folder of the built-in vLLM model ``name``, built on first use; None when ``name`` is none."""
    from ..builtin_models import vllm_families, vllm_qwen

    if name in vllm_qwen.VLLM_TINY_MODELS:
        return vllm_qwen.ensure_vllm_model_dir(name)
    if name in vllm_families.VLLM_FAMILY_SPECS or name in vllm_families.VLLM_FAMILY_MODELS:
        return vllm_families.ensure_family_dir(name)
    return None
