"""Built-in tiny checkpoints of the families the generic transformers backend serves, as data.

Each :class:`FamilySpec` says what a tiny random-weight checkpoint of one model type is
made of: the special tokens trained into its tokenizer (and the named ones the family's
processor reads, such as Gemma 3's ``boi_token``), a short chat template shaped like the
family's real one, the model config (a ``"token:<x>"`` value becomes that token's id),
and the image processor's and processor's settings. :func:`build_family_checkpoint` turns
a spec into a checkpoint with ``save_pretrained``, the same files a real one has, so the
checkpoint loads through the same ``from_pretrained`` path as a real model. The classes
come from transformers' own auto tables (:func:`checkpoint_classes`).
"""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..families import FAMILIES
from .family_recipes import SHAPE_RECIPES
from .hybrid_recipes import HYBRID_SHAPE_RECIPES

__all__ = [
    "FamilySpec", "FAMILY_SPECS", "SHAPE_FAMILY_SPECS", "CheckpointClasses", "build_family_checkpoint", "checkpoint_classes",
    "family_recipe", "family_tokenizer",
]


@dataclass(frozen=True)
class FamilySpec:
    """The recipe of one tiny checkpoint (see the module docstring)."""

    model_type: str
    special_tokens: tuple[str, ...]
    eos: str
    pad: str
    chat_template: str
    config: dict[str, Any]
    bos: str | None = None
    #: The tokenizer's named special tokens (``extra_special_tokens``) the processor reads.
    named_tokens: dict[str, str] = field(default_factory=dict)
    image_processor: dict[str, Any] = field(default_factory=dict)
    processor: dict[str, Any] = field(default_factory=dict)
    #: Tokens added to the trained vocabulary as plain (not special) tokens.
    plain_tokens: tuple[str, ...] = ()
    #: The dtype the weights are built and saved in (None: float32).
    save_dtype: str | None = None
    #: The language model's vocabulary rows when a real shape has more than the tokenizer (None: the tokenizer's).
    vocab_size: int | None = None
    #: The PIL image processor's class name where transformers' table names none for the model type
    #: (a real checkpoint of it names one in its ``preprocessor_config.json``).
    image_processor_class: str | None = None
    #: The built-in's name where the family's own spelling reads better than the model type's
    #: (``tiny-qwen3.5`` for ``qwen3_5``); None: ``tiny-`` + the model type with dashes.
    name: str | None = None

    def recipe(self) -> dict[str, Any]:
        """The fields as build ids hash them: the optional ones left at None hash as before they existed."""
        return {k: v for k, v in self.__dict__.items() if k not in ("save_dtype", "vocab_size", "name", "image_processor_class") or v is not None}

    @property
    def builtin_name(self) -> str:
        """The built-in model's registry name."""
        return self.name or f"tiny-{self.model_type.replace('_', '-')}"


def family_recipe(name: str) -> dict[str, Any]:
    """The recipe a family entry names (``"<module>.<CONSTANT>"`` in this package: :mod:`.family_recipes`,
    :mod:`.hybrid_recipes`, :mod:`.kin_recipes`, :mod:`.torchvision_recipes`, :mod:`.codebook_recipes`)."""
    module, _, constant = name.partition(".")
    return getattr(importlib.import_module(f"{__package__}.{module}"), constant)


#: Built-in model name → recipe: one per family entry whose transformers built-in is a recipe
#: (:data:`refsight.families.FAMILIES`, ``transformers.recipe``).
FAMILY_SPECS: dict[str, FamilySpec] = {
    f.transformers.builtin: FamilySpec(**family_recipe(f.transformers.recipe))
    for f in FAMILIES.values() if f.transformers.recipe
}
#: Built-in real-shape checkpoints (``shape-*``) of the generic families: benchmarks only, never the tiny test set.
SHAPE_FAMILY_SPECS: dict[str, FamilySpec] = {
    name: FamilySpec(**recipe) for name, recipe in {**SHAPE_RECIPES, **HYBRID_SHAPE_RECIPES}.items()
}


