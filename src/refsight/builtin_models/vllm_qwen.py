"""Tiny random Qwen-VL models that vLLM's CPU runtime accepts.

The plain ``tiny-qwen*`` models use a text head dim of 16; vLLM's CPU attention
needs at least 32, so these variants have two heads of 32 (hidden 64) and a
multimodal rotary split that adds up to 16. vLLM also loads the model folder
through ``AutoProcessor`` and applies its chat template server-side, so the build
adds (through :mod:`refsight.builtin_models.checkpoints`'s ``finish`` hook) every tiny model's
chat template and ``processor_config.json`` (:mod:`refsight.builtin_models.processor_files`)
and a video-processor config, written as plain JSON because refsight's own environment
has no torchvision.

They are built and loaded by the same code as every tiny model, so
``tiny-qwen2-vl-vllm`` is also an ordinary refsight HF model (its encoder).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .checkpoints import (
    QWEN2_2B_VISION, QWEN2_VISION, QWEN3_PROCESSOR, QWEN3_ROPE, QWEN3_VISION, QWEN25_VISION, QWEN_TINY_TEXT, TINY_MODELS, _Spec,
    ensure_model_dir, qwen_spec,
)
from .processor_files import processor_class_name, write_processor_files

__all__ = ["VLLM_TINY_MODELS", "ensure_vllm_model_dir", "write_vllm_files"]

_FINISH = "refsight.builtin_models.vllm_qwen:write_vllm_files"
# Two heads of 32 (vLLM CPU attention's minimum head size); mrope sections sum to 32 / 2.
_TEXT = dict(QWEN_TINY_TEXT, num_attention_heads=2, num_key_value_heads=1)
_ROPE = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [4, 6, 6]}

#: name -> spec; registered into :data:`refsight.builtin_models.checkpoints.TINY_MODELS` on import.
VLLM_TINY_MODELS: dict[str, _Spec] = {
    "tiny-qwen2-vl-vllm": qwen_spec("qwen2_vl", QWEN2_VISION, dict(_TEXT, rope_parameters=_ROPE), finish=_FINISH),
    "tiny-qwen2.5-vl-vllm": qwen_spec("qwen2_5_vl", QWEN25_VISION, dict(_TEXT, rope_parameters=_ROPE), finish=_FINISH),
    "tiny-qwen3-vl-vllm": qwen_spec(
        "qwen3_vl", QWEN3_VISION,
        dict(_TEXT, head_dim=32, rope_parameters={**QWEN3_ROPE, "mrope_section": [4, 6, 6]}),
        QWEN3_PROCESSOR, finish=_FINISH,
    ),
    # For benchmarks: shape-qwen2-vl-2b (Qwen2-VL-2B's vision tower and projector at full
    # size, a one-layer language model; text heads of 128) with vLLM's files.
    "shape-qwen2-vl-2b-vllm": _Spec(**{**TINY_MODELS["shape-qwen2-vl-2b"].__dict__, "finish": _FINISH}),
    # For the encoder-cache benchmark on a CPU: that vision tower cut to 8 of its 32 layers (an
    # encode that is not negligible and still finishes here), the same one-layer language model.
    "shape-qwen2-vl-2b-8l-vllm": _Spec(**{
        **TINY_MODELS["shape-qwen2-vl-2b"].__dict__, "vision": {**QWEN2_2B_VISION, "depth": 8}, "finish": _FINISH,
    }),
}
TINY_MODELS.update(VLLM_TINY_MODELS)

_VIDEO_PROCESSORS = {
    "qwen2_vl": "Qwen2VLVideoProcessor",
    "qwen2_5_vl": "Qwen2VLVideoProcessor",
    "qwen3_vl": "Qwen3VLVideoProcessor",
}


def write_vllm_files(directory: Path, tokenizer: Any, spec: _Spec) -> None:
    """The ``finish`` hook: every tiny model's processor files, then the video-processor config vLLM's
    ``AutoProcessor`` reads and the processor class named in the image processor's config."""
    directory = Path(directory)
    write_processor_files(directory, spec)
    processor_class, video_class = processor_class_name(spec.family), _VIDEO_PROCESSORS[spec.family]
    image = json.loads((directory / "preprocessor_config.json").read_text())
    video = {k: v for k, v in image.items() if k != "image_processor_type"}
    video.update(video_processor_type=video_class, processor_class=processor_class)
    (directory / "video_preprocessor_config.json").write_text(json.dumps(video, indent=2))
    image["processor_class"] = processor_class
    (directory / "preprocessor_config.json").write_text(json.dumps(image, indent=2))


def ensure_vllm_model_dir(name: str) -> Path:
    """Build the tiny vLLM model ``name`` into refsight's model cache; return its folder."""
    return ensure_model_dir(name)
