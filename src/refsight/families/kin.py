"""The family entries of the model types built like an earlier family, those whose only image processor
needs torchvision, and those served on no runtime here (data only).

Their tiny recipes are ``refsight.builtin_models``' ``kin_recipes`` and ``torchvision_recipes``.
Registered in :data:`refsight.families.FAMILIES`.
"""

from __future__ import annotations

from .entry import HF_GENERIC, LLAMA_FAMILIES, VLLM_FAMILIES, Family, LlamaCppFacts, Traits, TransformersFacts, VllmFacts, tiny_name

__all__ = ["KIN", "TORCHVISION_ONLY", "LEFT_OUT"]


def _kin(model_type: str, recipes: str, traits: Traits = Traits(), vllm: str = "") -> Family:
    """A family proven by ``test_families`` on the tiny built-in of ``recipes``' constant for it; on vLLM proven
    by ``test_vllm_families`` or left out for the reason ``vllm`` ("proven": its ``-vllm`` variant)."""
    transformers = TransformersFacts(tiny_name(model_type), HF_GENERIC, recipe=f"{recipes}.{model_type.upper()}",
                                     traits=traits)
    if vllm == "proven":
        return Family(model_type, transformers, vllm=VllmFacts(tiny_name(model_type, "-vllm"), VLLM_FAMILIES))
    return Family(model_type, transformers, vllm=VllmFacts(left_out=vllm))


def _unregistered(arch: str) -> str:
    return f"vLLM 0.32 registers no {arch}"


#: Built like an earlier family, with the model type's own config (kin_recipes).
KIN: tuple[Family, ...] = (
    _kin("vipllava", "kin_recipes", vllm=_unregistered("VipLlavaForConditionalGeneration")),
    _kin("video_llava", "kin_recipes", vllm=_unregistered("VideoLlavaForConditionalGeneration")),
    _kin("llava_next_video", "kin_recipes", vllm="vLLM 0.32's LlavaNextVideoForConditionalGeneration takes videos only "
                                                 "(llava_next_video.py get_supported_mm_limits)"),
    _kin("glm46v", "kin_recipes", vllm=_unregistered("Glm46VForConditionalGeneration")),
    _kin("exaone4_5", "kin_recipes", vllm="proven"),
    _kin("lfm3_vl", "kin_recipes", vllm=_unregistered("Lfm3VlForConditionalGeneration")),
    _kin("paddleocr_vl", "kin_recipes", vllm="proven"),
    _kin("video_llama_3", "kin_recipes", vllm=_unregistered("VideoLlama3ForConditionalGeneration")),
    _kin("lighton_ocr", "kin_recipes", vllm="vLLM 0.32's LightOnOCRForConditionalGeneration takes the original "
                                            "checkpoints' Mistral3Config, not transformers' lighton_ocr config (lightonocr.py)"),
    _kin("idefics3", "kin_recipes", Traits(options="tiles"), vllm="proven"),
    _kin("deepseek_vl", "kin_recipes"),
    _kin("deepseek_vl_hybrid", "kin_recipes"),
    _kin("janus", "kin_recipes"),
)

# Only a torchvision image processor in transformers 5.24: served with it (the test extras install torchvision;
# refsight/support/torchvision_cpu.py lets PyPI's CUDA wheel import beside the CPU torch).
#: The families whose only image processor needs torchvision (torchvision_recipes).
TORCHVISION_ONLY: tuple[Family, ...] = (
    Family("lfm2_vl", TransformersFacts(tiny_name("lfm2_vl"), HF_GENERIC, recipe="torchvision_recipes.LFM2_VL"),
           LlamaCppFacts(tiny_name("lfm2_vl", "-gguf"), LLAMA_FAMILIES)),
    _kin("cohere2_vision", "torchvision_recipes"),
    _kin("kimi_k25", "torchvision_recipes"),
    _kin("step3p7", "torchvision_recipes"),
    # Molmo 2's image tokens attend to each other across every image of the prompt (one bidirectional block, at
    # prefill): a reference's keys and values depend on the candidate after it, so no state stops at the references.
    _kin("molmo2", "torchvision_recipes", Traits(
        no_prefix="image tokens attend to every image of the prompt (one bidirectional block), the candidate's too",
        note="no reference-prefix states: image tokens attend across all the prompt's images")),
)

_TIMM = "timm is no refsight dependency, so CI cannot build"

#: The model types served on no runtime here, each with the reason.
LEFT_OUT: tuple[Family, ...] = (
    Family("mllama", TransformersFacts(
        left_out="cross-attention images: MllamaForConditionalGeneration has neither get_image_features nor "
                 "mm_encoder_outputs (its text layers cross-attend to the tower's output), so no seam to cache"),
           vllm=VllmFacts(left_out="vLLM dropped MllamaForConditionalGeneration in 0.10.2 (registry.py "
                                   "_PREVIOUSLY_SUPPORTED_MODELS)")),
    Family("fuyu", TransformersFacts(
        left_out="FuyuProcessor takes one image per prompt and places it before the text itself (prepare_inputs_layout "
                 "prepends |SPEAKER| to each text and zips one image with it); refsight's prompts hold references and "
                 "a candidate")),
    Family("florence2", TransformersFacts(
        left_out="Florence2ForConditionalGeneration (an encoder-decoder) has no mm_encoder_outputs: no "
                 "precomputed-features seam")),
    Family("got_ocr2", TransformersFacts(
        left_out="GotOcr2Processor refuses more than one image per prompt unless multi_page, which reads them as the "
                 "pages of one document; refsight's prompts hold references and a candidate")),
    Family("shieldgemma2", TransformersFacts(
        left_out="ShieldGemma2Processor is a one-image policy classifier: its __call__ ignores the text, writes its own "
                 "policy prompts and refuses a second image (its model is Gemma 3's: gemma3)")),
    Family("idefics2", TransformersFacts(
        left_out="its processor has no replace_image_token (it expands images from the text alone)")),
    Family("gemma3n", TransformersFacts(
        left_out=f"its vision tower is timm's MobileNetV5 (TimmWrapperModel); {_TIMM} one"),
           LlamaCppFacts(left_out="convert_hf_to_gguf.py converts its mmproj from the timm MobileNetV5 tower (with the "
                                  f"audio tower); {_TIMM} a checkpoint to convert")),
)
