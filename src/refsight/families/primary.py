"""The family entries of the model types built from a recipe of their own (data only).

Qwen2/2.5/3-VL and SmolVLM (``refsight.builtin_models.checkpoints``), the families of
``family_recipes``, the hybrid language models (``hybrid_recipes``), Emu3's codebook
(``codebook_recipes``), and Llama 4 (on llama.cpp only). Registered in :data:`refsight.families.FAMILIES`.
"""

from __future__ import annotations

from .entry import (
    HF_EQUIVALENCE, HF_GENERIC, LLAMA_EQUIVALENCE, LLAMA_FAMILIES, VLLM_EQUIVALENCE, VLLM_FAMILIES, Family,
    LlamaCppFacts, Traits, TransformersFacts, VllmFacts, tiny_name,
)

__all__ = ["PRIMARY"]

_CONVERTER = "llama-cpp-python 0.3.36's convert_hf_to_gguf.py does not convert it"
# Qwen's smart-resize grid and pixel bounds; one tower call for a batch of images.
_QWEN = Traits(options="pixel_bounds", grid=True, batch=True)


def _generic(model_type: str, recipe: str, traits: Traits = Traits(), name: str = "") -> TransformersFacts:
    """A family served by the generic backend, proven by ``test_families`` on its recipe's tiny built-in."""
    return TransformersFacts(name or tiny_name(model_type), HF_GENERIC, recipe=recipe, traits=traits)


def _gguf(model_type: str, name: str = "") -> LlamaCppFacts:
    """A family converted from its transformers recipe, proven by ``test_llamacpp_families``."""
    return LlamaCppFacts(name or tiny_name(model_type, "-gguf"), LLAMA_FAMILIES)


def _vllm(model_type: str, name: str = "", **facts: object) -> VllmFacts:
    """A family's vLLM variant of its recipe, proven by ``test_vllm_families``."""
    return VllmFacts(name or tiny_name(model_type, "-vllm"), VLLM_FAMILIES, **facts)  # type: ignore[arg-type]


