"""Built-in GGUFs of more VLM families: the transformers tiny-family recipes, converted with llama.cpp's converter.

Each :class:`FamilyGguf` starts from a recipe of :mod:`refsight.builtin_models.family_recipes`
(or :mod:`refsight.builtin_models.hybrid_recipes`: Qwen3.5, Qwen3.5-MoE, Gemma 4)
(a :class:`~refsight.builtin_models.family_checkpoints.FamilySpec` as keyword arguments), updated with
what the converter and llama.cpp's runtime need (vision depth ≥ 3, head dims the CLIP graph
accepts, ...), builds the HF checkpoint with
:func:`~refsight.builtin_models.family_checkpoints.build_family_checkpoint`, adjusts the checkpoint
where the converter expects another layout than transformers 5.24 saves (tensor names,
config fields), and converts it twice (language model, ``--mmproj``) like
:mod:`.gguf` does. Conversions are fixed here, narrowly, never in the vendored converter:
``converter_patch`` is Python run inside the converter's process before it starts.

LLaVA 1.5, LLaVA-OneVision and PaliGemma are not here: this converter (llama-cpp-python
0.3.36) converts ``LlavaForConditionalGeneration``'s mmproj only for Pixtral towers (a CLIP
tower raises "Unsupported model type"), and has no class at all for
``LlavaOnevisionForConditionalGeneration`` or ``PaliGemmaForConditionalGeneration``.
"""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import family_recipes as specs
from . import hybrid_recipes as hybrid
from . import torchvision_recipes as torchvision

__all__ = ["FamilyGguf", "FAMILY_GGUFS", "build_family_gguf", "family_build_id"]

#: Bump when a recipe or the build below changes, so old cache entries are not reused.
FAMILY_BUILD_VERSION = 1


@dataclass(frozen=True)
class FamilyGguf:
    """A built-in GGUF of one family: its tiny-checkpoint recipe and the converter's needs."""

    recipe: dict[str, Any]  # FamilySpec keyword arguments
    #: A pre-tokenizer llama.cpp knows: the trained byte-level BPE's hash is unknown to the converter,
    #: and every family's tiny tokenizer is that same kind of BPE, so "qwen2" fits them all.
    pre_tokenizer: str
    #: (old, new) substring replacements applied to the checkpoint's tensor names.
    renames: tuple[tuple[str, str], ...] = ()
    #: Merged into config.json (dicts merged recursively) before conversion.
    config_edits: dict[str, Any] = field(default_factory=dict)
    #: Python run in the converter's process before the conversion (``conversion`` is importable).
    converter_patch: str = ""
    #: Extra converter arguments for the language model file only.
    model_args: tuple[str, ...] = ()
    outtype: str = "f32"
    mmproj_outtype: str = "f32"


