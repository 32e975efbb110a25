"""The transformers classes of each model type, by name, and the generic backend's way to its traits.

Almost everything a family needs is already in transformers' own tables: the
``*ForConditionalGeneration`` class, the processor class, the PIL image processor
(:func:`family_classes`). What is left is a short list of exceptions per model type, kept
in its family entry (:class:`refsight.families.entry.Traits`, read here by :func:`traits_for`):
which output field of ``get_image_features`` holds the features, the processor settings that
change an image's placeholder layout (and so go into the key), narrow workarounds of
transformers bugs, the load options a family takes beyond the common ones (Qwen's pixel
bounds, SmolVLM's tiles: :mod:`.load_options`), and what a user must install. Every model type
with the seam (:func:`seam_problem` says why one has not), Qwen and SmolVLM included, is served by
:class:`~.generic.GenericBackend`.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

from ...families import family
from ...families.entry import Traits

__all__ = ["FamilyClasses", "family_classes", "image_processor_class", "processor_class", "seam_problem", "traits_for"]


def traits_for(model_type: str) -> Traits:
    """The model type's transformers exceptions, from its family entry (the defaults when it has none)."""
    return family(model_type).transformers.traits


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
        from ...support.torchvision_cpu import torchvision_imports

        # Only a torchvision class (LFM2-VL, Cohere2-Vision ...): served with it where torchvision imports.
        image_processor = images["torchvision"] if torchvision_imports() else None
    return FamilyClasses(
        model=MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES.get(model_type),
        processor=PROCESSOR_MAPPING_NAMES.get(model_type),
        image_processor=image_processor,
        torchvision_image_processor=images.get("torchvision"),
        base_model=base if isinstance(base := MODEL_MAPPING_NAMES.get(model_type), str) else None,
    )


def seam_problem(model_type: str, classes: FamilyClasses) -> str:
    """Why ``model_type`` cannot be served through the seam here ("" when it can)."""
    traits = traits_for(model_type)
    if traits.unavailable:
        return traits.unavailable
    if classes.model is None or classes.processor is None:
        return "transformers has no image-text-to-text model and processor for it"
    return _model_problem(classes) or _processor_problem(classes)


def _model_problem(classes: FamilyClasses) -> str:
    """Why the model class cannot take cached features: no ``mm_encoder_outputs`` seam, or no ``get_image_features``
    on it or its base model ("" when it can)."""
    import transformers

    model_class = getattr(transformers, classes.model, None)
    if model_class is None or "mm_encoder_outputs" not in inspect.signature(model_class.forward).parameters:
        return f"{classes.model} lacks the precomputed-features seam (mm_encoder_outputs)"
    base_class = getattr(transformers, classes.base_model or "", None)
    if not hasattr(model_class, "get_image_features") and not hasattr(base_class, "get_image_features"):
        return f"neither {classes.model} nor its base model has get_image_features"
    return ""


def _processor_problem(classes: FamilyClasses) -> str:
    """Why the processors cannot lay out a cached image's placeholder: a processor that expands images from the text
    alone, no image processor, or a torchvision one without torchvision ("" when they can)."""
    from transformers import ProcessorMixin

    processor = processor_class(classes.processor)
    if isinstance(processor, type) and getattr(processor, "replace_image_token", None) is ProcessorMixin.replace_image_token:
        return f"{classes.processor} has no replace_image_token (it expands images from the text alone)"
    if classes.image_processor is None and classes.torchvision_image_processor is None:
        return "transformers names no image processor for it"
    from ...support.torchvision_cpu import missing_torchvision

    return missing_torchvision(classes)