#: The entries, Qwen2/2.5/3-VL first (their order is that of vLLM's image-embeddings families).
PRIMARY: tuple[Family, ...] = (
    Family("qwen2_vl", TransformersFacts("tiny-qwen2-vl", HF_EQUIVALENCE, traits=_QWEN),
           LlamaCppFacts("tiny-qwen2-vl-gguf", LLAMA_EQUIVALENCE), VllmFacts("tiny-qwen2-vl-vllm", VLLM_EQUIVALENCE, image_embeds=True)),
    Family("qwen2_5_vl", TransformersFacts("tiny-qwen2.5-vl", HF_EQUIVALENCE, traits=_QWEN),
           LlamaCppFacts("tiny-qwen2.5-vl-gguf", LLAMA_EQUIVALENCE),
           VllmFacts("tiny-qwen2.5-vl-vllm", VLLM_EQUIVALENCE, image_embeds=True)),
    Family("qwen3_vl", TransformersFacts("tiny-qwen3-vl", HF_EQUIVALENCE, traits=_QWEN),
           LlamaCppFacts("tiny-qwen3-vl-gguf", "tests/backends/llamacpp/test_llamacpp_qwen3vl.py"),
           VllmFacts("tiny-qwen3-vl-vllm", VLLM_EQUIVALENCE, image_embeds=True)),
    Family("smolvlm", TransformersFacts("tiny-smolvlm", HF_EQUIVALENCE, traits=Traits(options="tiles")),
           LlamaCppFacts("tiny-smolvlm-gguf", LLAMA_EQUIVALENCE), _vllm("smolvlm")),
    # transformers 5.24's image processor table has no qwen3_vl_moe entry; its checkpoints name Qwen2-VL's.
    Family("qwen3_vl_moe", _generic("qwen3_vl_moe", "family_recipes.QWEN3_VL_MOE", Traits(
        image_processor="Qwen2VLImageProcessorPil", options="pixel_bounds", grid=True, batch=True)),
           vllm=_vllm("qwen3_vl_moe", hub_layout="experts")),
    # Hybrid (Gated DeltaNet + full attention): Qwen3-VL's processor and grid; cached == pixel path in
    # test_families, and the reference state (every linear layer's convolution and recurrent state) reused
    # exactly in test_prefix_cache. On llama.cpp the sequence state saved after the references holds every
    # Gated DeltaNet layer's recurrent and convolution state, restored whole (bit-identical, from disk in a
    # new process). On vLLM: references by uuid and the encoder-cache connector (across a restart) as for every
    # family; the language model's reference state is vLLM's own prefix cache ("align" mode: docs/architecture/vllm.md).
    Family("qwen3_5", _generic("qwen3_5", "hybrid_recipes.QWEN3_5", _QWEN, "tiny-qwen3.5"),
           _gguf("qwen3_5", "tiny-qwen3.5-gguf"), _vllm("qwen3_5", "tiny-qwen3.5-vllm")),
    Family("qwen3_5_moe", _generic("qwen3_5_moe", "hybrid_recipes.QWEN3_5_MOE", _QWEN, "tiny-qwen3.5-moe"),
           _gguf("qwen3_5_moe", "tiny-qwen3.5-moe-gguf"), _vllm("qwen3_5_moe", "tiny-qwen3.5-moe-vllm")),
    Family("gemma3", _generic("gemma3", "family_recipes.GEMMA3", Traits(
        note="token_type_ids rebuilt at prompt time (image tokens attend bidirectionally)")),
           _gguf("gemma3"), _vllm("gemma3", hub_layout="vision_model")),
    # Per-layer inputs and KV-shared layers: the shared layers keep no state (they attend with their producer
    # layer's keys and values), so reference states cover Gemma 4 too (test_prefix_cache). On llama.cpp its state
    # is reused while the prefix fits in the sliding window, never past it (llamacpp/prefix.py).
    Family("gemma4", _generic("gemma4", "hybrid_recipes.GEMMA4"),
           LlamaCppFacts(tiny_name("gemma4", "-gguf"), LLAMA_FAMILIES, architecture="gemma4", window_bound=True),
           _vllm("gemma4")),
    # Encoder-free Gemma 4: transformers 5.24 has only a torchvision image processor for it; refsight's PIL one
    # lays images out identically (Gemma 4's at the model-patch size: pil_processors). A package is the patch
    # embedding (get_image_features' pooler_output: one row per image token, replayed bit-exactly); the reference
    # state is Gemma 4's (no per-layer inputs here), reused exactly (prefix_cache, test_prefix_cache).
    Family("gemma4_unified", _generic("gemma4_unified", "hybrid_recipes.GEMMA4_UNIFIED", Traits(
        image_processor="Gemma4UnifiedImageProcessorPil",
        note="PIL image processor from refsight (Gemma 4's at the model-patch size)"))),
    Family("paligemma", _generic("paligemma", "family_recipes.PALIGEMMA", Traits(
        note="images first, text after <bos> (the processor's own layout); token_type_ids rebuilt")),
           LlamaCppFacts(left_out=_CONVERTER),
           VllmFacts(left_out="vLLM 0.32 takes one image per PaliGemma prompt (paligemma.py get_supported_mm_limits); "
                              "a comparison holds references and a candidate")),
    Family("llava", _generic("llava", "family_recipes.LLAVA"), LlamaCppFacts(left_out=_CONVERTER),
           _vllm("llava", hub_layout="vision_model")),
    Family("llava_next", _generic("llava_next", "family_recipes.LLAVA_NEXT"),
           vllm=_vllm("llava_next", hub_layout="vision_model")),
    # One image alone is tiled any-res ("single" mode); in a prompt of two or more images each is padded to a
    # square tile ("multi" mode). Every compare prompt holds two or more images, so packages are made in multi
    # mode, and the mode is in the key.
    Family("llava_onevision", _generic("llava_onevision", "family_recipes.LLAVA_ONEVISION", Traits(
        multi_image=True, note="packages in multi-image mode (prompts of two or more images)")),
           LlamaCppFacts(left_out=_CONVERTER), _vllm("llava_onevision", hub_layout="vision_model")),
    Family("internvl", _generic("internvl", "family_recipes.INTERNVL"), _gguf("internvl"), _vllm("internvl")),
    Family("aya_vision", _generic("aya_vision", "family_recipes.AYA_VISION"), vllm=VllmFacts(
        left_out="vLLM dropped AyaVisionForConditionalGeneration in 0.24 (registry.py _PREVIOUSLY_SUPPORTED_MODELS)")),
    Family("mistral3", _generic("mistral3", "family_recipes.MISTRAL3"), _gguf("mistral3"), _vllm("mistral3")),
    Family("glm4v", _generic("glm4v", "family_recipes.GLM4V"), _gguf("glm4v"), _vllm("glm4v")),
    Family("glm4v_moe", _generic("glm4v_moe", "family_recipes.GLM4V_MOE", Traits(image_processor="Glm4vImageProcessorPil")),
           vllm=_vllm("glm4v_moe")),
    Family("minicpmv4_6", _generic("minicpmv4_6", "family_recipes.MINICPMV4_6"), _gguf("minicpmv4_6"), _vllm("minicpmv4_6")),
    # Image features that are codebook tokens: Emu3's VQ-VAE codes, mapped into the text vocabulary through
    # config.vocabulary_map and embedded by the language model's own table (get_image_features' pooler_output,
    # one tensor per image: the defaults fit). Its image processor pads a call's images to the largest, and the
    # padding changes the codes of the smaller ones (the VQ-VAE's group norms and attention see it); refsight
    # encodes each image alone, so its codes are those of the image in a call of its own (or among images of its size).
    Family("emu3", _generic("emu3", "codebook_recipes.EMU3", Traits(
        note="each image encoded alone: transformers' batch of mixed sizes pads them, which moves some codes"))),
    # Features in last_hidden_state. transformers 5.24's Llama4ForConditionalGeneration.forward raises
    # "'MoeCausalLMOutputWithPast' object has no attribute 'image_outputs'" on every call, and its only image
    # processor needs torchvision: not served until transformers fixes the forward. Its GGUF is converted from the
    # transformers-side prototype (gguf_families).
    Family("llama4", TransformersFacts(
        left_out="transformers 5.24's Llama4ForConditionalGeneration.forward raises 'MoeCausalLMOutputWithPast' object "
                 "has no attribute 'image_outputs', and its only image processor needs torchvision",
        traits=Traits(features="last_hidden_state", unavailable=(
            "transformers 5.24's Llama4ForConditionalGeneration.forward is broken ('MoeCausalLMOutputWithPast' object has "
            "no attribute 'image_outputs') and its only image processor needs torchvision"))),
           _gguf("llama4")),
)
