"""Quantized built-in GGUFs: a converted built-in's language model through llama.cpp's own quantizer.

People download quantized GGUFs (Q8_0, Q4_K_M) next to an f16 mmproj, so the
built-ins come that way too: the base model (a :data:`~.models.GGUF_MODELS` entry,
converted to f16) is built first, then its language model GGUF is quantized with
``llama_model_quantize`` (the code behind ``llama-quantize``) and the base's mmproj is
linked beside it unchanged (mmproj files are not quantized: the vision tower stays
f16). Tensors whose rows do not fit the type's blocks get llama.cpp's own fallback
type (a tiny model's 64-wide rows are not a multiple of Q4_K's 256: they become
Q5_0), exactly as ``llama-quantize`` does.

The quantization changes the model file, so it changes the backend's fingerprint (the
file's sha256) and with it every package key; ``general.file_type`` in the GGUF names
it (``LlamaRuntime.meta("general.file_type")``: 1 f16, 7 Q8_0, 15 Q4_K_M). Results live in the model cache as
``<name>-<build id>/{model.gguf,mmproj.gguf}``, the build id covering the base's own
build id, the type and llama-cpp-python's version.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from ..errors import InvalidInputError, ModelLoadError, UnknownModelError
from .checkpoints import MARKER_FILE, build_into_cache
from ..support.extras import LLAMA_CPP_PYTHON_VERSION
from .gguf_converter import MMPROJ_FILE, MODEL_FILE
from .gguf import ensure_gguf

__all__ = ["QUANTIZATIONS", "QUANTIZED_GGUF_MODELS", "QuantizedGguf", "ensure_quantized_gguf", "quantize_gguf"]

#: Bump when the recipe below changes, so old cache entries are not reused.
QUANTIZE_VERSION = 1
#: The quantization types offered, by their llama.cpp names, as ``llama_ftype`` values.
QUANTIZATIONS: dict[str, int] = {"Q8_0": 7, "Q4_K_M": 15}  # LLAMA_FTYPE_MOSTLY_Q8_0, LLAMA_FTYPE_MOSTLY_Q4_K_M


@dataclass(frozen=True)
class QuantizedGguf:
    """A quantized built-in: the base built-in it is made from and the quantization type."""

    base: str  # a GGUF_MODELS name, converted to f16 or f32
    quantization: str  # a QUANTIZATIONS key


QUANTIZED_GGUF_MODELS: dict[str, QuantizedGguf] = {
    # The tiny Qwen2-VL converted to f16 (model and mmproj), then quantized: for the equivalence tests.
    "tiny-qwen2-vl-gguf-q8": QuantizedGguf("tiny-qwen2-vl-gguf-f16", "Q8_0"),
    "tiny-qwen2-vl-gguf-q4": QuantizedGguf("tiny-qwen2-vl-gguf-f16", "Q4_K_M"),
    # The tiny Qwen2-VL with 256-wide rows: real K-quant kernels at a test's size (the slots' tests).
    "tiny-qwen2-vl-256-gguf-q4": QuantizedGguf("tiny-qwen2-vl-256-gguf", "Q4_K_M"),
    # Gemma 3 (families.py) in f16, quantized: a second family through the quantizer.
    "tiny-gemma3-gguf-q4": QuantizedGguf("tiny-gemma3-gguf-f16", "Q4_K_M"),
    # Qwen2-VL-2B's vision tower (f16 mmproj) and a one-layer language model: the vs-llama-server benchmark.
    "shape-qwen2-vl-2b-gguf-q8": QuantizedGguf("shape-qwen2-vl-2b-gguf", "Q8_0"),
    "shape-qwen2-vl-2b-gguf-q4": QuantizedGguf("shape-qwen2-vl-2b-gguf", "Q4_K_M"),
    # Qwen2-VL-2B's whole shape, the real 28-layer language model in Q4_K_M (~1 GB): the prefix figure at real depth.
    "shape-qwen2-vl-2b-full-gguf-q4": QuantizedGguf("shape-qwen2-vl-2b-full-gguf", "Q4_K_M"),
    # Gemma 3 4B's whole shape (families.py), the language model in Q4_K_M (~2.5 GB) beside an f16 mmproj
    # of SigLIP-so400m at 896², as llama-server users download it: issue 35's real-shape benchmark.
    "shape-gemma3-4b-gguf-q4": QuantizedGguf("shape-gemma3-4b-gguf-f16", "Q4_K_M"),
    # Qwen3.5-0.8B's whole shape (hybrid: Gated DeltaNet + full attention), Q4_K_M beside an f16 mmproj:
    # issue 50's vs-llama-server model, the hybrid that llama-server's image prefix cache does not keep.
    "shape-qwen3.5-0.8b-gguf-q4": QuantizedGguf("shape-qwen3.5-0.8b-gguf-f16", "Q4_K_M"),
}


def quantize_gguf(source: Path, target: Path, quantization: str, *, threads: int = 0) -> None:
    """Quantize the language model GGUF ``source`` into ``target`` with llama.cpp's quantizer."""
    if quantization not in QUANTIZATIONS:
        raise InvalidInputError("quantization", f"one of {', '.join(QUANTIZATIONS)}, not {quantization!r}")
    import llama_cpp

    llama_cpp.llama_backend_init()
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = QUANTIZATIONS[quantization]
    params.nthread = threads
    rc = llama_cpp.llama_model_quantize(str(source).encode(), str(target).encode(), params)
    if rc != 0 or not target.is_file():
        raise ModelLoadError(str(source), f"llama_model_quantize to {quantization} failed ({rc})")


def _build_id(name: str, base_dir: Path) -> str:
    entry = QUANTIZED_GGUF_MODELS[name]
    recipe = json.dumps(
        {"base": base_dir.name, "quantization": entry.quantization, "version": QUANTIZE_VERSION,
         "quantizer": LLAMA_CPP_PYTHON_VERSION},
        sort_keys=True,
    )
    return hashlib.sha256(recipe.encode()).hexdigest()[:12]


def ensure_quantized_gguf(name: str) -> tuple[Path, Path]:
    """Build ``name`` (its base first) into the model cache unless it is there; return (model, mmproj).

    Quantized in a temporary directory beside the target and renamed into place, under
    a file lock, like :func:`~.models.ensure_gguf`.
    """
    if name not in QUANTIZED_GGUF_MODELS:
        raise UnknownModelError(name, list(QUANTIZED_GGUF_MODELS))
    entry = QUANTIZED_GGUF_MODELS[name]
    base_model, base_mmproj = ensure_gguf(entry.base)
    # The one build-into-cache of every built-in model (temp directory, file lock, rename into place).
    target = build_into_cache(
        name, _build_id(name, base_model.parent), MMPROJ_FILE,
        lambda tmp: _quantize_into(entry, name, base_model, base_mmproj, tmp), "the quantized built-in GGUF",
    )
    return target / MODEL_FILE, target / MMPROJ_FILE


def _quantize_into(entry: QuantizedGguf, name: str, base_model: Path, base_mmproj: Path, directory: Path) -> None:
    quantize_gguf(base_model, directory / MODEL_FILE, entry.quantization)
    try:
        os.link(base_mmproj, directory / MMPROJ_FILE)  # the same file: no second copy of a 1.3 GB tower
    except OSError:
        shutil.copy2(base_mmproj, directory / MMPROJ_FILE)
    marker = {"random_weights": True, "model_id": f"refsight/{name}", "base": entry.base,
              "quantization": entry.quantization, "build": QUANTIZE_VERSION}
    (directory / MARKER_FILE).write_text(json.dumps(marker))
