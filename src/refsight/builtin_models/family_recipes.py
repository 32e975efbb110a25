"""The recipes of the built-in tiny checkpoints of the generic backend's families (data only).

Each recipe is the keyword arguments of a :class:`~refsight.builtin_models.family_checkpoints.FamilySpec`:
special tokens, a short chat template shaped like the family's real one, the model config
(text hidden 64, 2 layers; vision hidden 32, 2 layers; ``"token:<x>"`` is that token's id), and
the image processor's and processor's settings, sized so each image takes a few dozen tokens.
Real templates place images as the family's processor expects (LLaVA: images first in a turn).
"""

from __future__ import annotations

# ruff: noqa: E501  (chat templates read best on one line each)

# One recipe per model type, named by its family entry (refsight.families: transformers.recipe).
__all__ = ["GEMMA3", "LLAVA", "LLAVA_ONEVISION", "PALIGEMMA", "LLAVA_NEXT", "INTERNVL", "AYA_VISION", "MISTRAL3", "GLM4V",
           "GLM4V_MOE", "MINICPMV4_6", "QWEN3_VL_MOE", "SHAPE_RECIPES"]


def _content(image: str) -> str:
    """Jinja for a message's content: a string, or parts where an image part renders as ``image``."""
    return (
        "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for c in m['content'] %}"
        "{% if c['type'] == 'image' %}" + image + "{% else %}{{ c['text'] }}{% endif %}{% endfor %}{% endif %}"
    )

# Shared tiny text backbones (text hidden 64, 2 layers, 4 heads, 2 KV heads).
_TEXT = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             head_dim=16, max_position_embeddings=4096)
# Tiny vision towers (vision hidden 32, 2 layers, 32 px, patch 8 -> 4x4 = 16 patches).
_CLIP = dict(model_type="clip_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
             num_attention_heads=2, image_size=32, patch_size=8, projection_dim=32)
_SIGLIP = dict(model_type="siglip_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
               num_attention_heads=2, image_size=32, patch_size=8)
# Any-res grids in units of the 32 px tile (real ones are multiples of 336 / 384).
_PINPOINTS = [[32, 32], [32, 64], [64, 32], [64, 64]]


def _images_then_texts(image: str, text: str, string: str = "{{ m['content'] }}") -> str:
    """One message's content as llava-hf templates lay it out: its images first, then its texts."""
    return ("{% if m['content'] is string %}" + string + "{% else %}"
            "{% for c in m['content'] %}{% if c['type']=='image' %}" + image + "{% endif %}{% endfor %}"
            "{% for c in m['content'] %}{% if c['type']=='text' %}" + text + "{% endif %}{% endfor %}"
            "{% endif %}")


def _images_first(prefix, turn_open, turn_close, image="<image>", sep="\n"):
    """llava-hf style template: every image of a turn first, then its texts (as in the real hf templates)."""
    return (prefix + "{% for m in messages %}" + turn_open + _images_then_texts(image, sep + "{{ c['text'] }}") + turn_close
            + "{% endfor %}")


# llava-1.5-hf: "USER: <image>\n<prompt> ASSISTANT:" (Llama tokenizer adds <s>; here it is in the template
# because the proof tokenizes with add_special_tokens=False on both paths).
LLAVA = dict(
    model_type="llava",
    special_tokens=("<unk>", "<s>", "</s>", "<image>", "<pad>"),
    eos="</s>", pad="<pad>", bos="<s>",
    named_tokens={"image_token": "<image>"},
    chat_template=("{{ bos_token }}{% for m in messages %}{% if m['role'] != 'system' %}{{ m['role'].upper() + ': ' }}{% endif %}"
                   + _images_then_texts("<image>\n", "{{ c['text'] + ' ' }}", string="{{ m['content'] + ' ' }}")
                   + "{% if m['role'] == 'assistant' %}</s>{% endif %}{% endfor %}"
                   "{% if add_generation_prompt %}ASSISTANT:{% endif %}"),
    config=dict(
        text_config=dict(model_type="llama", **_TEXT),
        vision_config=dict(_CLIP),
        image_token_index="token:<image>", image_seq_length=16,
        vision_feature_select_strategy="default", vision_feature_layer=-2),
    # resize shortest edge 32 + center crop 32 -> 4x4 patches + CLS; "default" drops CLS -> 16 tokens / image.
    image_processor=dict(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}),
    processor=dict(patch_size=8, vision_feature_select_strategy="default", num_additional_image_tokens=1),
)

