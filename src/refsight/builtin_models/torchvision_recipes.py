"""The recipes of the built-in checkpoints whose only image processor needs torchvision (data only).

LFM2-VL, Command A Vision (``cohere2_vision``), Kimi K2.5, Step 3.7 and Molmo 2.

transformers 5.24 has no PIL image processor for these model types: their checkpoints name a
torchvision one, so refsight serves them where torchvision imports (``refsight/support/torchvision_cpu.py``
lets PyPI's CUDA-built torchvision import beside the CPU torch) and the test extras install it.
Their ``preprocessor_config.json`` is written as data by
:func:`~refsight.builtin_models.family_checkpoints.build_family_checkpoint`, so building one needs
no torchvision. Sizes as in :mod:`.family_recipes`: text hidden 64, 2 layers; vision hidden 32,
2 layers; a few dozen tokens per image.
"""

from __future__ import annotations

# ruff: noqa: E501  (chat templates read best on one line each)

from .family_recipes import _SIGLIP, _TEXT, _content

# One recipe per model type, named by its family entry (refsight.families: transformers.recipe).
__all__ = ["LFM2_VL", "COHERE2_VISION", "KIMI_K25", "STEP3P7", "MOLMO2"]

# LFM2-VL: SigLIP2 NaFlex tower, pixel-unshuffle projector, LFM2 hybrid text model (short convolutions +
# attention). Its processor splits an image into 32 px tiles plus a thumbnail, each rendered between
# <|image_start|> ... <|image_end|> with <|img_row_R_col_C|> markers.
LFM2_VL = dict(
    model_type="lfm2_vl",
    special_tokens=("<|pad|>", "<|startoftext|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<image>",
                    "<|image_start|>", "<|image_end|>", "<|img_thumbnail|>",
                    *(f"<|img_row_{r}_col_{c}|>" for r in range(1, 5) for c in range(1, 5))),
    eos="<|im_end|>", pad="<|pad|>", bos="<|startoftext|>",
    named_tokens={"image_token": "<image>", "image_start_token": "<|image_start|>", "image_end_token": "<|image_end|>",
                  "image_thumbnail_token": "<|img_thumbnail|>"},
    chat_template=(
        "{{ bos_token }}{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
        "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for c in m['content'] %}"
        "{% if c['type']=='image' %}<image>{% else %}{{ c['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"),
    config=dict(
        text_config=dict(model_type="lfm2", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                         layer_types=["conv", "full_attention"], block_auto_adjust_ff_dim=False),
        vision_config=dict(model_type="siglip2_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=2, patch_size=4, num_patches=64, vision_use_head=False),
        image_token_id="token:<image>", projector_hidden_size=64, downsample_factor=2),
    image_processor=dict(encoder_patch_size=4, downsample_factor=2, tile_size=32, min_image_tokens=4, max_image_tokens=16,
                         min_tiles=2, max_tiles=4, use_thumbnail=True, max_pixels_tolerance=2.0, do_image_splitting=True,
                         image_mean=[0.5] * 3, image_std=[0.5] * 3),
)

# Command A Vision (cohere2_vision): a SigLIP tower, pixel-shuffle by 2 and a SwiGLU aligner into Cohere2 text.
# The template renders an image as <|IMG_PATCH|>; the processor expands it to <|START_OF_IMG|>, then per tile
# (InternVL-style crops plus a thumbnail) patch_size² <|IMG_PATCH|> and <|IMG_LINE_BREAK|>, then <|END_OF_IMG|>.
# 32 px tiles / patch 8 = 4x4 patches, shuffled by 2 -> 2x2 = 4 tokens a tile (the image processor's patch_size 2).
COHERE2_VISION = dict(
    model_type="cohere2_vision",
    special_tokens=("<PAD>", "<UNK>", "<BOS_TOKEN>", "<|END_OF_TURN_TOKEN|>", "<|START_OF_TURN_TOKEN|>", "<|USER_TOKEN|>",
                    "<|CHATBOT_TOKEN|>", "<|SYSTEM_TOKEN|>", "<|START_OF_IMG|>", "<|END_OF_IMG|>", "<|IMG_PATCH|>",
                    "<|IMG_LINE_BREAK|>"),
    eos="<|END_OF_TURN_TOKEN|>", pad="<PAD>", bos="<BOS_TOKEN>",
    named_tokens={"image_token": "<|IMG_PATCH|>", "boi_token": "<|START_OF_IMG|>", "eoi_token": "<|END_OF_IMG|>",
                  "img_line_break_token": "<|IMG_LINE_BREAK|>"},
    chat_template=("{{ bos_token }}{% for m in messages %}<|START_OF_TURN_TOKEN|>"
                   "{{ '<|CHATBOT_TOKEN|>' if m['role']=='assistant' else '<|SYSTEM_TOKEN|>' if m['role']=='system' else '<|USER_TOKEN|>' }}"
                   + _content("<|IMG_PATCH|>") +
                   "<|END_OF_TURN_TOKEN|>{% endfor %}{% if add_generation_prompt %}<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>{% endif %}"),
    config=dict(
        text_config=dict(model_type="cohere2", sliding_window=64, **_TEXT),
        vision_config=dict(_SIGLIP, vision_use_head=False),
        image_token_id="token:<|IMG_PATCH|>", downsample_factor=2, alignment_intermediate_size=64),
    image_processor=dict(size={"height": 32, "width": 32}, crop_to_patches=True, min_patches=1, max_patches=4, patch_size=2,
                         image_mean=[0.5] * 3, image_std=[0.5] * 3),
)

# Kimi K2.5 (kimi_k25): MoonViT (NaViT patches, 2x2 merge, image_grid_thw as Qwen's) and a DeepSeek-V3 language
# model (MLA attention with a low-rank query as the real one has: a plain q_proj would meet the checkpoint
# conversion's vision-only RoPE permutation, which matches every q_proj; routed + shared experts). An image renders as <|media_begin|>image<|media_content|>
# <|media_pad|><|media_end|>; the processor repeats <|media_pad|> once per merged 2x2 patch (patch 8 px: one
# token per 16 px, at most 64 patches -> 16 tokens an image).
KIMI_K25 = dict(
    model_type="kimi_k25",
    special_tokens=("[PAD]", "[BOS]", "[EOS]", "<|im_end|>", "<|im_user|>", "<|im_assistant|>", "<|im_system|>",
                    "<|im_middle|>", "<|media_begin|>", "<|media_content|>", "<|media_end|>", "<|media_pad|>",
                    "<|kimi_k25_video_placeholder|>"),
    eos="<|im_end|>", pad="[PAD]", bos="[BOS]",
    named_tokens={"image_token": "<|media_pad|>", "video_token": "<|kimi_k25_video_placeholder|>"},
    chat_template=("{% for m in messages %}"
                   "{{ '<|im_assistant|>' if m['role']=='assistant' else '<|im_system|>' if m['role']=='system' else '<|im_user|>' }}"
                   "{{ m['role'] }}<|im_middle|>"
                   + _content("<|media_begin|>image<|media_content|><|media_pad|><|media_end|>") +
                   "<|im_end|>{% endfor %}{% if add_generation_prompt %}<|im_assistant|>assistant<|im_middle|>{% endif %}"),
    config=dict(
        text_config=dict(model_type="deepseek_v3", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=4096, q_lora_rank=16,
                         kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=16, moe_intermediate_size=32,
                         n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1,
                         n_group=1, topk_group=1),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, patch_size=8,
                           pos_emb_height=16, pos_emb_width=16),
        projection_hidden_size=32,
        image_token_id="token:<|media_pad|>", video_token_id="token:<|kimi_k25_video_placeholder|>",
        vision_start_token_id="token:<|media_begin|>", vision_end_token_id="token:<|media_end|>"),
    image_processor=dict(size={"max_height": 128, "max_width": 128}, max_patches=64, patch_size=8, merge_size=2,
                         image_mean=[0.5] * 3, image_std=[0.5] * 3),
)

