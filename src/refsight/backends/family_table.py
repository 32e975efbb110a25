"""The family table: which model types run on which runtime, and the test that proves each.

A cell is proven when a test in CI shows the cached path equal to the runtime's own pixel
path for that model type (tokens and logits, one and two images) through a built-in tiny
checkpoint. ``refsight models`` prints this table and the README carries it; the
architecture test checks that every test named here exists.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Proof", "PROOFS", "RUNTIMES", "proven_model_types", "family_rows", "NOT_SERVED", "markdown_table"]

RUNTIMES = ("transformers", "llama.cpp", "vllm")

# Qwen and SmolVLM: their pixel path written out by hand from the image processor (test_equivalence), the
# other families: through the processor itself (test_families). Both through the one generic backend.
_HF_EQUIVALENCE = "tests/backends/test_equivalence.py"
_HF_GENERIC = "tests/backends/test_families.py"
_LLAMA = "tests/backends/llamacpp/test_llamacpp_equivalence.py"
_LLAMA_FAMILIES = "tests/backends/llamacpp/test_llamacpp_families.py"
_VLLM = "tests/backends/vllm/test_vllm_equivalence.py"
_VLLM_FAMILIES = "tests/backends/vllm/test_vllm_families.py"


@dataclass(frozen=True)
class Proof:
    """One proven cell: the model type, the runtime, the built-in model and the test."""

    model_type: str
    runtime: str
    model: str
    test: str


_GENERIC = ("gemma3", "llava", "llava_next", "llava_onevision", "paligemma", "internvl", "aya_vision", "mistral3", "glm4v",
            "glm4v_moe", "minicpmv4_6", "qwen3_vl_moe")

# Built like an earlier family, with the model type's own config (kin_recipes).
_KIN = ("vipllava", "video_llava", "llava_next_video", "glm46v", "exaone4_5", "lfm3_vl", "paddleocr_vl", "video_llama_3",
        "lighton_ocr", "idefics3", "deepseek_vl", "deepseek_vl_hybrid", "janus")

# Their only image processor needs torchvision (torchvision_recipes).
_TORCHVISION_ONLY = ("lfm2_vl", "cohere2_vision", "kimi_k25", "step3p7", "molmo2")

PROOFS: tuple[Proof, ...] = (
    Proof("qwen2_vl", "transformers", "tiny-qwen2-vl", _HF_EQUIVALENCE),
    Proof("qwen2_5_vl", "transformers", "tiny-qwen2.5-vl", _HF_EQUIVALENCE),
    Proof("qwen3_vl", "transformers", "tiny-qwen3-vl", _HF_EQUIVALENCE),
    Proof("smolvlm", "transformers", "tiny-smolvlm", _HF_EQUIVALENCE),
    *(Proof(t, "transformers", f"tiny-{t.replace('_', '-')}", _HF_GENERIC) for t in _GENERIC),
    *(Proof(t, "transformers", f"tiny-{t.replace('_', '-')}", _HF_GENERIC) for t in _KIN),
    # Hybrid (Gated DeltaNet + full attention): cached == pixel path in test_families, and the reference
    # state (every linear layer's convolution and recurrent state) reused exactly in test_prefix_cache.
    Proof("qwen3_5", "transformers", "tiny-qwen3.5", _HF_GENERIC),
    Proof("qwen3_5_moe", "transformers", "tiny-qwen3.5-moe", _HF_GENERIC),
    # Per-layer inputs and KV-shared layers: the shared layers keep no state (they attend with their
    # producer layer's keys and values), so reference states cover Gemma 4 too (test_prefix_cache).
    Proof("gemma4", "transformers", "tiny-gemma4", _HF_GENERIC),
    # Encoder-free Gemma 4: a package is the patch embedding (get_image_features' pooler_output, replayed
    # bit-exactly); the state is Gemma 4's (no per-layer inputs here), reused exactly (test_prefix_cache).
    Proof("gemma4_unified", "transformers", "tiny-gemma4-unified", _HF_GENERIC),
    # Only a torchvision image processor in transformers 5.24: served with it (the test extras install
    # torchvision; refsight/torchvision_cpu.py lets PyPI's CUDA wheel import beside the CPU torch).
    *(Proof(t, "transformers", f"tiny-{t.replace('_', '-')}", _HF_GENERIC) for t in _TORCHVISION_ONLY),
    # Image features that are codebook tokens: Emu3's VQ-VAE codes, mapped into the text vocabulary through
    # config.vocabulary_map and embedded by the language model's own table (codebook_recipes).
    Proof("emu3", "transformers", "tiny-emu3", _HF_GENERIC),
    Proof("qwen2_vl", "llama.cpp", "tiny-qwen2-vl-gguf", _LLAMA),
    Proof("qwen2_5_vl", "llama.cpp", "tiny-qwen2.5-vl-gguf", _LLAMA),
    Proof("smolvlm", "llama.cpp", "tiny-smolvlm-gguf", _LLAMA),
    Proof("qwen3_vl", "llama.cpp", "tiny-qwen3-vl-gguf", "tests/backends/llamacpp/test_llamacpp_qwen3vl.py"),
    *(Proof(t, "llama.cpp", f"tiny-{t.replace('_', '-')}-gguf", _LLAMA_FAMILIES)
      for t in ("gemma3", "internvl", "mistral3", "lfm2_vl", "llama4", "glm4v", "minicpmv4_6")),
    # Hybrids on llama.cpp: the sequence state saved after the references holds every Gated DeltaNet layer's
    # recurrent and convolution state, restored whole (bit-identical, from disk in a new process).
    Proof("qwen3_5", "llama.cpp", "tiny-qwen3.5-gguf", _LLAMA_FAMILIES),
    Proof("qwen3_5_moe", "llama.cpp", "tiny-qwen3.5-moe-gguf", _LLAMA_FAMILIES),
    # Gemma 4's state is reused while the prefix fits in the sliding window, never past it (llamacpp/prefix.py).
    Proof("gemma4", "llama.cpp", "tiny-gemma4-gguf", _LLAMA_FAMILIES),
    Proof("qwen2_vl", "vllm", "tiny-qwen2-vl-vllm", _VLLM),
    Proof("qwen2_5_vl", "vllm", "tiny-qwen2.5-vl-vllm", _VLLM),
    Proof("qwen3_vl", "vllm", "tiny-qwen3-vl-vllm", _VLLM),
    *(Proof(t, "vllm", f"tiny-{t}-vllm", _VLLM_FAMILIES) for t in ("gemma3", "llava", "internvl", "mistral3", "smolvlm")),
    Proof("llava_next", "vllm", "tiny-llava-next-vllm", _VLLM_FAMILIES),
    Proof("llava_onevision", "vllm", "tiny-llava-onevision-vllm", _VLLM_FAMILIES),
    # Hybrid on vLLM: references by uuid and the encoder-cache connector (across a restart) as for every
    # family; the language model's reference state is vLLM's own prefix cache ("align" mode: docs/architecture/vllm.md).
    Proof("qwen3_5", "vllm", "tiny-qwen3.5-vllm", _VLLM_FAMILIES),
    Proof("qwen3_5_moe", "vllm", "tiny-qwen3.5-moe-vllm", _VLLM_FAMILIES),
    *(Proof(t, "vllm", f"tiny-{t.replace('_', '-')}-vllm", _VLLM_FAMILIES)
      for t in ("qwen3_vl_moe", "glm4v", "glm4v_moe", "paddleocr_vl", "exaone4_5", "idefics3", "minicpmv4_6", "gemma4")),
)

_CONVERTER = "llama-cpp-python 0.3.36's convert_hf_to_gguf.py does not convert it"

#: Model types that cannot be served on a runtime here, with the reason (shown in the table).
NOT_SERVED: dict[tuple[str, str], str] = {
    ("llama4", "transformers"): "transformers 5.24's Llama4ForConditionalGeneration.forward raises "
                                "'MoeCausalLMOutputWithPast' object has no attribute 'image_outputs', and its only image "
                                "processor needs torchvision",
    ("mllama", "transformers"): "cross-attention images: MllamaForConditionalGeneration has neither get_image_features nor "
                                "mm_encoder_outputs (its text layers cross-attend to the tower's output), so no seam to cache",
    ("fuyu", "transformers"): "FuyuProcessor takes one image per prompt and places it before the text itself "
                              "(prepare_inputs_layout prepends |SPEAKER| to each text and zips one image with it); "
                              "refsight's prompts hold references and a candidate",
    ("florence2", "transformers"): "Florence2ForConditionalGeneration (an encoder-decoder) has no mm_encoder_outputs: no "
                                   "precomputed-features seam",
    ("got_ocr2", "transformers"): "GotOcr2Processor refuses more than one image per prompt unless multi_page, which reads them "
                                  "as the pages of one document; refsight's prompts hold references and a candidate",
    ("shieldgemma2", "transformers"): "ShieldGemma2Processor is a one-image policy classifier: its __call__ ignores the text, "
                                      "writes its own policy prompts and refuses a second image (its model is Gemma 3's: gemma3)",
    ("idefics2", "transformers"): "its processor has no replace_image_token (it expands images from the text alone)",
    ("gemma3n", "transformers"): "its vision tower is timm's MobileNetV5 (TimmWrapperModel); timm is no refsight dependency, so CI cannot build one",
    ("gemma3n", "llama.cpp"): "convert_hf_to_gguf.py converts its mmproj from the timm MobileNetV5 tower (with the audio "
                              "tower); timm is no refsight dependency, so CI cannot build a checkpoint to convert",
    ("llava", "llama.cpp"): _CONVERTER,
    ("llava_onevision", "llama.cpp"): _CONVERTER,
    ("paligemma", "llama.cpp"): _CONVERTER,
    ("paligemma", "vllm"): "vLLM 0.32 takes one image per PaliGemma prompt (paligemma.py get_supported_mm_limits); "
                           "a comparison holds references and a candidate",
    ("llava_next_video", "vllm"): "vLLM 0.32's LlavaNextVideoForConditionalGeneration takes videos only "
                                  "(llava_next_video.py get_supported_mm_limits)",
    ("aya_vision", "vllm"): "vLLM dropped AyaVisionForConditionalGeneration in 0.24 (registry.py _PREVIOUSLY_SUPPORTED_MODELS)",
    ("lighton_ocr", "vllm"): "vLLM 0.32's LightOnOCRForConditionalGeneration takes the original checkpoints' Mistral3Config, "
                             "not transformers' lighton_ocr config (lightonocr.py)",
    ("mllama", "vllm"): "vLLM dropped MllamaForConditionalGeneration in 0.10.2 (registry.py _PREVIOUSLY_SUPPORTED_MODELS)",
    **{(t, "vllm"): f"vLLM 0.32 registers no {arch}" for t, arch in (
        ("vipllava", "VipLlavaForConditionalGeneration"), ("video_llava", "VideoLlavaForConditionalGeneration"),
        ("glm46v", "Glm46VForConditionalGeneration"), ("lfm3_vl", "Lfm3VlForConditionalGeneration"),
        ("video_llama_3", "VideoLlama3ForConditionalGeneration"))},
}


def proven_model_types(runtime: str) -> list[str]:
    """The model types proven on ``runtime``, sorted."""
    return sorted({p.model_type for p in PROOFS if p.runtime == runtime})


def family_rows() -> list[dict[str, object]]:
    """One row per model type: for each runtime the proving built-in and test, or why it is not served."""
    types = sorted({p.model_type for p in PROOFS} | {t for t, _ in NOT_SERVED})
    rows = []
    for model_type in types:
        row: dict[str, object] = {"model_type": model_type}
        for runtime in RUNTIMES:
            proof = next((p for p in PROOFS if p.model_type == model_type and p.runtime == runtime), None)
            if proof is not None:
                row[runtime] = {"proven": True, "model": proof.model, "test": proof.test}
            else:
                row[runtime] = {"proven": False, "why": NOT_SERVED.get((model_type, runtime), "not proven yet")}
        rows.append(row)
    return rows


def markdown_table() -> str:
    """The table as the README carries it: ✅ and the built-in where proven, ✖ where not served, – where not yet proven."""
    def cell(entry: dict[str, object]) -> str:
        if entry["proven"]:
            return f"✅ `{entry['model']}`"
        return "– " if entry["why"] == "not proven yet" else f"✖ {entry['why']}"

    lines = ["| model type | " + " | ".join(RUNTIMES) + " |", "|---|" + "---|" * len(RUNTIMES)]
    for row in family_rows():
        lines.append(f"| `{row['model_type']}` | " + " | ".join(cell(row[r]).strip() for r in RUNTIMES) + " |")  # type: ignore[arg-type]
    return "\n".join(lines)
