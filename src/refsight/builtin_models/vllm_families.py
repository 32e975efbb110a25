"""Tiny random checkpoints of the non-Qwen families, sized for vLLM's CPU runtime.

The generic backend's tiny recipes (:mod:`refsight.builtin_models.family_recipes`) use a text
head dim of 16; vLLM's CPU attention takes 32 and up (``CPUAttentionBackend.get_supported_head_sizes``).
Each variant here is the recipe with a dict update: two text heads of 32 (hidden stays 64),
one KV head. Everything else (tokens, template, processor) is the recipe's own, so
``tiny-<family>-vllm`` is also an ordinary refsight HF model of its family (the vLLM
backend loads it as the encoder-side tokenizer and processor of the served weights).
Where vLLM 0.32 reads a checkpoint differently from transformers 5.24 the variant says so
beside it: M-RoPE splits resized for heads of 32, config fields 5.24 no longer writes, the
hub checkpoints' weight layout (:func:`_hub_layout`), and for the hybrid Gated DeltaNet
language models (Qwen3.5, MiniCPM-V 4.6) linear heads of 64, served in bfloat16 (``serve.tiny_dtype``).

SmolVLM (``model_type`` ``smolvlm``, vLLM's Idefics3 code) is built by the older
:mod:`refsight.builtin_models.checkpoints` recipe (``smolvlm_spec``) with the same head change and a
``finish`` hook that writes the files vLLM's ``AutoProcessor`` load wants (a chat template,
a video-processor config).

Built into refsight's model cache on first use (:func:`ensure_family_dir`), like every tiny model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..families import family
from .checkpoints import TINY_MODELS, _Spec, _build_id, build_checkpoint, build_into_cache, smolvlm_spec
from .family_checkpoints import FamilySpec, build_family_checkpoint
from .family_recipes import (
    GEMMA3, GLM4V, GLM4V_MOE, INTERNVL, LLAVA, LLAVA_NEXT, LLAVA_ONEVISION, MINICPMV4_6, MISTRAL3, QWEN3_VL_MOE,
)
from .hybrid_recipes import GEMMA4, QWEN3_5, QWEN3_5_MOE
from .kin_recipes import EXAONE4_5, IDEFICS3, PADDLEOCR_VL

__all__ = ["VLLM_FAMILY_SPECS", "VLLM_FAMILY_MODELS", "ensure_family_dir", "write_smolvlm_files"]

#: vLLM CPU attention: two text heads of 32 (the recipes' hidden size 64 stays), one KV head.
_HEADS = dict(num_attention_heads=2, num_key_value_heads=1, head_dim=32)
#: vLLM's CPU Gated DeltaNet kernel takes linear-attention heads of 64 and 128 only, keys as wide as values.
_LINEAR_HEADS = dict(linear_key_head_dim=64, linear_value_head_dim=64)


def _rope(recipe: dict[str, Any], section: list[int]) -> dict[str, Any]:
    """The recipe's text rope parameters with an M-RoPE split for heads of 32 (vLLM checks it sums to the
    rotary half: 16 frequencies for a whole head, 8 for half of it)."""
    return {**recipe["config"]["text_config"]["rope_parameters"], "mrope_section": section}


def _variant(recipe: dict[str, Any], fields: dict[str, Any] | None = None, **text: Any) -> FamilySpec:
    """``recipe`` with its text config's heads set for vLLM's CPU attention (plus ``text`` updates and
    other recipe ``fields``)."""
    recipe = {**recipe, **(fields or {})}
    config = dict(recipe["config"])
    config["text_config"] = {**config["text_config"], **_HEADS, **text}
    return FamilySpec(**{**recipe, "config": config})


#: Built-in name -> the recipe of a vLLM-sized tiny checkpoint (transformers' families, built from data).
VLLM_FAMILY_SPECS: dict[str, FamilySpec] = {
    # Gemma 3 scales queries by query_pre_attn_scalar ** -0.5: the head dim, as in the real models.
    # vLLM's Gemma 3 processor merges the newlines around each image into Gemma's single "\n\n\n" and
    # "\n\n\n\n" tokens: it looks "\n" ... "\n\n\n\n" up in the vocabulary (a KeyError without them).
    # Gemma 3's SigLIP tower has no attention-pooling head (vLLM's has none to load into).
    "tiny-gemma3-vllm": _variant(GEMMA3, {
        "plain_tokens": ("\n", "\n\n", "\n\n\n", "\n\n\n\n"),
        "config": {**GEMMA3["config"], "vision_config": {**GEMMA3["config"]["vision_config"], "vision_use_head": False}},
    }, query_pre_attn_scalar=32),
    "tiny-llava-vllm": _variant(LLAVA),
    "tiny-internvl-vllm": _variant(INTERNVL),
    "tiny-mistral3-vllm": _variant(MISTRAL3),
    # Any-res tiles (a base view plus the tiles of the best-fitting pinpoint grid): CLIP + Mistral, SigLIP + Qwen2.
    "tiny-llava-next-vllm": _variant(LLAVA_NEXT),
    "tiny-llava-onevision-vllm": _variant(LLAVA_ONEVISION),
    # Qwen3.5 (hybrid: three Gated DeltaNet layers, then one full-attention layer), served in bfloat16, the only
    # dtype of vLLM's CPU Gated DeltaNet kernel (serve.tiny_dtype). Half of each attention head is rotary:
    # 8 frequencies split t/h/w in about the ratio of Qwen3.5's own [11, 11, 10].
    "tiny-qwen3.5-vllm": _variant(QWEN3_5, **_LINEAR_HEADS, rope_parameters=_rope(QWEN3_5, [3, 3, 2])),
    "tiny-qwen3.5-moe-vllm": _variant(QWEN3_5_MOE, **_LINEAR_HEADS, rope_parameters=_rope(QWEN3_5_MOE, [3, 3, 2])),
    # MiniCPM-V 4.6's language model is Qwen3.5's hybrid (one Gated DeltaNet layer, one full attention).
    "tiny-minicpmv4-6-vllm": _variant(MINICPMV4_6, **_LINEAR_HEADS, rope_parameters=_rope(MINICPMV4_6, [3, 3, 2])),
    # vLLM 0.32 reads norm_topk_prob and use_qk_norm, which transformers 5.24 no longer writes (its Qwen3-VL-MoE
    # always renormalizes the routed weights; its GLM-4.5V has no q/k norm): set to what 5.24 computes.
    "tiny-qwen3-vl-moe-vllm": _variant(QWEN3_VL_MOE, rope_parameters=_rope(QWEN3_VL_MOE, [4, 6, 6]), norm_topk_prob=True),
    "tiny-glm4v-vllm": _variant(GLM4V, rope_parameters=_rope(GLM4V, [4, 2, 2])),
    "tiny-glm4v-moe-vllm": _variant(GLM4V_MOE, rope_parameters=_rope(GLM4V_MOE, [4, 2, 2]), use_qk_norm=False),
    "tiny-paddleocr-vl-vllm": _variant(PADDLEOCR_VL, rope_parameters=_rope(PADDLEOCR_VL, [8, 4, 4])),
    "tiny-exaone4-5-vllm": _variant(EXAONE4_5),
    "tiny-idefics3-vllm": _variant(IDEFICS3),
    # vLLM 0.32 sizes Gemma 4's images by vision_config.default_output_length (transformers 5.24 writes none):
    # the recipe's 70 soft tokens.
    "tiny-gemma4-vllm": _variant(GEMMA4, {"config": {**GEMMA4["config"], "vision_config": {
        **GEMMA4["config"]["vision_config"], "default_output_length": 70}}}),
}

_SMOLVLM_FINISH = "refsight.builtin_models.vllm_families:write_smolvlm_files"
#: SmolVLM with text heads of 32 (hidden 64, 2 heads, 1 KV head); the tiny tower and tiling of ``tiny-smolvlm``.
_SMOLVLM = smolvlm_spec((32, 64, 2, 2, 32, 8), (64, 128, 2, 2, 1, 4096), longest_edge=64, tile=32, scale_factor=2)

#: Built-in name -> :mod:`refsight.builtin_models.checkpoints` recipe (registered into ``TINY_MODELS`` on import).
VLLM_FAMILY_MODELS: dict[str, _Spec] = {
    "tiny-smolvlm-vllm": _Spec(**{**_SMOLVLM.__dict__, "finish": _SMOLVLM_FINISH}),
}
TINY_MODELS.update(VLLM_FAMILY_MODELS)

# SmolVLM's template shape: "<|im_start|>User:<image>text<end_of_utterance>\nAssistant:". vLLM hands
# content as typed parts; the processor expands each <image> into the tile layout.
_SMOLVLM_TEMPLATE = (
    "<|im_start|>{% for message in messages %}{{ message['role'] | capitalize }}"
    "{% if message['content'] is string %}: {{ message['content'] }}{% else %}:"
    "{% for part in message['content'] %}{% if part['type'] == 'image' %}<image>"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}"
    "<end_of_utterance>\n{% endfor %}{% if add_generation_prompt %}Assistant:{% endif %}"
)


def write_smolvlm_files(directory: Path, tokenizer: Any, spec: _Spec) -> None:
    """The ``finish`` hook of ``tiny-smolvlm-vllm``: chat template, processor and video-processor configs."""
    directory = Path(directory)
    (directory / "chat_template.jinja").write_text(_SMOLVLM_TEMPLATE)
    config_path = directory / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = _SMOLVLM_TEMPLATE
    config_path.write_text(json.dumps(config, indent=2))
    image = json.loads((directory / "preprocessor_config.json").read_text())
    image["processor_class"] = "SmolVLMProcessor"
    (directory / "preprocessor_config.json").write_text(json.dumps(image, indent=2))
    video = {k: v for k, v in image.items() if k not in ("image_processor_type", "max_image_size")}
    video.update(video_processor_type="SmolVLMVideoProcessor", processor_class="SmolVLMProcessor")
    (directory / "video_preprocessor_config.json").write_text(json.dumps(video, indent=2))
    image_seq_len = (spec.vision["image_size"] // spec.vision["patch_size"]) ** 2 // spec.extra["scale_factor"] ** 2
    (directory / "processor_config.json").write_text(json.dumps(
        {"processor_class": "SmolVLMProcessor", "image_seq_len": image_seq_len}, indent=2))


def _family_build_id(name: str) -> str:
    import hashlib

    import transformers

    from .checkpoints import BUILD_VERSION, SEED

    recipe = json.dumps({"vllm_family_spec": VLLM_FAMILY_SPECS[name].recipe(), "seed": SEED, "build": BUILD_VERSION,
                         "transformers": transformers.__version__}, sort_keys=True, default=str)
    return hashlib.sha256(recipe.encode()).hexdigest()[:12]


# The family entry's vllm.hub_layout says where transformers 5 saves another layout than the hub checkpoints vLLM
# loads: "vision_model", a vision tower without the ``vision_model.`` level (``vision_tower.embeddings...``, vLLM
# loads only ``vision_tower.vision_model.embeddings...``); "experts", fused MoE experts as transformers holds them
# (``[experts, out, in]``; the hub checkpoints hold them transposed, and transformers transposes them on load).
_EXPERTS = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")


def _hub_tensor(layout: str, key: str, tensor: Any) -> tuple[str, Any]:
    """One saved tensor under its hub checkpoint's name and layout."""
    if layout == "vision_model" and key.startswith("vision_tower.") and not key.startswith("vision_tower.vision_model."):
        key = "vision_tower.vision_model." + key[len("vision_tower."):]
    if layout == "experts" and key.endswith(_EXPERTS):
        tensor = tensor.transpose(1, 2).contiguous()
    return key, tensor