# llava-onevision-qwen2-hf: "<|im_start|>user <image><image>\n<text><|im_end|><|im_start|>assistant\n"
LLAVA_ONEVISION = dict(
    model_type="llava_onevision",
    special_tokens=("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<image>", "<video>"),
    eos="<|im_end|>", pad="<|endoftext|>", bos=None,
    named_tokens={"image_token": "<image>", "video_token": "<video>"},
    chat_template=_images_first("", "<|im_start|>{{ m['role'] }} ", "<|im_end|>")
                  + "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
    config=dict(
        text_config=dict(model_type="qwen2", **_TEXT),
        vision_config=dict(_SIGLIP),
        image_token_index="token:<image>", video_token_index="token:<video>",
        vision_feature_select_strategy="full", vision_feature_layer=-1,
        image_grid_pinpoints=_PINPOINTS, vision_aspect_ratio="anyres_max_9"),
    image_processor=dict(size={"height": 32, "width": 32}, image_grid_pinpoints=_PINPOINTS,
                         image_mean=[0.5] * 3, image_std=[0.5] * 3),
    processor=dict(num_image_tokens=16, vision_feature_select_strategy="full", vision_aspect_ratio="anyres_max_9"),
)

# PaliGemma has no chat template: its processor takes "<image>"*k + prefix text and inserts <bos> after the last
# <image> and a "\n" at the end. The template below only renders that raw prefix (images first, then texts), so
# that both proof paths can start from the same string; the processor adds <bos> and "\n" itself.
PALIGEMMA = dict(
    model_type="paligemma",
    special_tokens=("<pad>", "<eos>", "<bos>", "<unk>", "<image>"),
    eos="<eos>", pad="<pad>", bos="<bos>",
    named_tokens={"image_token": "<image>"},
    chat_template="{% for m in messages %}" + _images_then_texts("<image>", "{{ c['text'] }}") + "{% endfor %}",
    config=dict(
        text_config=dict(model_type="gemma", hidden_act="gelu_pytorch_tanh", **_TEXT),
        vision_config=dict(_SIGLIP, vision_use_head=False),
        image_token_index="token:<image>", projection_dim=64, hidden_size=64),
    # image_seq_length is read by PaliGemmaProcessor from the image processor: (32 / 8) ** 2 = 16.
    image_processor=dict(size={"height": 32, "width": 32}, image_seq_length=16),
    processor=dict(),
    # The processor adds PaliGemma's detection and segmentation tokens to the tokenizer; the real
    # vocabulary has them, so the tiny one does too (else the model's embedding would be too small).
    plain_tokens=tuple(f"<loc{i:04d}>" for i in range(1024)) + tuple(f"<seg{i:03d}>" for i in range(128)),
)

# llava-v1.6-mistral-hf: "<s>[INST] <image>\n<prompt> [/INST]"
LLAVA_NEXT = dict(
    model_type="llava_next",
    special_tokens=("<unk>", "<s>", "</s>", "[INST]", "[/INST]", "<image>", "<pad>"),
    eos="</s>", pad="<pad>", bos="<s>",
    named_tokens={"image_token": "<image>"},
    chat_template=("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}[INST] {% endif %}"
                   + _images_then_texts("<image>\n", "{{ c['text'] + ' ' }}")
                   + "{% if m['role'] == 'user' %}[/INST]{% else %}</s>{% endif %}{% endfor %}"),
    config=dict(
        text_config=dict(model_type="mistral", sliding_window=None, **_TEXT),
        vision_config=dict(_CLIP),
        image_token_index="token:<image>", image_seq_length=16,
        vision_feature_select_strategy="default", vision_feature_layer=-2, image_grid_pinpoints=_PINPOINTS),
    image_processor=dict(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32},
                         image_grid_pinpoints=_PINPOINTS),
    processor=dict(patch_size=8, vision_feature_select_strategy="default", num_additional_image_tokens=1),
)


