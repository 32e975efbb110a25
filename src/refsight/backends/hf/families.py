"""What refsight knows about each transformers model family, as data.

Almost everything a family needs is already in transformers' own tables: the
``*ForConditionalGeneration`` class, the processor class, the PIL image processor
(:func:`family_classes`). What is left is a short list of exceptions per model type
(:data:`TRAITS`): which output field of ``get_image_features`` holds the features, the
processor settings that change an image's placeholder layout (and so go into the key),
narrow workarounds of transformers bugs, the load options a family takes beyond the common
ones (Qwen's pixel bounds, SmolVLM's tiles: :mod:`.load_options`), and what a user must
install. Every model type with the seam, Qwen and SmolVLM included, is served by
:class:`~.generic.GenericBackend`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["Traits", "TRAITS", "FamilyClasses", "family_classes", "image_processor_class", "processor_class", "traits_for"]


@dataclass(frozen=True)
class Traits:
    """The exceptions of one model type; the defaults fit most families."""

    #: The field of ``get_image_features``' output that holds the projected features.
    features: str = "pooler_output"
    #: Image-processor call settings that change the placeholder layout (part of the key).
    layout: dict[str, Any] = field(default_factory=dict)
    #: Encode each image as the processor lays it out inside a prompt of several images
    #: (LLaVA-OneVision's ``batch_num_images``), not as a lone image.
    multi_image: bool = False
    #: The PIL image processor's class name, where transformers' table has no entry for the model type
    #: (transformers' class, or refsight's own where transformers has only a torchvision one: :mod:`.pil_processors`).
    image_processor: str | None = None
    #: The load options beyond the common ones, by the name of their mapping in :mod:`.load_options`
    #: ("pixel_bounds": ``min_pixels`` / ``max_pixels``; "tiles": ``tile_size`` ...; "": none).
    options: str = ""
    #: Qwen's smart-resize grid: an image's tokens follow from its size alone (counted before it is
    #: encoded), and other runtimes are sent its pixels resized onto the grid (:mod:`.grid`).
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


#: Per model type, what differs from :class:`Traits`' defaults. A model type absent here
#: is served with the defaults when transformers gives it the seam and a PIL image processor.
TRAITS: dict[str, Traits] = {
    "qwen2_vl": Traits(options="pixel_bounds", grid=True, batch=True),
    "qwen2_5_vl": Traits(options="pixel_bounds", grid=True, batch=True),
    "qwen3_vl": Traits(options="pixel_bounds", grid=True, batch=True),
    # Qwen3.5: Qwen3-VL's processor and grid; a hybrid language model (Gated DeltaNet + full attention)
    # whose prefix states keep each linear layer's convolution and recurrent state (prefix_cache).
    "qwen3_5": Traits(options="pixel_bounds", grid=True, batch=True),
    "qwen3_5_moe": Traits(options="pixel_bounds", grid=True, batch=True),
    "smolvlm": Traits(options="tiles"),
    "idefics3": Traits(options="tiles"),
    "gemma3": Traits(note="token_type_ids rebuilt at prompt time (image tokens attend bidirectionally)"),
    "paligemma": Traits(note="images first, text after <bos> (the processor's own layout); token_type_ids rebuilt"),
    # One image alone is tiled any-res ("single" mode); in a prompt of two or more images each is
    # padded to a square tile ("multi" mode). Every compare prompt holds two or more images, so
    # packages are made in multi mode, and the mode is in the key.
    "llava_onevision": Traits(multi_image=True, note="packages in multi-image mode (prompts of two or more images)"),
    # transformers 5.24's image processor table has no qwen3_vl_moe entry; its checkpoints name Qwen2-VL's.
    "qwen3_vl_moe": Traits(image_processor="Qwen2VLImageProcessorPil", options="pixel_bounds", grid=True, batch=True),
    "glm4v_moe": Traits(image_processor="Glm4vImageProcessorPil"),
    # Molmo 2's image tokens attend to each other across every image of the prompt (one bidirectional block, at
    # prefill): a reference's keys and values depend on the candidate after it, so no state stops at the references.
    "molmo2": Traits(no_prefix="image tokens attend to every image of the prompt (one bidirectional block), the candidate's too",
                     note="no reference-prefix states: image tokens attend across all the prompt's images"),
    # Encoder-free Gemma 4: transformers 5.24 has only a torchvision image processor for it; refsight's PIL one
    # lays images out identically (Gemma 4's at the model-patch size: pil_processors). A package is the patch
    # embedding (pooler_output: one row per image token); the reference state is Gemma 4's (prefix_cache).
    "gemma4_unified": Traits(image_processor="Gemma4UnifiedImageProcessorPil",
                             note="PIL image processor from refsight (Gemma 4's at the model-patch size)"),
    # Emu3: the features are the embedding rows of the VQ-VAE's codes (get_image_features' pooler_output, one
    # tensor per image: the defaults fit). Its image processor pads a call's images to the largest, and the padding
    # changes the codes of the smaller ones (the VQ-VAE's group norms and attention see it); refsight encodes each
    # image alone, so its codes are those of the image in a call of its own (or among images of its size).
    "emu3": Traits(note="each image encoded alone: transformers' batch of mixed sizes pads them, which moves some codes"),
    # Features in last_hidden_state. transformers 5.24's Llama4ForConditionalGeneration.forward raises
    # "'MoeCausalLMOutputWithPast' object has no attribute 'image_outputs'" on every call, and its only
    # image processor needs torchvision: not served until transformers fixes the forward.
    "llama4": Traits(features="last_hidden_state", unavailable=(
        "transformers 5.24's Llama4ForConditionalGeneration.forward is broken ('MoeCausalLMOutputWithPast' object has "
        "no attribute 'image_outputs') and its only image processor needs torchvision"
    )),
}


def traits_for(model_type: str) -> Traits:
    """The family's :class:`Traits` (the defaults when it has no entry)."""
    return TRAITS.get(model_type, Traits())


