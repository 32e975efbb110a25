"""The recipes of the built-in checkpoints whose language model is not plain attention (data only).

Qwen3.5 and Qwen3.5-MoE (``qwen3_5``, ``qwen3_5_moe``): natively multimodal, a Qwen3-VL-style
vision tower (no deepstack) and a **hybrid** language model: three of every four layers are
Gated DeltaNet linear attention (a causal convolution and a recurrent state), the fourth full
attention with M-RoPE. The tiny ones keep that pattern (4 text layers: linear, linear, linear,
full), Qwen's smart-resize grid and Qwen3-VL's template and tokens.

Gemma 4 (``gemma4``): sliding-window and full-attention layers of different head sizes, per-layer
inputs (a second, per-layer token embedding added inside every layer) and KV-shared layers (the
last layers attend with the keys and values of the last unshared layer of their type). The tiny
one has all three: 4 text layers (sliding, full, sliding, full), the last two shared.

Encoder-free Gemma 4 (``gemma4_unified``): Gemma 4's text layers without per-layer inputs (the
tiny one: sliding, full, sliding, full, the last two shared; image tokens attend both ways
inside an image in the sliding layers) and no vision tower: raw model patches embedded.

Keyword arguments of a :class:`~refsight.builtin_models.family_checkpoints.FamilySpec`, as in
:mod:`.family_recipes`.
"""

from __future__ import annotations

from .family_recipes import QWEN3_VL_MOE, _content

# One recipe per model type, named by its family entry (refsight.families: transformers.recipe).
__all__ = ["QWEN3_5", "QWEN3_5_MOE", "GEMMA4", "GEMMA4_UNIFIED", "HYBRID_SHAPE_RECIPES"]

# Text hidden 64, 4 layers (three Gated DeltaNet, one full attention: Qwen3.5's own interval of 4), head dim
# 16 with half of it rotary (4 frequencies split t/h/w by the interleaved mrope_section), linear heads 2 key /
# 4 value of 16.
_QWEN3_5_TEXT = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
    max_position_embeddings=4096, linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16,
    linear_num_key_heads=2, linear_num_value_heads=4,
    rope_parameters=dict(rope_type="default", rope_theta=10000000.0, partial_rotary_factor=0.5, mrope_section=[2, 1, 1],
                         mrope_interleaved=True),
)
# Qwen3-VL's tower without deepstack: patch 8, merge 2 -> one token per 16 px.
_QWEN3_5_VISION = dict(hidden_size=32, intermediate_size=64, depth=2, num_heads=2, patch_size=8, spatial_merge_size=2,
                       temporal_patch_size=2, out_hidden_size=64, num_position_embeddings=16)

QWEN3_5 = dict(
    QWEN3_VL_MOE,
    model_type="qwen3_5",
    image_processor_class=None,  # transformers' table names Qwen3.5's own
    name="tiny-qwen3.5",
    config=dict(QWEN3_VL_MOE["config"], text_config=_QWEN3_5_TEXT, vision_config=_QWEN3_5_VISION),
)

# Qwen3.5-MoE: the same hybrid pattern with a routed MLP (4 experts, 2 per token) and a shared expert in every layer.
QWEN3_5_MOE = dict(
    QWEN3_5,
    model_type="qwen3_5_moe",
    name="tiny-qwen3.5-moe",
    config=dict(QWEN3_5["config"], text_config=dict(
        {k: v for k, v in _QWEN3_5_TEXT.items() if k != "intermediate_size"},
        moe_intermediate_size=32, shared_expert_intermediate_size=32, num_experts=4, num_experts_per_tok=2)),
)