# InternVL3-hf: Qwen2 text, chatml template, image rendered as "<IMG_CONTEXT>\n"; the processor expands each
# <IMG_CONTEXT> to <img><IMG_CONTEXT>*image_seq_length*num_patches</img>. Vision 32 px / patch 8 = 16 patches,
# CLS dropped ("default"), pixel shuffle 0.5 -> 4 tokens per tile. GotOcr2 tiling: 32x32 tiles, at most 4 tiles
# plus a thumbnail when more than one tile.
INTERNVL = dict(
    model_type="internvl",
    special_tokens=("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<img>", "</img>", "<IMG_CONTEXT>", "<video>"),
    eos="<|im_end|>", pad="<|endoftext|>", bos=None,
    named_tokens={"start_image_token": "<img>", "end_image_token": "</img>", "context_image_token": "<IMG_CONTEXT>",
                  "video_token": "<video>"},
    chat_template=("{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
                   "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for c in m['content'] %}"
                   "{% if c['type']=='image' %}<IMG_CONTEXT>\n{% else %}{{ c['text'] }}{% endif %}{% endfor %}{% endif %}"
                   "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"),
    config=dict(
        text_config=dict(model_type="qwen2", **_TEXT),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                           image_size=[32, 32], patch_size=[8, 8]),
        image_token_id="token:<IMG_CONTEXT>", image_seq_length=4, downsample_ratio=0.5,
        vision_feature_layer=-1, vision_feature_select_strategy="default"),
    # crop_to_patches is left at the image processor's default (False), as in the real InternVL3-hf checkpoints:
    # InternVLProcessor turns it on through its images_kwargs defaults.
    image_processor=dict(size={"height": 32, "width": 32}, min_patches=1, max_patches=4,
                         image_mean=[0.5] * 3, image_std=[0.5] * 3),
    processor=dict(image_seq_length=4),
)