# Step 3.7 (step3p7): a ViT with two stride-2 downsampling convolutions (16 px a token at patch 4) and a Step 3.5
# language model (sliding and full attention layers, dense then routed experts). The template renders an image as
# <im_patch>; the processor expands it to a global 32 px view (<im_start> 4 x <im_patch> <im_end>) after any
# 32 px local crops (<patch_start> ... <patch_end>, <patch_newline> at a row's end) of images up to 64 px.
STEP3P7 = dict(
    model_type="step3p7",
    special_tokens=("<|pad|>", "<|begin|>", "<|im_end|>", "<|im_start|>", "<im_patch>", "<im_start>", "<im_end>",
                    "<patch_start>", "<patch_end>", "<patch_newline>"),
    eos="<|im_end|>", pad="<|pad|>", bos="<|begin|>",
    chat_template=("{{ bos_token }}{% for m in messages %}<|im_start|>{{ m['role'] }}\n" + _content("<im_patch>") +
                   "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"),
    config=dict(
        text_config=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=16, max_position_embeddings=4096, num_local_experts=4,
                         num_experts_per_tok=2, moe_intermediate_size=32, n_routed_experts=4, share_expert_dim=32,
                         layer_types=["sliding_attention", "full_attention"], sliding_window=64,
                         mlp_layer_types=["dense", "sparse"]),
        vision_config=dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, image_size=32, patch_size=4,
                           mlp_ratio=2.0, max_position_embeddings=64),
        image_token_id="token:<im_patch>"),
    image_processor=dict(size={"height": 32, "width": 32}, patch_size=32, max_image_size=64, vision_patch_size=4,
                         downsampler_stride=4),
)

