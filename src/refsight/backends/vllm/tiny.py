"""Tiny random Qwen-VL models that vLLM's CPU runtime accepts.

The plain ``tiny-qwen*`` models use a text head dim of 16; vLLM's CPU attention
needs at least 32, so these variants have two heads of 32 (hidden 64) and a
multimodal rotary split that adds up to 16. vLLM also loads the model folder
through ``AutoProcessor`` and applies its chat template server-side, so the build
adds (through :mod:`refsight.backends.tiny`'s ``finish`` hook) a Qwen chat
template, a video-processor config and a ``processor_config.json``, written as
plain JSON because refsight's own environment has no torchvision.

They are built and loaded by the same code as every tiny model, so
``tiny-qwen2-vl-vllm`` is also an ordinary refsight HF model (its encoder).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..tiny import (
    QWEN2_2B_VISION, QWEN2_VISION, QWEN3_PROCESSOR, QWEN3_ROPE, QWEN3_VISION, QWEN25_VISION, QWEN_TINY_TEXT, TINY_MODELS, _Spec,
    ensure_model_dir, load_tiny, qwen_spec,
)

__all__ = ["VLLM_TINY_MODELS", "ensure_vllm_model_dir", "load_tiny_vllm", "write_vllm_files"]

_FINISH = "refsight.backends.vllm.tiny:write_vllm_files"
# Two heads of 32 (vLLM CPU attention's minimum head size); mrope sections sum to 32 / 2.
_TEXT = dict(QWEN_TINY_TEXT, num_attention_heads=2, num_key_value_heads=1)
_ROPE = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [4, 6, 6]}

#: name -> spec; registered into :data:`refsight.backends.tiny.TINY_MODELS` on import.
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

# Qwen's own template shape: Qwen2/2.5-VL open with a default system turn, Qwen3-VL does
# not; one vision block per image part. vLLM passes content as a list of typed parts
# (it detects the loop over message['content']), so text and images keep their order.
_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}SYSTEM{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] in ['image', 'image_url', 'image_embeds'] or 'image' in content %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'text' or 'text' in content %}{{ content['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_SYSTEM = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
_PROCESSORS = {
    "qwen2_vl": ("Qwen2VLProcessor", "Qwen2VLVideoProcessor"),
    "qwen2_5_vl": ("Qwen2_5_VLProcessor", "Qwen2VLVideoProcessor"),
    "qwen3_vl": ("Qwen3VLProcessor", "Qwen3VLVideoProcessor"),
}


def chat_template(family: str) -> str:
    """The Jinja chat template of a tiny vLLM model of ``family``."""
    return _TEMPLATE.replace("SYSTEM", "" if family == "qwen3_vl" else _SYSTEM)


def write_vllm_files(directory: Path, tokenizer: Any, spec: _Spec) -> None:
    """The ``finish`` hook: chat template, video-processor and processor configs."""
    directory = Path(directory)
    template = chat_template(spec.family)
    (directory / "chat_template.jinja").write_text(template)
    config_path = directory / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = template  # older transformers read it only from here
    config_path.write_text(json.dumps(config, indent=2))
    processor_class, video_class = _PROCESSORS[spec.family]
    image = json.loads((directory / "preprocessor_config.json").read_text())
    video = {k: v for k, v in image.items() if k != "image_processor_type"}
    video.update(video_processor_type=video_class, processor_class=processor_class)
    (directory / "video_preprocessor_config.json").write_text(json.dumps(video, indent=2))
    image["processor_class"] = processor_class
    (directory / "preprocessor_config.json").write_text(json.dumps(image, indent=2))
    (directory / "processor_config.json").write_text(json.dumps({"processor_class": processor_class}, indent=2))


def ensure_vllm_model_dir(name: str) -> Path:
    """Build the tiny vLLM model ``name`` into refsight's model cache; return its folder."""
    return ensure_model_dir(name)


def load_tiny_vllm(name: str, **options: Any):
    """Registry factory: the tiny vLLM variant as a plain refsight HF backend (its encoder)."""
    return load_tiny(name, **options)