# Aya Vision: Cohere2 text, Cohere turn tokens, image rendered as "<image>"; the processor expands each to
# <|START_OF_IMG|>(TILE_i + <|IMG_PATCH|>*k)*... TILE_GLOBAL <|IMG_PATCH|>*k <|END_OF_IMG|>, k = (img_size // (patch*ds))**2.
# SigLIP 32 px / patch 8 = 16 patches, pixel shuffle 2 -> 4 tokens per tile.
AYA_VISION = dict(
    model_type="aya_vision",
    special_tokens=("<PAD>", "<UNK>", "<BOS_TOKEN>", "<|END_OF_TURN_TOKEN|>", "<|START_OF_TURN_TOKEN|>", "<|USER_TOKEN|>",
                    "<|CHATBOT_TOKEN|>", "<|SYSTEM_TOKEN|>", "<image>", "<|START_OF_IMG|>", "<|END_OF_IMG|>",
                    "<|IMG_PATCH|>", "<|IMG_LINE_BREAK|>", "TILE", "TILE_GLOBAL"),
    eos="<|END_OF_TURN_TOKEN|>", pad="<PAD>", bos="<BOS_TOKEN>",
    named_tokens={},
    chat_template=("{{ bos_token }}{% for m in messages %}<|START_OF_TURN_TOKEN|>"
                   "{{ '<|CHATBOT_TOKEN|>' if m['role']=='assistant' else '<|SYSTEM_TOKEN|>' if m['role']=='system' else '<|USER_TOKEN|>' }}"
                   "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for c in m['content'] %}"
                   "{% if c['type']=='image' %}<image>{% else %}{{ c['text'] }}{% endif %}{% endfor %}{% endif %}"
                   "<|END_OF_TURN_TOKEN|>{% endfor %}{% if add_generation_prompt %}<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>{% endif %}"),
    config=dict(
        text_config=dict(model_type="cohere2", sliding_window=64, **_TEXT),
        vision_config=dict(model_type="siglip_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=2, image_size=32, patch_size=8, vision_use_head=False),
        image_token_index="token:<|IMG_PATCH|>", downsample_factor=2, vision_feature_select_strategy="full",
        vision_feature_layer=-1),
    image_processor=dict(size={"height": 32, "width": 32}, crop_to_patches=True, min_patches=1, max_patches=4,
                         image_mean=[0.5] * 3, image_std=[0.5] * 3),
    processor=dict(patch_size=8, img_size=32, downsample_factor=2, image_token="<image>"),
)

# Mistral3 (Mistral-Small-3.1): Mistral text, [INST]..[/INST], image rendered as "[IMG]"; PixtralProcessor expands to
# rows of [IMG]*w + [IMG_BREAK], last one [IMG_END]. Pixtral vision patch 8, spatial merge 2 -> one token per 16 px.
# Longest edge 64 -> at most 4x4 = 16 image tokens per image.
MISTRAL3 = dict(
    model_type="mistral3",
    special_tokens=("<unk>", "<s>", "</s>", "<pad>", "[INST]", "[/INST]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]",
                    "[IMG]", "[IMG_BREAK]", "[IMG_END]"),
    eos="</s>", pad="<pad>", bos="<s>",
    named_tokens={},
    chat_template=("{{ bos_token }}{% for m in messages %}"
                   "{% if m['role']=='system' %}[SYSTEM_PROMPT]{{ m['content'] }}[/SYSTEM_PROMPT]"
                   "{% elif m['role']=='user' %}[INST]{% if m['content'] is string %}{{ m['content'] }}{% else %}"
                   "{% for c in m['content'] %}{% if c['type']=='image' %}[IMG]{% else %}{{ c['text'] }}{% endif %}{% endfor %}"
                   "{% endif %}[/INST]{% else %}{{ m['content'] if m['content'] is string else m['content'][0]['text'] }}{{ eos_token }}"
                   "{% endif %}{% endfor %}"),
    config=dict(
        text_config=dict(model_type="mistral", sliding_window=None, **_TEXT),
        vision_config=dict(model_type="pixtral", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=2, head_dim=16, image_size=64, patch_size=8),
        image_token_index="token:[IMG]", spatial_merge_size=2, vision_feature_layer=-1, multimodal_projector_bias=False),
    # patch_size here is what PixtralProcessor forces at call time (patch_size * spatial_merge_size)
    image_processor=dict(size={"longest_edge": 64}, patch_size={"height": 16, "width": 16},
                         image_mean=[0.5] * 3, image_std=[0.5] * 3),
    processor=dict(patch_size=8, spatial_merge_size=2, image_token="[IMG]", image_break_token="[IMG_BREAK]",
                   image_end_token="[IMG_END]"),
)

GEMMA3 = dict(
    model_type="gemma3",
    special_tokens=("<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>", "<start_of_image>", "<end_of_image>",
                    "<image_soft_token>"),
    eos="<eos>", pad="<pad>", bos="<bos>",
    named_tokens={"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": "<image_soft_token>"},
    chat_template=(
        "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n"
        + _content("<start_of_image>") + "<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
    ),
    config=dict(
        text_config=dict(_TEXT, sliding_window=64, query_pre_attn_scalar=16),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=64,
                           patch_size=8),
        mm_tokens_per_image=16, boi_token_index="token:<start_of_image>", eoi_token_index="token:<end_of_image>",
        image_token_index="token:<image_soft_token>",
    ),
    image_processor=dict(size={"height": 64, "width": 64}, image_mean=[0.5] * 3, image_std=[0.5] * 3),
    processor=dict(image_seq_length=16),
)

GLM4V_TEMPLATE = (
    "[gMASK]<sop>{% for m in messages %}<|{{ m['role'] }}|>\n"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for c in m['content'] %}"
    "{% if c['type']=='image' %}<|begin_of_image|><|image|><|end_of_image|>"
    "{% elif c['type']=='video' %}<|begin_of_video|><|video|><|end_of_video|>"
    "{% else %}{{ c['text'] }}{% endif %}{% endfor %}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")