# Molmo 2 (molmo2): a SigLIP-like ViT read at two layers, an attention-pooling adapter (2x2 patches to a token) and
# an OLMo/Qwen-style language model. The template renders an image as <|image|>; the processor expands it to a
# low-resolution view (<low_res_im_start> rows of <im_patch> each closed by <im_col>, <im_end>) and then the
# overlapping high-resolution crops the same way (<im_start> ... <im_end>). 32 px crops of 4 px patches pooled 2x2:
# 4x4 tokens a crop, at most 2 crops.
MOLMO2 = dict(
    model_type="molmo2",
    special_tokens=("<|pad|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|image|>", "<|video|>", "<im_patch>",
                    "<im_col>", "<im_start>", "<low_res_im_start>", "<frame_start>", "<im_end>", "<frame_end>", "<im_low>"),
    eos="<|im_end|>", pad="<|pad|>", bos="<|endoftext|>",
    named_tokens={"image_token": "<|image|>", "video_token": "<|video|>"},
    # The template starts with the BOS token, as allenai's fixed templates do (Molmo2Processor prepends one to a
    # prompt without it: refsight renders prompts itself).
    chat_template=("{{ bos_token }}{% for m in messages %}<|im_start|>{{ m['role'] }}\n" + _content("<|image|>") +
                   "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"),
    config=dict(
        text_config=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=16, max_position_embeddings=4096, additional_vocab_size=0),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                           num_key_value_heads=2, head_dim=16, image_size=[32, 32], patch_size=4),
        adapter_config=dict(vision_feature_layer=[-1, -2], hidden_size=32, num_attention_heads=2, num_key_value_heads=2,
                            head_dim=16, intermediate_size=64, text_hidden_size=64),
        image_start_token_id="token:<im_start>", low_res_image_start_token_id="token:<low_res_im_start>",
        image_end_token_id="token:<im_end>", image_patch_id="token:<im_patch>",
        frame_start_token_id="token:<frame_start>", frame_end_token_id="token:<frame_end>"),
    image_processor=dict(size={"height": 32, "width": 32}, patch_size=4, pooling_size=[2, 2], overlap_margins=[1, 1],
                         max_crops=2),
)
