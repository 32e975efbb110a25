"""The recipes of the built-in checkpoints of model types built like an earlier family (data only).

Most of transformers 5.24's image-text-to-text table reuses a few shapes: the LLaVA processor
and projector (VipLLaVA with its multi-layer features, Video-LLaVA, LLaVA-NeXT-Video), Qwen's
smart-resize grid and ``<|image_pad|>`` placeholder over another tower or language model
(EXAONE 4.5, LFM3-VL, PaddleOCR-VL, VideoLLaMA 3), GLM-4V's
(GLM-4.6V), Pixtral's rows of ``[IMG]`` (LightOnOCR), SmolVLM's tiles (Idefics3) and DeepSeek's
SigLIP tower and MLP aligner (DeepSeek-VL, DeepSeek-VL-Hybrid, Janus). Each
recipe here is one of those with the model type's own config: text hidden 64, 2 layers;
vision hidden 32, 2 layers; a few dozen tokens per image.

Keyword arguments of a :class:`~refsight.builtin_models.family_checkpoints.FamilySpec`, as in
:mod:`.family_recipes`.
"""

from __future__ import annotations

# ruff: noqa: E501  (chat templates read best on one line each)

from .family_recipes import _CLIP, _SIGLIP, _TEXT, GLM4V, LLAVA, LLAVA_NEXT, MISTRAL3, QWEN3_VL_TEMPLATE, _content
from .processor_files import _SMOLVLM

# One recipe per model type, named by its family entry (refsight.families: transformers.recipe).
__all__ = ["VIPLLAVA", "VIDEO_LLAVA", "LLAVA_NEXT_VIDEO", "GLM46V", "EXAONE4_5", "LFM3_VL", "PADDLEOCR_VL", "VIDEO_LLAMA_3",
           "LIGHTON_OCR", "IDEFICS3", "DEEPSEEK_VL", "DEEPSEEK_VL_HYBRID", "JANUS"]

# ---------------------------------------------------------------- the LLaVA processor over a CLIP tower
# VipLLaVA: the features of several vision layers (here both) concatenated, every patch kept (no CLS
# dropped: 16 tokens per 32 px image).
VIPLLAVA = dict(
    LLAVA,
    model_type="vipllava",
    config=dict(text_config=dict(model_type="llama", **_TEXT), vision_config=dict(_CLIP),
                image_token_index="token:<image>", image_seq_length=16, vision_feature_layers=[-1, -2]),
    processor=dict(patch_size=8, vision_feature_select_strategy="full", num_additional_image_tokens=0),
)

# Video-LLaVA: LLaVA's image path beside a video one (never sent here); VideoLlavaImageProcessor is PIL.
VIDEO_LLAVA = dict(
    LLAVA,
    model_type="video_llava",
    special_tokens=("<unk>", "<s>", "</s>", "<image>", "<video>", "<pad>"),
    named_tokens={"image_token": "<image>", "video_token": "<video>"},
    config=dict(text_config=dict(model_type="llama", **_TEXT), vision_config=dict(_CLIP),
                image_token_index="token:<image>", video_token_index="token:<video>", image_seq_length=16,
                vision_feature_select_strategy="default", vision_feature_layer=-2),
)

# LLaVA-NeXT-Video: LLaVA-NeXT's any-res images (and a video token).
LLAVA_NEXT_VIDEO = dict(
    LLAVA_NEXT,
    model_type="llava_next_video",
    special_tokens=("<unk>", "<s>", "</s>", "[INST]", "[/INST]", "<image>", "<video>", "<pad>"),
    named_tokens={"image_token": "<image>", "video_token": "<video>"},
    config=dict(LLAVA_NEXT["config"], video_token_index="token:<video>"),
)

# ---------------------------------------------------------------- GLM-4V's tower and template
GLM46V = dict(GLM4V, model_type="glm46v")

# ---------------------------------------------------------------- Qwen's grid and <|image_pad|> placeholder
_QWEN_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
                "<|image_pad|>", "<|video_pad|>")
_QWEN_LIKE = dict(
    special_tokens=_QWEN_TOKENS, eos="<|im_end|>", pad="<|endoftext|>", chat_template=QWEN3_VL_TEMPLATE,
    named_tokens={"image_token": "<|image_pad|>", "video_token": "<|video_pad|>", "vision_start_token": "<|vision_start|>",
                  "vision_end_token": "<|vision_end|>"},
)
_QWEN_IDS = dict(image_token_id="token:<|image_pad|>", video_token_id="token:<|video_pad|>")
# factor = patch 8 * merge 2 = 16 px; Qwen2-VL smart_resize bounds h*w: 64x64..80x80 px -> 16..25 tokens per image
_QWEN_IMAGES = dict(size={"shortest_edge": 64 * 64, "longest_edge": 80 * 80}, patch_size=8, temporal_patch_size=2,
                    merge_size=2, image_mean=[0.5] * 3, image_std=[0.5] * 3)
