"""llama.cpp backend: GGUF VLMs (language model + mmproj) through llama-cpp-python's mtmd bindings.

``--model llamacpp:/models/qwen2-vl-2b.gguf --mmproj /models/mmproj-qwen2-vl-2b.gguf``
(or ``get_backend("llamacpp:M.gguf", mmproj="P.gguf")``). Built-in offline models
with random weights: ``tiny-qwen2-vl-gguf``, ``tiny-qwen2.5-vl-gguf``,
``tiny-smolvlm-gguf``, ``tiny-qwen3-vl-gguf``, the families of :mod:`refsight.builtin_models.gguf_families`
(``tiny-gemma3-gguf``, ``tiny-internvl-gguf``, ...) and the real-shape
``shape-qwen2-vl-2b-gguf``, built on first use (:mod:`refsight.builtin_models.gguf`, loaded
through :mod:`refsight.backends.builtin`). Needs ``pip install 'refsight[llamacpp]'``
(llama-cpp-python, pinned: the signature of ``mtmd_helper_decode_image_chunk``
changes between releases).

Modules: :mod:`.native` (the only code calling llama.cpp; :mod:`.logs` its process-wide
set-up, :mod:`.sampler` its sampler chain), :mod:`.package_format`
(the package and its fingerprint), :mod:`.prompt` (chat template),
:mod:`.generation` (prompt evaluation and decoding), :mod:`.prefix` (the reference prefix's saved sequence state), :mod:`.grammar` (the
check every grammar passes, and JSON schema → GBNF), :mod:`.grammar_stacks` (the grammar's stacks followed while
sampling), :mod:`.backend` (the :class:`~refsight.backends.base.Backend`).
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from ...errors import InvalidInputError, ModelLoadError
from ...support.extras import install_command
from ..options import FLASH_ATTN

log = logging.getLogger(__name__)

__all__ = ["LLAMACPP_PREFIX", "load_llamacpp_backend", "SUPPORTED_OPTIONS"]

LLAMACPP_PREFIX = "llamacpp:"
MARKER_FILE = "refsight_model.json"
#: The name every built-in GGUF's language model has in its model-cache folder (builtin_models.gguf_converter).
BUILT_MODEL_FILE = "model.gguf"

#: Options the factory takes; any other option is refused by name.
SUPPORTED_OPTIONS = (
    "mmproj", "device", "dtype", "batch_size", "processor_kwargs", "n_ctx", "n_threads",
    "image_min_tokens", "image_max_tokens", "parallel", "flash_attn", "n_ctx_over_trained",
)
#: llama.cpp's own bound on the sequences of one context (``LLAMA_MAX_SEQ``).
MAX_PARALLEL = 256
#: mtmd's image settings, also accepted inside ``processor_kwargs`` (the CLI's ``--processor KEY=VALUE``).
MTMD_SETTINGS = ("image_min_tokens", "image_max_tokens")


def _require_runtime(name: str) -> None:
    try:
        import llama_cpp
        import llama_cpp.mtmd_cpp  # noqa: F401
    except ImportError as e:
        raise ModelLoadError(name, f"llama-cpp-python is not installed: {install_command('llamacpp')} ({e})") from e
    from ...support.extras import LLAMA_CPP_PYTHON_VERSION
    from .native import llama_cpp_version

    if llama_cpp_version() != LLAMA_CPP_PYTHON_VERSION:
        raise ModelLoadError(
            name,
            f"llama-cpp-python {llama_cpp_version()} is installed; refsight needs exactly {LLAMA_CPP_PYTHON_VERSION} "
            "(its mtmd helper signatures change between releases)",
        )


def _existing_file(name: str, what: str, path: Any) -> Path:
    if not isinstance(path, (str, os.PathLike)) or not str(path):
        raise ModelLoadError(name, f"no {what} given")
    p = Path(path).expanduser()
    if not p.exists():
        raise ModelLoadError(name, f"no such {what}: {p}")
    if not p.is_file():
        raise ModelLoadError(name, f"{what} {p} is not a file")
    return p.resolve()


def _int_option(options: dict[str, Any], key: str, default: int, minimum: int) -> int:
    value = options.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidInputError(key, f"must be an integer >= {minimum}, got {value!r}")
    return value


def _settings(options: dict[str, Any]):
    from .native import RuntimeSettings

    options = _merged_options(options)
    device = options.get("device") or "cpu"
    if device not in ("auto", "cpu", "gpu", "cuda", "mps") and not str(device).startswith("cuda:"):
        raise InvalidInputError("device", f"the llama.cpp backend runs on cpu, cuda or mps, not {device!r}")
    # The GGUF fixes the weights' types and mtmd hands out float32 features: no dtype to choose.
    if options.get("dtype") not in (None, "auto", "float32"):
        raise InvalidInputError("dtype", "the llama.cpp backend takes the weight types of the GGUF files; quantise those instead")
    _int_option(options, "batch_size", 1, 1)  # images are encoded one at a time whatever the batch size
    parallel = _int_option(options, "parallel", 1, 1)
    if parallel > MAX_PARALLEL:
        raise InvalidInputError("parallel", f"llama.cpp decodes at most {MAX_PARALLEL} sequences together, got {parallel}")
    flash_attn = _flash_attn(options.get("flash_attn"), parallel)
    return RuntimeSettings(
        n_ctx=_int_option(options, "n_ctx", None, 256),  # None: 4096, or the trained context if smaller
        n_threads=_int_option(options, "n_threads", 0, 0),
        image_min_tokens=_int_option(options, "image_min_tokens", -1, -1),
        image_max_tokens=_int_option(options, "image_max_tokens", -1, -1),
        use_gpu=_use_gpu(device),
        n_seq=parallel,
        flash_attn=flash_attn,
    )


def _merged_options(options: dict[str, Any]) -> dict[str, Any]:
    """``options`` checked against :data:`SUPPORTED_OPTIONS`, with mtmd's image settings given inside
    ``processor_kwargs`` merged in (the same setting given both ways must agree)."""
    unknown = sorted(set(options) - set(SUPPORTED_OPTIONS))
    if unknown:
        raise InvalidInputError(
            unknown, f"option(s) not supported by the llama.cpp backend; accepted: {', '.join(SUPPORTED_OPTIONS)}"
        )
    extra = dict(options.get("processor_kwargs") or {})
    bad = sorted(set(extra) - set(MTMD_SETTINGS))
    if bad:
        raise InvalidInputError(bad, f"llama.cpp's image settings are {', '.join(MTMD_SETTINGS)}")
    for key in MTMD_SETTINGS:
        if key in extra and options.get(key) is not None and options[key] != extra[key]:
            raise InvalidInputError(key, "given twice with different values")
    return {**options, **extra}


def _flash_attn(flash_attn: Any, parallel: int) -> str:
    """The flash-attention setting: as given, else off with parallel slots and llama.cpp's choice without."""
    # With parallel slots flash attention is off unless asked for: llama.cpp's CPU flash attention
    # splits a lone sequence's keys across threads and merges the parts, another summation order
    # than a step of several sequences takes, so an answer would depend on what decodes beside it.
    if flash_attn is None:
        flash_attn = "off" if parallel > 1 else "auto"
    if flash_attn not in FLASH_ATTN:
        raise InvalidInputError("flash_attn", f"one of {', '.join(FLASH_ATTN)}, not {flash_attn!r}")
    return flash_attn