# Gemma 4: "<|turn>user\n...<turn|>\n", each image "<|image|>", which the processor expands to
# <|image> + <|image|> * n + <image|>. Vision patch 4, pooling 3 (one token per 12 px) and the smallest
# budget Gemma 4's image processor takes (70 soft tokens): 40-70 tokens per photo here.
GEMMA4 = dict(
    model_type="gemma4",
    special_tokens=("<pad>", "<eos>", "<bos>", "<|turn>", "<turn|>", "<|image>", "<image|>", "<|image|>", "<|video|>",
                    "<|audio>", "<audio|>", "<|audio|>"),
    eos="<eos>", pad="<pad>", bos="<bos>",
    # The audio tokens too: transformers 5.24's Gemma4Processor.validate_inputs refuses every call without
    # boa/eoa tokens (an operator-precedence slip), and real Gemma 4 tokenizers have them.
    named_tokens={"boi_token": "<|image>", "eoi_token": "<image|>", "image_token": "<|image|>", "boa_token": "<|audio>",
                  "eoa_token": "<audio|>", "audio_token": "<|audio|>"},
    chat_template=(
        "{{ bos_token }}{% for m in messages %}<|turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n"
        + _content("<|image|>") + "<turn|>\n{% endfor %}{% if add_generation_prompt %}<|turn>model\n{% endif %}"
    ),
    config=dict(
        text_config=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=16, global_head_dim=32, max_position_embeddings=4096, sliding_window=64,
                         layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
                         num_kv_shared_layers=2, hidden_size_per_layer_input=16, vocab_size_per_layer_input=1024),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                           head_dim=16, patch_size=4, pooling_kernel_size=3, position_embedding_size=64),
        boi_token_id="token:<|image>", eoi_token_id="token:<image|>", image_token_id="token:<|image|>",
        video_token_id="token:<|video|>", boa_token_id="token:<|audio>", eoa_token_index="token:<audio|>",
        audio_token_id="token:<|audio|>", audio_config=None),
    image_processor=dict(patch_size=4, max_soft_tokens=70, pooling_kernel_size=3, image_mean=[0.5] * 3, image_std=[0.5] * 3),
    processor=dict(image_seq_length=70),
)

# Encoder-free Gemma 4 (gemma4_unified): no vision tower, each 12 px model patch (patch 4, merged 3×3) projected
# straight into the language model; 40-70 tokens per photo at the smallest budget (70). Gemma 4's tokens and
# template, its text layers without per-layer inputs. The checkpoint names transformers' torchvision image
# processor, as a real one does (refsight loads its PIL twin: backends/hf/pil_processors.py).
GEMMA4_UNIFIED = dict(
    GEMMA4,
    model_type="gemma4_unified",
    config=dict(
        {k: v for k, v in GEMMA4["config"].items() if k not in ("text_config", "vision_config")},
        text_config={k: v for k, v in GEMMA4["config"]["text_config"].items()
                     if k not in ("hidden_size_per_layer_input", "vocab_size_per_layer_input")},
        vision_config=dict(patch_size=4, pooling_kernel_size=3, mm_embed_dim=32, output_proj_dims=32, mm_posemb_size=64),
    ),
    image_processor=dict(patch_size=4, max_soft_tokens=70, pooling_kernel_size=3),
)

# Qwen3.5-0.8B's whole shape (Qwen/Qwen3.5-0.8B's published config), the smallest Qwen3.5 with a vision tower:
# the 12-layer tower (hidden 768, MLP 3072, 12 heads, patch 16, merge 2 -> one token per 32 px, out 1024) and the
# 24-layer hybrid language model (hidden 1024, MLP 3584; 18 Gated DeltaNet layers of 16 key / 16 value heads of
# 128, kernel 4; 6 full-attention layers of 8 heads, 2 KV heads, head dim 256, a quarter of it rotary, M-RoPE
# [11, 11, 10] interleaved), tied embeddings of the real 248,320 rows, random weights in bf16 (~1.6 GB). Only the
# tokenizer is the small built-in one.
QWEN3_5_0_8B_SHAPE = dict(
    QWEN3_5,
    name=None,
    config=dict(
        QWEN3_5["config"],
        tie_word_embeddings=True,
        text_config=dict(
            hidden_size=1024, intermediate_size=3584, num_hidden_layers=24, num_attention_heads=8, num_key_value_heads=2,
            head_dim=256, max_position_embeddings=262144, linear_conv_kernel_dim=4, linear_key_head_dim=128,
            linear_value_head_dim=128, linear_num_key_heads=16, linear_num_value_heads=16, tie_word_embeddings=True,
            rope_parameters=dict(rope_type="default", rope_theta=10000000.0, partial_rotary_factor=0.25,
                                 mrope_section=[11, 11, 10], mrope_interleaved=True)),
        vision_config=dict(hidden_size=768, intermediate_size=3072, depth=12, num_heads=12, patch_size=16,
                           spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=1024, num_position_embeddings=2304),
    ),
    image_processor=dict(size={"shortest_edge": 65536, "longest_edge": 16777216}, patch_size=16, temporal_patch_size=2,
                         merge_size=2, image_mean=[0.5] * 3, image_std=[0.5] * 3),
    save_dtype="bfloat16",
    vocab_size=248320,
)

#: Real-shape checkpoints of the hybrid families (benchmarks), by built-in name.
HYBRID_SHAPE_RECIPES: dict[str, dict] = {"shape-qwen3.5-0.8b": QWEN3_5_0_8B_SHAPE}