# Qwen2.5-VL's windowed tower: windows of 32 px (2x2 merged units), the last layer full attention.
_QWEN25_TOWER = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=8, spatial_merge_size=2,
                     temporal_patch_size=2, window_size=32, out_hidden_size=64, fullatt_block_indexes=[1])

# EXAONE 4.5: Qwen2.5-VL's windowed tower (with its own key/value head count), EXAONE 4's hybrid sliding-window text model.
EXAONE4_5 = dict(
    _QWEN_LIKE,
    model_type="exaone4_5",
    config=dict(text_config=dict(model_type="exaone4", sliding_window=64, sliding_window_pattern=2, **_TEXT),
                vision_config=dict(_QWEN25_TOWER, num_key_value_heads=2), **_QWEN_IDS),
    image_processor=_QWEN_IMAGES,
)

# LFM3-VL: a tower of convolution and attention layers, LFM3's hybrid (short convolutions + attention) text model.
LFM3_VL = dict(
    _QWEN_LIKE,
    model_type="lfm3_vl",
    config=dict(
        text_config=dict(model_type="lfm3", hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=16, max_position_embeddings=4096, sliding_window=64),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                           num_key_value_heads=1, patch_size=8, spatial_merge_size=2, temporal_patch_size=2),
        projector_hidden_size=64, vision_start_token_id="token:<|vision_start|>", vision_end_token_id="token:<|vision_end|>",
        **_QWEN_IDS),
    image_processor=_QWEN_IMAGES,
)

# PaddleOCR-VL: a NaViT SigLIP tower (one frame per image: temporal patch 1), ERNIE-4.5's M-RoPE text model.
PADDLEOCR_VL = dict(
    _QWEN_LIKE,
    model_type="paddleocr_vl",
    config=dict(
        text_config=dict(model_type="paddleocr_vl_text", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=4096,
                         rope_parameters=dict(rope_type="default", rope_theta=10000.0, mrope_section=[4, 2, 2])),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=32,
                           patch_size=8, spatial_merge_size=2),
        vision_start_token_id="token:<|vision_start|>", vision_end_token_id="token:<|vision_end|>", **_QWEN_IDS),
    image_processor=dict(_QWEN_IMAGES, temporal_patch_size=1),
)

# VideoLLaMA 3: a NaViT SigLIP tower without merging (merge 1: one token per 8 px patch), Qwen2 text model.
# 32x32..48x48 px -> 16..36 tokens per image.
VIDEO_LLAMA_3 = dict(
    _QWEN_LIKE,
    model_type="video_llama_3",
    config=dict(text_config=dict(model_type="qwen2", **_TEXT),
                vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, patch_size=8),
                **_QWEN_IDS),
    image_processor=dict(_QWEN_IMAGES, size={"shortest_edge": 32 * 32, "longest_edge": 48 * 48}, temporal_patch_size=1,
                         merge_size=1),
)

# ---------------------------------------------------------------- Pixtral's rows of [IMG] (LightOnOCR: Qwen3 text)
LIGHTON_OCR = dict(
    _QWEN_LIKE,
    model_type="lighton_ocr",
    special_tokens=_QWEN_TOKENS + ("[IMG]", "[IMG_BREAK]", "[IMG_END]"),
    named_tokens={"image_token": "[IMG]", "image_break_token": "[IMG_BREAK]", "image_end_token": "[IMG_END]"},
    chat_template=QWEN3_VL_TEMPLATE.replace("<|vision_start|><|image_pad|><|vision_end|>", "[IMG]"),
    config=dict(text_config=dict(model_type="qwen3", sliding_window=None, **_TEXT),
                vision_config=MISTRAL3["config"]["vision_config"], image_token_id="token:[IMG]", spatial_merge_size=2),
    image_processor=MISTRAL3["image_processor"],
    processor=dict(patch_size=8, spatial_merge_size=2),
)

