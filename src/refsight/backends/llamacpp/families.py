"""Built-in GGUFs of more VLM families: the transformers tiny-family recipes, converted with llama.cpp's converter.

Each :class:`FamilyGguf` starts from a recipe of :mod:`refsight.backends.tiny_family_specs`
(a :class:`~refsight.backends.tiny_families.FamilySpec` as keyword arguments), updated with
what the converter and llama.cpp's runtime need (vision depth ≥ 3, head dims the CLIP graph
accepts, ...), builds the HF checkpoint with
:func:`~refsight.backends.tiny_families.build_family_checkpoint`, adjusts the checkpoint
where the converter expects another layout than transformers 5.24 saves (tensor names,
config fields), and converts it twice (language model, ``--mmproj``) like
:mod:`.models` does. Conversions are fixed here, narrowly, never in the vendored converter:
``converter_patch`` is Python run inside the converter's process before it starts.

LLaVA 1.5, LLaVA-OneVision and PaliGemma are not here: this converter (llama-cpp-python
0.3.36) has no ``LlavaForConditionalGeneration`` path for a CLIP/SigLIP tower (its Llava
class converts Pixtral towers only), no LLaVA-OneVision class and no PaliGemma class.
"""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import tiny_family_specs as specs

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


# Gemma 3: a SigLIP tower; the converter reads it under vision_tower.vision_model.* (the
# layout of the published checkpoints), transformers 5.24 saves vision_tower.embeddings.* etc.
_SIGLIP_NESTING = (
    ("vision_tower.embeddings.", "vision_tower.vision_model.embeddings."),
    ("vision_tower.encoder.", "vision_tower.vision_model.encoder."),
    ("vision_tower.post_layernorm.", "vision_tower.vision_model.post_layernorm."),
)

FAMILY_GGUFS: dict[str, FamilyGguf] = {
    "tiny-gemma3-gguf": FamilyGguf(
        # No attention-pool head (real Gemma 3 towers have none). The converter derives the
        # projector's pooling from the image processor's image_seq_length (default 256).
        _update(_vision(specs.GEMMA3, num_hidden_layers=3, vision_use_head=False),
                {"image_processor": {"image_seq_length": 16}}),
        "qwen2", renames=_SIGLIP_NESTING,
    ),
}


def family_build_id(name: str) -> str:
    """A hash of everything ``name``'s files are made from (recipe, fixes, versions)."""
    import transformers

    from .models import LLAMA_CPP_PYTHON_VERSION

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

    from ..tiny_families import FamilySpec, build_family_checkpoint
    from .models import MMPROJ_FILE, MODEL_FILE, convert, converter_dir

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
