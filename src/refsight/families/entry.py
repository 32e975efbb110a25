"""The shape of a family entry: what refsight knows about one model type, per runtime (data only).

A :class:`Family` holds a model type's transformers exceptions (:class:`Traits`), and for each
runtime the built-in model that proves the cached path equal to the runtime's own pixel path
(and the test that shows it), or why the runtime is left out, plus the few facts that runtime's
code reads by model type. The builders (``refsight.builtin_models``) keep the heavy data and code
(recipes, converter patches, the builds); an entry names them: the tiny recipe by module and
constant, the llama.cpp and vLLM built-ins by registry name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "RUNTIMES", "Traits", "RuntimeFacts", "TransformersFacts", "LlamaCppFacts", "VllmFacts", "Family",
    "HF_EQUIVALENCE", "HF_GENERIC", "LLAMA_EQUIVALENCE", "LLAMA_FAMILIES", "VLLM_EQUIVALENCE", "VLLM_FAMILIES",
    "tiny_name",
]

#: The runtimes of the family table, in its column order.
RUNTIMES = ("transformers", "llama.cpp", "vllm")

# The tests that prove a cell. Qwen and SmolVLM: their pixel path written out by hand from the image processor
# (test_equivalence), the other families: through the processor itself (test_families). Both through the one
# generic backend.
#: Qwen and SmolVLM on transformers (the pixel path written out by hand).
HF_EQUIVALENCE = "tests/backends/test_equivalence.py"
#: Every other family on transformers (the pixel path through the family's processor).
HF_GENERIC = "tests/backends/test_families.py"
#: Qwen2/2.5-VL and SmolVLM on llama.cpp.
LLAMA_EQUIVALENCE = "tests/backends/llamacpp/test_llamacpp_equivalence.py"
#: The families converted from the transformers recipes, on llama.cpp.
LLAMA_FAMILIES = "tests/backends/llamacpp/test_llamacpp_families.py"
#: The Qwen-VL families on vLLM.
VLLM_EQUIVALENCE = "tests/backends/vllm/test_vllm_equivalence.py"
#: Every other family on vLLM.
VLLM_FAMILIES = "tests/backends/vllm/test_vllm_families.py"


def tiny_name(model_type: str, suffix: str = "") -> str:
    """The usual built-in name of a model type: ``tiny-`` + the model type with dashes (+ ``suffix``)."""
    return f"tiny-{model_type.replace('_', '-')}{suffix}"


@dataclass(frozen=True)
class Traits:
    """The exceptions of one model type on transformers; the defaults fit most families."""

    #: The field of ``get_image_features``' output that holds the projected features.
    features: str = "pooler_output"
    #: Image-processor call settings that change the placeholder layout (part of the key).
    layout: dict[str, Any] = field(default_factory=dict)
    #: Encode each image as the processor lays it out inside a prompt of several images
    #: (LLaVA-OneVision's ``batch_num_images``), not as a lone image.
    multi_image: bool = False
    #: The PIL image processor's class name, where transformers' table has no entry for the model type
    #: (transformers' class, or refsight's own where transformers has only a torchvision one:
    #: ``refsight.backends.hf.pil_processors``).
    image_processor: str | None = None
    #: The load options beyond the common ones, by the name of their mapping in ``refsight.backends.hf.load_options``
    #: ("pixel_bounds": ``min_pixels`` / ``max_pixels``; "tiles": ``tile_size`` ...; "": none).
    options: str = ""
    #: Qwen's smart-resize grid: an image's tokens follow from its size alone (counted before it is
    #: encoded), and other runtimes are sent its pixels resized onto the grid (``refsight.backends.hf.grid``).
    grid: bool = False
    #: The processor lays each image of a batch out on its own (no padding to the batch's largest) and
    #: ``get_image_features`` returns one entry per image: a batch of references is one tower call.
    batch: bool = False
    #: Why a reference-prefix state cannot stand for the references in this family's prompts (the
    #: plain path runs), or "" where it can.
    no_prefix: str = ""
    #: Why a family cannot run here (shown instead of loading), or "".
    unavailable: str = ""
    #: A note for the family table (a workaround in force, a limit).
    note: str = ""


@dataclass(frozen=True)
class RuntimeFacts:
    """One runtime's cell of a model type: the built-in and the test proving it, or why it is left out.

    All empty: not proven yet (the table shows a dash).
    """

    #: The registry name of the built-in model the proof runs on ("" where none is proven).
    builtin: str = ""
    #: The test (a path from the repository root) that shows cached == fresh on ``builtin``.
    test: str = ""
    #: Why the model type cannot be served on this runtime here ("" where it can or is not tried yet).
    left_out: str = ""

    @property
    def proven(self) -> bool:
        """Whether a built-in proves this cell."""
        return bool(self.builtin)


@dataclass(frozen=True)
class TransformersFacts(RuntimeFacts):
    """The transformers cell and what the generic backend reads for the model type."""

    #: The tiny built-in's recipe as ``"<module>.<CONSTANT>"`` in ``refsight.builtin_models`` (the keyword
    #: arguments of its ``FamilySpec``), or "" where the built-in is not a recipe (Qwen, SmolVLM: ``checkpoints``).
    recipe: str = ""
    #: The exceptions the generic backend applies.
    traits: Traits = field(default_factory=Traits)


@dataclass(frozen=True)
class LlamaCppFacts(RuntimeFacts):
    """The llama.cpp cell; the built-in's conversion is ``refsight.builtin_models``' data under its name."""

    #: The GGUF ``general.architecture`` llama.cpp's converter writes, where a runtime fact below keys on it.
    architecture: str = ""
    #: A reference state saved past the sliding window does not continue as the plain path (Gemma 4's
    #: sliding-window layers in llama.cpp): it is reused only while the prefix fits in the window.
    window_bound: bool = False


@dataclass(frozen=True)
class VllmFacts(RuntimeFacts):
    """The vLLM cell and what refsight's vLLM code and built-ins read for the model type."""

    #: vLLM takes precomputed image embeddings for it (``--vllm-images embeds``), and other runtimes'
    #: pixels go on the family's resize grid (Qwen2/2.5/3-VL).
    image_embeds: bool = False
    #: Where transformers 5 saves the weights in another layout than the hub checkpoints vLLM loads:
    #: "vision_model" (the tower without its ``vision_model.`` level), "experts" (fused MoE experts
    #: untransposed), or "".
    hub_layout: str = ""


@dataclass(frozen=True)
class Family:
    """Everything refsight knows about one model type (registered in :data:`refsight.families.FAMILIES`)."""

    model_type: str
    transformers: TransformersFacts = field(default_factory=TransformersFacts)
    llamacpp: LlamaCppFacts = field(default_factory=LlamaCppFacts)
    vllm: VllmFacts = field(default_factory=VllmFacts)

    def on(self, runtime: str) -> RuntimeFacts:
        """The cell of ``runtime`` (one of :data:`RUNTIMES`)."""
        return {"transformers": self.transformers, "llama.cpp": self.llamacpp, "vllm": self.vllm}[runtime]