# ---------------------------------------------------------------- SmolVLM's tiles (Idefics3: the same processor)
# 32 px tiles of 4x4 patches, pixel-shuffled by 2 -> 4 tokens per tile; a 64 px image: 4 tiles + the global one.
IDEFICS3 = dict(
    model_type="idefics3",
    special_tokens=("<|endoftext|>", "<|im_start|>", "<end_of_utterance>", "<fake_token_around_image>", "<image>", "<global-img>",
                    *(f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7))),
    eos="<end_of_utterance>", pad="<|endoftext|>",
    chat_template=_SMOLVLM,
    config=dict(text_config=dict(model_type="llama", **_TEXT),
                vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=32,
                                   patch_size=8),
                image_token_id="token:<image>", scale_factor=2),
    image_processor=dict(size={"longest_edge": 64}, max_image_size={"longest_edge": 32}),
    processor=dict(image_seq_len=4),
)

# ---------------------------------------------------------------- DeepSeek's SigLIP tower and MLP aligner
# Their top-level classes leave get_image_features on the base model (hf/generic.py calls it there).
# Padded to a 32 px square, patch 8 -> 16 tokens per image. "User: ... \n\nAssistant:" as in deepseek-vl-1.3b-chat.
_DEEPSEEK_TOKENS = ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>", "<image_placeholder>")
_DEEPSEEK_TURNS = ("{{ bos_token }}{% for m in messages %}{{ 'User: ' if m['role'] == 'user' else 'Assistant: ' }}"
                   + _content("{IMAGE}") + "\n\n{% endfor %}{% if add_generation_prompt %}Assistant:{% endif %}")
_DEEPSEEK_LIKE = dict(eos="<｜end▁of▁sentence｜>", pad="<｜▁pad▁｜>", bos="<｜begin▁of▁sentence｜>",
                      image_processor=dict(size={"height": 32, "width": 32}, min_size=8), processor=dict(num_image_tokens=16))
DEEPSEEK_VL = dict(
    _DEEPSEEK_LIKE,
    model_type="deepseek_vl",
    special_tokens=_DEEPSEEK_TOKENS,
    named_tokens={"image_token": "<image_placeholder>"},
    chat_template=_DEEPSEEK_TURNS.replace("{IMAGE}", "<image_placeholder>"),
    config=dict(text_config=dict(model_type="llama", **_TEXT), vision_config=dict(_SIGLIP, vision_use_head=False),
                image_token_id="token:<image_placeholder>"),
)

# DeepSeek-VL-Hybrid: DeepSeek-VL's SigLIP tower beside a SAM tower on a 64 px copy of the image (its features
# interpolated and strided down to SigLIP's 4x4 grid), the two joined per token.
DEEPSEEK_VL_HYBRID = dict(
    DEEPSEEK_VL,
    model_type="deepseek_vl_hybrid",
    config=dict(DEEPSEEK_VL["config"],
                high_res_vision_config=dict(model_type="sam_vision_model", hidden_size=32, output_channels=16, mlp_dim=64,
                                            num_hidden_layers=2, num_attention_heads=2, image_size=64, patch_size=8,
                                            window_size=4, global_attn_indexes=[1])),
    image_processor=dict(_DEEPSEEK_LIKE["image_processor"], high_res_size={"height": 64, "width": 64}),
)

# Janus: DeepSeek-VL's layout with <begin_of_image> ... <end_of_image> around the image tokens, and a VQ-VAE for
# image generation beside it (never run here; its GroupNorms need 32 channels).
JANUS = dict(
    _DEEPSEEK_LIKE,
    model_type="janus",
    special_tokens=_DEEPSEEK_TOKENS + ("<begin_of_image>", "<end_of_image>"),
    named_tokens={"image_token": "<image_placeholder>", "boi_token": "<begin_of_image>", "eoi_token": "<end_of_image>"},
    chat_template=_DEEPSEEK_TURNS.replace("{IMAGE}", "<image_placeholder>").replace("'User: '", "'<|User|>: '")
    .replace("'Assistant: '", "'<|Assistant|>: '").replace("%}Assistant:", "%}<|Assistant|>:"),
    config=dict(
        text_config=dict(model_type="llama", **_TEXT),
        vision_config=dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, mlp_ratio=2.0, image_size=32, patch_size=8,
                           projection_dim=64, depth=2, num_image_tokens=16),
        vq_config=dict(embed_dim=8, num_embeddings=64, latent_channels=32, base_channels=32, channel_multiplier=[1, 1],
                       num_res_blocks=1, projection_dim=64, image_token_embed_dim=64),
        image_token_id="token:<image_placeholder>"),
)