GLM4V = dict(
    model_type="glm4v",
    special_tokens=("<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>", "<|system|>", "<|user|>", "<|assistant|>",
                    "<|observation|>", "<|begin_of_image|>", "<|end_of_image|>", "<|begin_of_video|>", "<|end_of_video|>",
                    "<|image|>", "<|video|>"),
    eos="<|endoftext|>", pad="<|endoftext|>",
    named_tokens={"image_token": "<|image|>", "video_token": "<|video|>"},
    chat_template=GLM4V_TEMPLATE,
    config=dict(
        # head_dim 16, partial_rotary_factor 0.5 -> 4 rotary frequencies split t/h/w by mrope_section
        text_config=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=4096,
                         rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.5,
                                              mrope_section=[2, 1, 1])),
        vision_config=dict(hidden_size=32, intermediate_size=64, depth=2, num_heads=2, image_size=32, patch_size=8,
                           spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=64),
        image_token_id="token:<|image|>", video_token_id="token:<|video|>",
        image_start_token_id="token:<|begin_of_image|>", image_end_token_id="token:<|end_of_image|>",
        video_start_token_id="token:<|begin_of_video|>", video_end_token_id="token:<|end_of_video|>"),
    # factor = patch 8 * merge 2 = 16 px; smart_resize compares 2 (temporal) * h * w with these pixel bounds:
    # 64x64..80x80 px -> 16..25 tokens per image (>= 12 rows keeps CPU sgemm bitwise equal alone vs batched)
    image_processor=dict(size={"shortest_edge": 2 * 64 * 64, "longest_edge": 2 * 80 * 80}, patch_size=8, temporal_patch_size=2,
                         merge_size=2),
)

# ---------------------------------------------------------------- MiniCPM-V 4.6 (minicpmv4_6): SigLIP-style tower with a
# window merger after layer insert_layer_id, MLP merger, Qwen3.5 hybrid text model (Gated DeltaNet + full attention).
MINICPMV4_6_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for c in m['content'] %}"
    "{% if c['type']=='image' %}<|image_pad|>{% elif c['type']=='video' %}<|video_pad|>"
    "{% else %}{{ c['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

MINICPMV4_6 = dict(
    model_type="minicpmv4_6",
    special_tokens=("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|image_pad|>", "<|video_pad|>", "<image>", "</image>",
                    "<slice>", "</slice>", "<image_id>", "</image_id>", "<think>", "</think>"),
    eos="<|im_end|>", pad="<|endoftext|>",
    named_tokens={"image_token": "<|image_pad|>", "video_token": "<|video_pad|>", "image_start_token": "<image>",
                  "image_end_token": "</image>", "slice_start_token": "<slice>", "slice_end_token": "</slice>",
                  "image_id_start_token": "<image_id>", "image_id_end_token": "</image_id>"},
    chat_template=MINICPMV4_6_TEMPLATE,
    config=dict(
        text_config=dict(model_type="qwen3_5_text", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=4096,
                         layer_types=["linear_attention", "full_attention"], linear_conv_kernel_dim=4,
                         linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
                         rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.5,
                                              mrope_section=[2, 1, 1], mrope_interleaved=True)),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=32,
                           patch_size=4),
        insert_layer_id=0, image_size=32, downsample_mode="16x",
        image_token_id="token:<|image_pad|>", video_token_id="token:<|video_pad|>"),
    # 16x: 4x4 patches of 4 px per token. scale_resolution 32 -> the overview is 32x32 px (4 tokens); a larger image is
    # also cut into a crop grid (max 4 slices) of ~32x32 px slices, 4 tokens each.
    image_processor=dict(scale_resolution=32, patch_size=4, max_slice_nums=4, slice_mode=True, use_image_id=True,
                         downsample_mode="16x", image_mean=[0.5] * 3, image_std=[0.5] * 3),
)

# ---------------------------------------------------------------- Qwen3-VL-MoE (qwen3_vl_moe): M-RoPE (interleaved), deepstack
# features injected into the first text layers, sparse MoE MLP. transformers 5.24 maps no image processor for
# qwen3_vl_moe (AutoImageProcessor relies on preprocessor_config.json): it borrows qwen3_vl's (Qwen2VLImageProcessorPil).
QWEN3_VL_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for c in m['content'] %}"
    "{% if c['type']=='image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif c['type']=='video' %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% else %}{{ c['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