def _use_gpu(device: str) -> bool:
    if device == "cpu":
        return False
    if device == "auto":
        try:
            import llama_cpp

            return bool(llama_cpp.llama_supports_gpu_offload())
        except ImportError:
            return False
    return True


def _read_marker(directory: Path) -> dict[str, Any]:
    try:
        return json.loads((directory / MARKER_FILE).read_text())
    except (OSError, ValueError):
        return {}


def _marker(model_path: Path) -> dict[str, Any]:
    """The ``refsight_model.json`` of the GGUF refsight built whose bytes ``model_path`` holds (random weights),
    or {} for a GGUF refsight did not build.

    Beside the file where it was built; else, for a copy (another folder, another name), the marker of the
    built GGUF in the model cache with the same bytes: the weights, not the path, say what the model is, so
    a built-in given by path reports random weights and has the package key it has by name. Only built GGUFs
    of the copy's exact size are hashed (their hashes are memoised), so a foreign GGUF costs a directory listing.
    """
    beside = _read_marker(model_path.parent)
    if beside:
        return beside
    from ...support.environment import model_cache_dir
    from .package_format import file_sha256

    size = model_path.stat().st_size
    same_size = [built for built in sorted(model_cache_dir().glob(f"*/{BUILT_MODEL_FILE}"))
                 if built.is_file() and built.stat().st_size == size and (built.parent / MARKER_FILE).is_file()]
    if not same_size:
        return {}
    digest = file_sha256(model_path)
    for built in same_size:
        if file_sha256(built) == digest:
            return _read_marker(built.parent)
    return {}