def _resolve(value: Any, tokenizer: Any) -> Any:
    """``"token:<x>"`` → the id of ``<x>``, inside dicts and lists too."""
    if isinstance(value, str) and value.startswith("token:"):
        return tokenizer.convert_tokens_to_ids(value[len("token:"):])
    if isinstance(value, dict):
        return {k: _resolve(v, tokenizer) for k, v in value.items()}
    if isinstance(value, list):
        return [_resolve(v, tokenizer) for v in value]
    return value


def family_tokenizer(spec: FamilySpec) -> Any:
    """The spec's trained byte-level BPE with its special and named tokens and chat template."""
    from transformers import PreTrainedTokenizerFast

    from .tokenizer import train_tokenizer

    trained = train_tokenizer(spec.special_tokens, eos_token=spec.eos, pad_token=spec.pad, bos_token=spec.bos)
    if spec.plain_tokens:
        from tokenizers import AddedToken

        trained.add_tokens([AddedToken(t, normalized=False, special=False) for t in spec.plain_tokens])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=trained._tokenizer, eos_token=spec.eos, pad_token=spec.pad, bos_token=spec.bos,
        extra_special_tokens=dict(spec.named_tokens) or [t for t in spec.special_tokens if t not in {spec.eos, spec.pad, spec.bos}],
    )
    tokenizer.chat_template = spec.chat_template
    return tokenizer


@dataclass(frozen=True)
class CheckpointClasses:
    """The transformers classes a checkpoint of one model type is built with, by name."""

    model: str
    processor: str | None
    #: The PIL image processor, or None where transformers has only a torchvision one.
    image_processor: str | None
    torchvision_image_processor: str | None


def checkpoint_classes(spec: FamilySpec) -> CheckpointClasses:
    """The classes transformers' auto tables name for ``spec``'s model type (its PIL image processor,
    else the recipe's ``image_processor_class``)."""
    from transformers.models.auto.image_processing_auto import IMAGE_PROCESSOR_MAPPING_NAMES
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES
    from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES

    images = IMAGE_PROCESSOR_MAPPING_NAMES.get(spec.model_type) or {}
    if isinstance(images, str):  # an older table: one class name
        images = {"pil": images}
    return CheckpointClasses(
        model=MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES[spec.model_type],
        processor=PROCESSOR_MAPPING_NAMES.get(spec.model_type),
        image_processor=images.get("pil") or spec.image_processor_class,
        torchvision_image_processor=images.get("torchvision"),
    )


def build_family_checkpoint(spec: FamilySpec, directory: Path, *, seed: int = 0) -> Any:
    """Build ``spec``'s random-weight checkpoint into ``directory``; returns the tokenizer."""
    import torch
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    from transformers.models.auto.image_processing_auto import get_image_processor_class_from_name

    directory = Path(directory)
    classes = checkpoint_classes(spec)
    tokenizer = family_tokenizer(spec)
    text = dict(spec.config.get("text_config", {}))
    text.update(vocab_size=spec.vocab_size or len(tokenizer), pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                bos_token_id=tokenizer.bos_token_id)
    fields = {k: _resolve(v, tokenizer) for k, v in spec.config.items() if k != "text_config"}
    config = getattr(transformers, CONFIG_MAPPING_NAMES[spec.model_type])(text_config=text, **fields)
    # A private generator state: building a model must not disturb the caller's RNG.
    default = torch.get_default_dtype()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if spec.save_dtype:
            # Built in that dtype from the start: a 4B model in float32 would need twice the memory.
            torch.set_default_dtype(getattr(torch, spec.save_dtype))
        try:
            model = getattr(transformers, classes.model)(config).eval()
        finally:
            torch.set_default_dtype(default)
    model.generation_config = transformers.GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, do_sample=False
    )
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    if classes.image_processor is not None:
        get_image_processor_class_from_name(classes.image_processor)(**spec.image_processor).save_pretrained(directory)
    else:  # only a torchvision class (LFM2-VL, Llama 4), which may not import: write what it would save, on every machine
        settings = {"image_processor_type": classes.torchvision_image_processor, **spec.image_processor}
        (directory / "preprocessor_config.json").write_text(json.dumps(settings, indent=2))
    settings = {"processor_class": classes.processor, **_resolve(spec.processor, tokenizer)}
    (directory / "processor_config.json").write_text(json.dumps(settings, indent=2))
    (directory / "chat_template.jinja").write_text(spec.chat_template)
    return tokenizer