QWEN3_VL_MOE = dict(
    model_type="qwen3_vl_moe",
    image_processor_class="Qwen2VLImageProcessorPil",
    special_tokens=("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
                    "<|image_pad|>", "<|video_pad|>"),
    eos="<|im_end|>", pad="<|endoftext|>",
    named_tokens={"image_token": "<|image_pad|>", "video_token": "<|video_pad|>", "vision_start_token": "<|vision_start|>",
                  "vision_end_token": "<|vision_end|>"},
    chat_template=QWEN3_VL_TEMPLATE,
    config=dict(
        text_config=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=16, max_position_embeddings=4096, moe_intermediate_size=32, num_experts=4,
                         num_experts_per_tok=2, decoder_sparse_step=1,
                         rope_parameters=dict(rope_type="default", rope_theta=500000.0, mrope_section=[3, 3, 2],
                                              mrope_interleaved=True)),
        vision_config=dict(hidden_size=32, intermediate_size=64, depth=2, num_heads=2, patch_size=8, spatial_merge_size=2,
                           temporal_patch_size=2, out_hidden_size=64, num_position_embeddings=16,
                           deepstack_visual_indexes=[0, 1]),
        image_token_id="token:<|image_pad|>", video_token_id="token:<|video_pad|>",
        vision_start_token_id="token:<|vision_start|>", vision_end_token_id="token:<|vision_end|>"),
    # factor 16 px; Qwen2-VL smart_resize bounds h*w: 64x64..80x80 px -> 16..25 tokens per image
    image_processor=dict(size={"shortest_edge": 64 * 64, "longest_edge": 80 * 80}, patch_size=8, temporal_patch_size=2,
                         merge_size=2, image_mean=[0.5] * 3, image_std=[0.5] * 3),
)

# ---------------------------------------------------------------- LFM2-VL (lfm2_vl): SigLIP2 NaFlex tower, pixel-unshuffle
# projector, LFM2 hybrid text model (short convolutions + attention). transformers 5.24 has ONLY a torchvision image processor
# (Lfm2VlImageProcessor): build_spec writes its preprocessor_config.json without instantiating it.

# GLM-4.5V's shape: GLM-4V's vision side and template with a tiny MoE language model (layer 0 dense,
# layer 1 routed + shared experts).
GLM4V_MOE = dict(
    GLM4V,
    model_type="glm4v_moe",
    image_processor_class="Glm4vImageProcessorPil",
    config=dict(
        GLM4V["config"],
        text_config=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=4096, moe_intermediate_size=32, n_routed_experts=4, num_experts_per_tok=2,
                         n_shared_experts=1, first_k_dense_replace=1, n_group=1, topk_group=1,
                         rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.5,
                                              mrope_section=[2, 1, 1]))),
)

# Gemma-3-4B's whole shape (google/gemma-3-4b-it's config): the SigLIP-so400m tower at 896² (27 layers, hidden
# 1152, patch 14: 4,096 patches pooled to 256 image tokens) and the real-depth language model (34 layers, hidden
# 2560, MLP 10240, 8 heads, 4 KV heads, head dim 256, five sliding-window layers of 1,024 tokens per full one,
# the global layers' RoPE scaled linearly by 8), random weights in bf16 (~8.6 GB). Only the tokenizer is the
# small built-in one; the embedding keeps the real 262,208 rows, so the LM head costs what it really costs.
GEMMA3_4B_SHAPE = dict(
    GEMMA3,
    config=dict(
        GEMMA3["config"],
        text_config=dict(
            hidden_size=2560, intermediate_size=10240, num_hidden_layers=34, num_attention_heads=8, num_key_value_heads=4,
            head_dim=256, sliding_window=1024, query_pre_attn_scalar=256, max_position_embeddings=131072,
            rope_parameters={"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
                             "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
        ),
        vision_config=dict(hidden_size=1152, intermediate_size=4304, num_hidden_layers=27, num_attention_heads=16,
                           image_size=896, patch_size=14, vision_use_head=False),
        mm_tokens_per_image=256,
    ),
    image_processor=dict(size={"height": 896, "width": 896}, image_mean=[0.5] * 3, image_std=[0.5] * 3),
    processor=dict(image_seq_length=256),
    save_dtype="bfloat16",
    vocab_size=262208,
)

#: Real-shape checkpoints of the generic families (benchmarks), by built-in name.
SHAPE_RECIPES = {"shape-gemma3-4b": GEMMA3_4B_SHAPE}