@dataclass(frozen=True)
class FamilyClasses:
    """The transformers classes of one model type, by name (nothing imported yet)."""

    model: str | None
    processor: str | None
    #: The image processor's class name: the PIL one, else the torchvision one where torchvision imports, else None.
    image_processor: str | None
    #: The torchvision image processor's class name (for the error when no PIL one exists).
    torchvision_image_processor: str | None
    #: The base ``…Model`` class (``model.base_model``), whose ``get_image_features`` some top-level classes
    #: lack (DeepSeek-VL, Janus): the generic backend calls it there.
    base_model: str | None = None


def processor_class(name: str) -> Any:
    """The processor class ``name`` from transformers, importable without torchvision.

    ``PixtralProcessor`` (Mistral 3) is marked as needing torchvision only because its module
    imports one helper, ``get_resize_output_image_size``, from the torchvision image processor's
    module; the PIL image processor's module defines the same function. That module stands in
    for the torchvision one during the import, and nothing else changes.
    """
    import importlib
    import sys

    import transformers

    cls = getattr(transformers, name)
    if isinstance(cls, type) and issubclass(cls, transformers.ProcessorMixin):
        return cls
    family = {"PixtralProcessor": "pixtral"}.get(name)
    if family is None:
        return cls  # a placeholder: instantiating it raises transformers' own "requires torchvision" error
    torchvision_module = f"transformers.models.{family}.image_processing_{family}"
    stand_in = importlib.import_module(f"transformers.models.{family}.image_processing_pil_{family}")
    had = torchvision_module in sys.modules
    if not had:
        sys.modules[torchvision_module] = stand_in
    try:
        return getattr(importlib.import_module(f"transformers.models.{family}.processing_{family}"), name)
    finally:
        if not had:
            sys.modules.pop(torchvision_module, None)


def image_processor_class(name: str) -> Any:
    """The image processor class ``name``: refsight's own PIL ones (:mod:`.pil_processors`), else transformers'."""
    from transformers.models.auto.image_processing_auto import get_image_processor_class_from_name

    from .pil_processors import PIL_CLASSES, pil_class

    return pil_class(name) if name in PIL_CLASSES else get_image_processor_class_from_name(name)


def family_classes(model_type: str) -> FamilyClasses:
    """The classes transformers' auto tables name for ``model_type``."""
    from transformers.models.auto.image_processing_auto import IMAGE_PROCESSOR_MAPPING_NAMES
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES, MODEL_MAPPING_NAMES
    from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES

    images = IMAGE_PROCESSOR_MAPPING_NAMES.get(model_type) or {}
    if isinstance(images, str):  # an older table: one class name
        images = {"pil": images}
    override = traits_for(model_type).image_processor
    if override is not None:
        images = {**images, "pil": override}
    image_processor = images.get("pil")
    if image_processor is None and images.get("torchvision") is not None:
        from ...torchvision_cpu import torchvision_imports

        # Only a torchvision class (LFM2-VL, Cohere2-Vision ...): served with it where torchvision imports.
        image_processor = images["torchvision"] if torchvision_imports() else None
    return FamilyClasses(
        model=MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES.get(model_type),
        processor=PROCESSOR_MAPPING_NAMES.get(model_type),
        image_processor=image_processor,
        torchvision_image_processor=images.get("torchvision"),
        base_model=base if isinstance(base := MODEL_MAPPING_NAMES.get(model_type), str) else None,
    )
