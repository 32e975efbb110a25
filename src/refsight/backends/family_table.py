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

PROOFS: tuple[Proof, ...] = (
    Proof("qwen2_vl", "transformers", "tiny-qwen2-vl", _HF_EQUIVALENCE),
    Proof("qwen2_5_vl", "transformers", "tiny-qwen2.5-vl", _HF_EQUIVALENCE),
    Proof("qwen3_vl", "transformers", "tiny-qwen3-vl", _HF_EQUIVALENCE),
    Proof("smolvlm", "transformers", "tiny-smolvlm", _HF_EQUIVALENCE),
    *(Proof(t, "transformers", f"tiny-{t.replace('_', '-')}", _HF_GENERIC) for t in _GENERIC),
    Proof("qwen2_vl", "llama.cpp", "tiny-qwen2-vl-gguf", _LLAMA),
    Proof("qwen2_5_vl", "llama.cpp", "tiny-qwen2.5-vl-gguf", _LLAMA),
    Proof("smolvlm", "llama.cpp", "tiny-smolvlm-gguf", _LLAMA),
    Proof("qwen3_vl", "llama.cpp", "tiny-qwen3-vl-gguf", "tests/backends/llamacpp/test_llamacpp_qwen3vl.py"),
    *(Proof(t, "llama.cpp", f"tiny-{t.replace('_', '-')}-gguf", _LLAMA_FAMILIES)
      for t in ("gemma3", "internvl", "mistral3", "lfm2_vl", "llama4", "glm4v", "minicpmv4_6")),
    Proof("qwen2_vl", "vllm", "tiny-qwen2-vl-vllm", _VLLM),
    Proof("qwen2_5_vl", "vllm", "tiny-qwen2.5-vl-vllm", _VLLM),
    Proof("qwen3_vl", "vllm", "tiny-qwen3-vl-vllm", _VLLM),
    *(Proof(t, "vllm", f"tiny-{t}-vllm", _VLLM_FAMILIES) for t in ("gemma3", "llava", "internvl", "mistral3", "smolvlm")),
)

_TORCHVISION = "transformers 5.24 has only a torchvision image processor for it (see 'torchvision on CPU')"
_CONVERTER = "llama-cpp-python 0.3.36's convert_hf_to_gguf.py does not convert it"

#: Model types that cannot be served on a runtime here, with the reason (shown in the table).
NOT_SERVED: dict[tuple[str, str], str] = {
    ("lfm2_vl", "transformers"): _TORCHVISION,
    ("cohere2_vision", "transformers"): _TORCHVISION,
    ("llama4", "transformers"): "transformers 5.24's Llama4ForConditionalGeneration.forward raises "
                                "'MoeCausalLMOutputWithPast' object has no attribute 'image_outputs'; " + _TORCHVISION,
    ("mllama", "transformers"): "cross-attention images: no precomputed-features seam in transformers",
    ("idefics2", "transformers"): "its processor has no replace_image_token (it expands images from the text alone)",
    ("llava", "llama.cpp"): _CONVERTER,
    ("llava_onevision", "llama.cpp"): _CONVERTER,
    ("paligemma", "llama.cpp"): _CONVERTER,
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