def load_llamacpp_backend(name: str, *, source: str | None = None, model_id: str | None = None,
                          random_weights: bool | None = None, **options: Any):
    """The registry factory for ``llamacpp:<model.gguf>``; ``mmproj=<mmproj.gguf>`` is required.

    Options (the :class:`~refsight.backends.options.BackendOptions` names where they
    exist): ``mmproj``, ``device`` (cpu, auto, cuda[:N], mps), ``batch_size``,
    ``image_min_tokens`` / ``image_max_tokens`` (mtmd's limits; they change the
    chunks and so the keys; also accepted in ``processor_kwargs``), ``n_ctx``,
    ``n_threads``, ``parallel`` (requests decoded together, each its own sequence of
    ``n_ctx`` positions: llama-server's ``-np``; default 1, one at a time), ``flash_attn``
    ("auto", "on" or "off": llama-server's ``-fa``; default "auto", and "off" with parallel slots),
    ``n_ctx_over_trained`` ("refuse", the default, or "cap": an ``n_ctx`` above the trained context is capped at it
    with a warning, as llama-server's ``-c``);
    ``dtype`` only as "auto"/"float32" (the GGUF fixes the weights).
    Anything else (``attn``, ``min_pixels``, ``revision`` ...) raises
    :class:`InvalidInputError` naming it. Missing or mismatched files raise
    :class:`ModelLoadError`.
    """
    settings = _settings(options)
    if source is None:
        source = name[len(LLAMACPP_PREFIX):] if name.startswith(LLAMACPP_PREFIX) else name
    model_path = _existing_file(name, "model GGUF", source)
    if options.get("mmproj") is None:
        raise ModelLoadError(
            name, "a llama.cpp VLM needs its vision projector: give mmproj=PATH.gguf (CLI: --mmproj PATH.gguf)"
        )
    mmproj_path = _existing_file(name, "mmproj GGUF", options["mmproj"])
    _require_runtime(name)
    marker = _marker(model_path)
    if random_weights is None:
        # A GGUF refsight built (its outputs must say so wherever it is loaded from).
        random_weights = bool(marker.get("random_weights", False))
    model_id = model_id or marker.get("model_id")
    from .backend import LlamaCppBackend
    from .native import ContextTooLarge, NativeError

    def load(settings):
        return LlamaCppBackend(name, model_path=model_path, mmproj_path=mmproj_path, settings=settings,
                               model_id=model_id, random_weights=random_weights)

    try:
        try:
            return load(settings)
        except ContextTooLarge as e:
            if options.get("n_ctx_over_trained") != "cap":
                raise InvalidInputError("n_ctx", f"{e}; give at most {e.trained} (refsight serve -c / --ctx-size, "
                                        "--max-model-len; with --parallel, -c is shared by the slots)") from None
            # llama-server's words (server-context.cpp): it keeps the larger KV cache and caps each slot at the trained
            # context; a slot here is a sequence of its own, so its cache is the trained size. Refused before any KV
            # cache existed, the load is done again (the weights are mapped, not read).
            log.warning("the slot context (%d) exceeds the training context of the model (%d) - capping",
                        e.n_ctx, e.trained)
            return load(replace(settings, n_ctx=e.trained))
    except NativeError as e:
        raise ModelLoadError(name, str(e)) from e