def _hub_layout(directory: Path, model_type: str) -> None:
    """Rewrite the saved weights into the layout of the family's hub checkpoints (transformers loads both)."""
    layout = family(model_type).vllm.hub_layout
    if not layout:
        return
    import safetensors.torch

    path = directory / "model.safetensors"
    tensors = safetensors.torch.load_file(str(path))
    hub = dict(_hub_tensor(layout, k, v) for k, v in tensors.items())
    safetensors.torch.save_file(hub, str(path), metadata={"format": "pt"})


def _build_family(name: str, directory: Path) -> None:
    from .checkpoints import SEED, _write_marker

    spec = VLLM_FAMILY_SPECS[name]
    build_family_checkpoint(spec, directory, seed=SEED)
    _hub_layout(directory, spec.model_type)
    _write_marker(directory, name)


def ensure_family_dir(name: str) -> Path:
    """Build the tiny vLLM model ``name`` (a family here) into refsight's model cache; return its folder."""
    if name in VLLM_FAMILY_MODELS:
        return build_into_cache(name, _build_id(name), "config.json",
                                lambda tmp: build_checkpoint(name, TINY_MODELS[name], tmp), "the built-in model")
    if name not in VLLM_FAMILY_SPECS:
        from ..errors import UnknownModelError

        raise UnknownModelError(name, [*VLLM_FAMILY_SPECS, *VLLM_FAMILY_MODELS])
    return build_into_cache(name, _family_build_id(name), "config.json", lambda tmp: _build_family(name, tmp),
                            "the built-in model")
