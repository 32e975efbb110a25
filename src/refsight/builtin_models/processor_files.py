"""The processor files of the tiny Qwen and SmolVLM checkpoints: chat template and processor settings.

A real checkpoint carries its chat template and its processor's settings, and the
transformers backend reads both (the prompt is the checkpoint's own template, each image
expanded by the family's processor). The tiny checkpoints of :mod:`.checkpoints` get the same
files, with templates shaped like the real ones: Qwen2/2.5-VL open with a default system
turn and Qwen3-VL does not, one ``<|vision_start|><|image_pad|><|vision_end|>`` block per
image; SmolVLM writes ``User:`` (no space before an image) and ``Assistant:``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["chat_template", "processor_class_name", "write_processor_files"]

# vLLM passes content as a list of typed parts (it detects the loop over message['content']),
# so text and images keep their order; its image parts are typed image_url / image_embeds.
_QWEN = (
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
_QWEN_SYSTEM = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
_SMOLVLM = (
    "<|im_start|>{% for message in messages %}{{ message['role'] | capitalize }}"
    "{% if message['content'] is not string and message['content'] and message['content'][0]['type'] == 'image' %}:"
    "{% else %}: {% endif %}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'text' %}{{ part['text'] }}{% elif part['type'] == 'image' %}<image>{% endif %}"
    "{% endfor %}{% endif %}<end_of_utterance>\n{% endfor %}"
    "{% if add_generation_prompt %}Assistant:{% endif %}"
)
_PROCESSORS = {
    "qwen2_vl": "Qwen2VLProcessor",
    "qwen2_5_vl": "Qwen2_5_VLProcessor",
    "qwen3_vl": "Qwen3VLProcessor",
    "smolvlm": "SmolVLMProcessor",
}


def chat_template(family: str) -> str:
    """The Jinja chat template of a tiny checkpoint of ``family``."""
    if family == "smolvlm":
        return _SMOLVLM
    return _QWEN.replace("SYSTEM", "" if family == "qwen3_vl" else _QWEN_SYSTEM)


def processor_class_name(family: str) -> str:
    """The transformers processor class of ``family``."""
    return _PROCESSORS[family]


def _processor_settings(spec: Any) -> dict[str, Any]:
    """The processor's own settings: SmolVLM's feature rows per tile (the connector's output for one tile)."""
    if spec.family != "smolvlm":
        return {}
    vision = spec.vision
    return {"image_seq_len": (vision["image_size"] // vision["patch_size"]) ** 2 // spec.extra["scale_factor"] ** 2}


def write_processor_files(directory: Path, spec: Any) -> None:
    """The chat template (``chat_template.jinja`` and the tokenizer config) and ``processor_config.json``."""
    directory = Path(directory)
    template = chat_template(spec.family)
    (directory / "chat_template.jinja").write_text(template)
    config_path = directory / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = template  # older transformers read it only from here
    config_path.write_text(json.dumps(config, indent=2))
    settings = {"processor_class": processor_class_name(spec.family), **_processor_settings(spec)}
    (directory / "processor_config.json").write_text(json.dumps(settings, indent=2))