def _update(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``changes`` merged in recursively (a deep copy: the shared recipes stay untouched)."""
    out = copy.deepcopy(base)
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _update(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _vision(recipe: dict[str, Any], **vision: Any) -> dict[str, Any]:
    return _update(recipe, {"config": {"vision_config": vision}})


# Gemma 3, LFM2-VL: SigLIP towers; the converter reads them under vision_tower.vision_model.* (the
# layout of the published checkpoints), transformers 5.24 saves vision_tower.embeddings.* etc.
_SIGLIP_NESTING = (
    ("vision_tower.embeddings.", "vision_tower.vision_model.embeddings."),
    ("vision_tower.encoder.", "vision_tower.vision_model.encoder."),
    ("vision_tower.post_layernorm.", "vision_tower.vision_model.post_layernorm."),
)

# Mistral 3: mtmd puts [IMG_BREAK] after every row of patches, as the embedding row of that
# token, which the converter cuts from the language model's token embedding into the mmproj;
# but the mmproj side drops every language_model.* tensor before it can. Let that one through.
_MISTRAL3_IMG_BREAK = """
import conversion.llava as _llava
_filter = _llava.LlavaVisionModel.filter_tensors.__func__
def _keep_embedding(cls, item):
    name, gen = item
    if "language_model." in name and name.endswith("embed_tokens.weight"):
        return name.replace("language_model.", ""), gen
    return _filter(cls, item)
_llava.LlavaVisionModel.filter_tensors = classmethod(_keep_embedding)
"""

# Gemma 3 at its real shape: the converter cuts the token embedding (the tied LM head) down to the
# tokenizer's own size, 520 rows for refsight's small stand-in tokenizer, while the GGUF's vocabulary is
# padded to the config's 262,208 and llama.cpp then refuses the shape. Keep every row, as the real model has.
_GEMMA3_WHOLE_EMBEDDING = """
import conversion.gemma as _gemma
_cut_rows = _gemma.Gemma3Model.modify_tensors
def _whole_embedding(self, data_torch, name, bid):
    if "embed_tokens.weight" in name:  # no norm shift applies to it: straight to the base class
        return super(_gemma.Gemma3Model, self).modify_tensors(data_torch, name, bid)
    return _cut_rows(self, data_torch, name, bid)
_gemma.Gemma3Model.modify_tensors = _whole_embedding
"""

# Gemma 4: the converter reads the tokenizer as Gemma's own (a byte-fallback BPE written as llama.cpp's "gemma4"
# tokenizer model); the tiny tokenizer is a byte-level BPE like every family's here. Write it as one ("gpt2", with
# the pre-tokenizer named below): the gemma4 graph and mtmd's <|image> ... <image|> layout do not depend on it.
_GEMMA4_BPE_VOCAB = """
import conversion.gemma as _gemma
def _byte_level_vocab(self):
    self._set_vocab_gpt2()
    self.gguf_writer.add_add_bos_token(True)
_gemma.Gemma4Model.set_vocab = _byte_level_vocab
"""

# Llama 4 has no recipe of its own in family_recipes (transformers 5.24's forward raises): this one is from the
# transformers-side prototype. Its only image processor needs torchvision (its preprocessor_config.json is
# written as data by build_family_checkpoint).
_LLAMA4 = dict(
    model_type="llama4",
    special_tokens=("<|finetune_right_pad|>", "<|begin_of_text|>", "<|end_of_text|>", "<|header_start|>",
                    "<|header_end|>", "<|eot|>", "<|image_start|>", "<|image_end|>", "<|image|>", "<|patch|>",
                    "<|tile_x_separator|>", "<|tile_y_separator|>"),
    eos="<|eot|>", pad="<|finetune_right_pad|>", bos="<|begin_of_text|>",
    chat_template=(
        "{{ bos_token }}{% for m in messages %}<|header_start|>{{ m['role'] }}<|header_end|>\n\n"
        "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for c in m['content'] %}"
        "{% if c['type']=='image' %}<|image|>{% else %}{{ c['text'] }}{% endif %}{% endfor %}{% endif %}<|eot|>{% endfor %}"
        "{% if add_generation_prompt %}<|header_start|>assistant<|header_end|>\n\n{% endif %}"),
    config=dict(
        # Four layers, the fourth without RoPE (no_rope_layers 0), as every real Llama 4 has a NoPE layer:
        # llama.cpp's llama4 graph aborts without one.
        text_config=dict(hidden_size=64, intermediate_size=128, intermediate_size_mlp=128, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=4096,
                         num_local_experts=2, num_experts_per_tok=1, interleave_moe_layer_step=1,
                         no_rope_layers=[1, 1, 1, 0], attention_chunk_size=8192),
        # The adapter's fc1 takes the pixel-shuffled patches: intermediate = hidden / ratio**2.
        vision_config=dict(hidden_size=32, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                           image_size=64, patch_size=8, pixel_shuffle_ratio=0.5, vision_output_dim=64,
                           projector_input_dim=64, projector_output_dim=64),
        image_token_index="token:<|patch|>", boi_token_index="token:<|image_start|>",
        eoi_token_index="token:<|image_end|>"),
    image_processor=dict(size={"height": 64, "width": 64}, max_patches=4, resize_to_max_canvas=False,
                         image_mean=[0.5] * 3, image_std=[0.5] * 3),
    processor=dict(patch_size=8, pixel_shuffle_ratio=0.5),
)

#: Built-in model name → how its GGUFs are made (each entry's comments say what its conversion needed).
FAMILY_GGUFS: dict[str, FamilyGguf] = {
    **{f"tiny-gemma3-gguf{suffix}": FamilyGguf(
        # No attention-pool head (real Gemma 3 towers have none). The converter derives the
        # projector's pooling from the image processor's image_seq_length (default 256).
        _update(_vision(specs.GEMMA3, num_hidden_layers=3, vision_use_head=False),
                {"image_processor": {"image_seq_length": 16}}),
        "qwen2", renames=_SIGLIP_NESTING, outtype=outtype, mmproj_outtype=outtype,
    ) for suffix, outtype in (("", "f32"), ("-f16", "f16"))},  # f16: the base of tiny-gemma3-gguf-q4
    "tiny-internvl-gguf": FamilyGguf(
        # The projector maps to mlp1.{0,1,3}: the name map only knows block ids below the vision depth.
        _vision(specs.INTERNVL, num_hidden_layers=4),
        "qwen2",
        # The converter knows the transformers layout of InternVL's tower by Intern-S1's names,
        # which sit under model.*; transformers 5.24 saves them at the top level.
        renames=(("vision_tower.", "model.vision_tower."), ("multi_modal_projector.", "model.multi_modal_projector.")),
        # The converter picks each file's class from the sub-config's architectures (the top-level
        # InternVLForConditionalGeneration is not one of its classes).
        config_edits={"text_config": {"architectures": ["Qwen2ForCausalLM"]},
                      "vision_config": {"architectures": ["InternVisionModel"]}},
    ),
    "tiny-mistral3-gguf": FamilyGguf(
        _vision(specs.MISTRAL3, num_hidden_layers=3), "qwen2", converter_patch=_MISTRAL3_IMG_BREAK,
    ),
    "tiny-glm4v-gguf": FamilyGguf(_vision(specs.GLM4V, depth=3), "qwen2"),
    "tiny-lfm2-vl-gguf": FamilyGguf(
        # The converter reshapes the patch embedding as 16x16 px patches whatever the config says.
        _update(_vision(torchvision.LFM2_VL, num_hidden_layers=3, patch_size=16),
                {"image_processor": {"encoder_patch_size": 16, "tile_size": 128}}),
        "qwen2", renames=_SIGLIP_NESTING,
        # The top-level Lfm2VlForConditionalGeneration is only the converter's mmproj class.
        config_edits={"text_config": {"architectures": ["Lfm2ForCausalLM"]}},
    ),
    "tiny-llama4-gguf": FamilyGguf(_vision(_LLAMA4, num_hidden_layers=3), "qwen2"),
    "tiny-minicpmv4-6-gguf": FamilyGguf(
        # mtmd's MiniCPM-V 4.6 graph reads the position buckets as a 70x70 grid (image_size 1120 /
        # patch 16, as the real model); a slice (scale_resolution) of 128 px is 8x8 patches, 4 tokens.
        _update(_vision(specs.MINICPMV4_6, num_hidden_layers=3, image_size=1120, patch_size=16),
                {"image_processor": {"scale_resolution": 128, "patch_size": 16}}),
        "qwen2",
        model_args=("--no-mtp",),
    ),
    # Qwen3.5 and Qwen3.5-MoE: hybrid language models (three Gated DeltaNet layers, one full attention).
    # The converter's Qwen3.5 classes count multi-token-prediction layers (published checkpoints carry one;
    # without mtp_num_hidden_layers they assert); the tiny checkpoints have none: --no-mtp.
    "tiny-qwen3.5-gguf": FamilyGguf(hybrid.QWEN3_5, "qwen2", model_args=("--no-mtp",)),
    "tiny-qwen3.5-moe-gguf": FamilyGguf(hybrid.QWEN3_5_MOE, "qwen2", model_args=("--no-mtp",)),
    # Gemma 4: per-layer inputs and KV-shared layers, converted as they are; the vocabulary is written as the
    # byte-level BPE it is (_GEMMA4_BPE_VOCAB). llama.cpp sizes the per-layer token embedding by the vocabulary
    # (as every real Gemma 4 has it): the tiny tokenizer's 512 rows, not the transformers recipe's 1024. The
    # sliding window is Gemma 4 E2B's 512: a two-reference prefix fits in it (its state is reused), six do not
    # (nothing reused: .prefix.WINDOW_BOUND_ARCHITECTURES).
    "tiny-gemma4-gguf": FamilyGguf(
        _update(hybrid.GEMMA4, {"config": {"text_config": {"vocab_size_per_layer_input": 512, "sliding_window": 512}}}),
        "qwen2",
        converter_patch=_GEMMA4_BPE_VOCAB,
    ),
    # Gemma 3 4B's whole shape (SigLIP-so400m at 896², 256 image tokens, the 34-layer language model),
    # random weights, converted to f16 as published GGUFs are before llama-quantize: the base of
    # shape-gemma3-4b-gguf-q4, the vs-llama-server benchmark's model. Built only when asked for (~8 GB).
    "shape-gemma3-4b-gguf-f16": FamilyGguf(
        specs.GEMMA3_4B_SHAPE, "qwen2", renames=_SIGLIP_NESTING, converter_patch=_GEMMA3_WHOLE_EMBEDDING,
        outtype="f16", mmproj_outtype="f16",
    ),
    # Qwen3.5-0.8B's whole shape (hybrid_recipes: the 12-layer tower, the 24-layer hybrid language model), random
    # weights in f16: the base of shape-qwen3.5-0.8b-gguf-q4, issue 50's vs-llama-server model (~1.8 GB, built
    # only when asked for). Published checkpoints carry a multi-token-prediction layer; this shape has none.
    "shape-qwen3.5-0.8b-gguf-f16": FamilyGguf(
        hybrid.QWEN3_5_0_8B_SHAPE, "qwen2", model_args=("--no-mtp",), outtype="f16", mmproj_outtype="f16",
    ),
}


def family_build_id(name: str) -> str:
    """A hash of everything ``name``'s files are made from (recipe, fixes, versions)."""
    import transformers

    from ..support.extras import LLAMA_CPP_PYTHON_VERSION

    entry = FAMILY_GGUFS[name]
    recipe = json.dumps({"entry": entry.__dict__, "build": FAMILY_BUILD_VERSION, "transformers": transformers.__version__,
                         "converter": LLAMA_CPP_PYTHON_VERSION}, sort_keys=True, default=str)
    return hashlib.sha256(recipe.encode()).hexdigest()[:12]


def _rename_tensors(hf_dir: Path, renames: tuple[tuple[str, str], ...]) -> None:
    from safetensors.torch import load_file, save_file

    for path in sorted(hf_dir.glob("*.safetensors")):
        tensors = load_file(path)
        renamed = {}
        for name, tensor in tensors.items():
            for old, new in renames:
                if old in name and new not in name:
                    name = name.replace(old, new)
            renamed[name] = tensor
        save_file(renamed, path, metadata={"format": "pt"})
    index = hf_dir / "model.safetensors.index.json"
    if index.is_file():  # a sharded checkpoint would name its tensors again in the index
        raise NotImplementedError("renaming the tensors of a sharded checkpoint")


def _edit_config(hf_dir: Path, edits: dict[str, Any]) -> None:
    path = hf_dir / "config.json"
    path.write_text(json.dumps(_update(json.loads(path.read_text()), edits), indent=2))


def build_family_gguf(name: str, directory: Path) -> None:
    """Build ``name``'s ``model.gguf`` and ``mmproj.gguf`` into ``directory`` (see the module docstring)."""
    import shutil

    from .family_checkpoints import FamilySpec, build_family_checkpoint
    from .gguf_converter import MMPROJ_FILE, MODEL_FILE, convert, converter_dir

    entry = FAMILY_GGUFS[name]
    hf_dir = directory / "hf"
    build_family_checkpoint(FamilySpec(**entry.recipe), hf_dir)
    if entry.renames:
        _rename_tensors(hf_dir, entry.renames)
    if entry.config_edits:
        _edit_config(hf_dir, entry.config_edits)
    source = converter_dir()
    convert(source, hf_dir, directory / MODEL_FILE, entry.outtype, entry.pre_tokenizer, list(entry.model_args),
            patch=entry.converter_patch)
    convert(source, hf_dir, directory / MMPROJ_FILE, entry.mmproj_outtype, entry.pre_tokenizer, ["--mmproj"],
            patch=entry.converter_patch)
    (directory / "refsight_model.json").write_text(
        json.dumps({"random_weights": True, "model_id": f"refsight/{name}", "build": FAMILY_BUILD_VERSION})
    )
    shutil.rmtree(hf_dir)  # the converter's input only
