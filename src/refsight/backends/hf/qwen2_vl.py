"""Qwen2-VL and Qwen2.5-VL: merged patch features plus ``image_grid_thw``.

A package holds ``features`` (``[t*h*w / merge², hidden]``, the vision tower's
merged and projected output for one image) and the metadata ``image_grid_thw``
and ``num_tokens``. At generation the prompt gets ``num_tokens`` ``<|image_pad|>``
tokens between ``<|vision_start|>`` and ``<|vision_end|>``, ``mm_token_type_ids``
marks them for the 3D rotary positions, and the features enter through
``mm_encoder_outputs`` with no pixels.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, NamedTuple

from ...errors import CorruptPackageError, InvalidInputError
from ...images import ImageInput
from ...package import VisualPackage
from .base import HFBackend

__all__ = ["Qwen2VLBackend", "Qwen25VLBackend", "QwenFamilyBackend"]


class _Size(NamedTuple):
    """An image's size where :meth:`QwenFamilyBackend.grid_size` takes an image (it reads nothing else)."""

    width: int
    height: int


VISION_START = "<|vision_start|>"
VISION_END = "<|vision_end|>"
IMAGE_PAD = "<|image_pad|>"
DEFAULT_SYSTEM = "You are a helpful assistant."


class QwenFamilyBackend(HFBackend):
    """What Qwen2-VL, Qwen2.5-VL and Qwen3-VL share: grid metadata, prompt and template."""

    reserved_tokens: ClassVar[tuple[str, ...]] = (
        VISION_START,
        VISION_END,
        IMAGE_PAD,
        "<|video_pad|>",
        "<|im_start|>",
        "<|im_end|>",
    )
    media_tokens: ClassVar[tuple[str, ...]] = (VISION_START, VISION_END, IMAGE_PAD, "<|video_pad|>")
    processor_options: ClassVar[tuple[str, ...]] = ("min_pixels", "max_pixels")
    #: ``Qwen2VLImageProcessorPil`` (Qwen3-VL uses it too, with patch 16).
    image_processor_path: ClassVar[str] = "transformers.models.qwen2_vl.image_processing_pil_qwen2_vl:Qwen2VLImageProcessorPil"
    #: Qwen2/2.5 templates open with a default system turn; Qwen3-VL's does not.
    system_prompt: ClassVar[str | None] = DEFAULT_SYSTEM

    @classmethod
    def processor_overrides(cls, options: dict[str, Any], processor: Any) -> dict[str, Any]:
        """``min_pixels`` / ``max_pixels`` override the processor's size bounds (checked against each other)."""
        kwargs = {}
        for key in ("min_pixels", "max_pixels"):
            if key in options and options[key] is not None:
                value = options[key]
                if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                    raise InvalidInputError(f"{key}={value!r}", "must be a positive integer number of pixels")
                kwargs[key] = value
        # One bound given: it must still agree with the checkpoint's other bound.
        size = dict(getattr(processor, "size", None) or {})
        low = kwargs.get("min_pixels", size.get("shortest_edge"))
        high = kwargs.get("max_pixels", size.get("longest_edge"))
        if low is not None and high is not None and low > high:
            name = "min_pixels" if "min_pixels" in kwargs else "max_pixels"
            raise InvalidInputError(
                f"{name}={kwargs[name]}", f"min_pixels {low} would exceed max_pixels {high} (the other from the checkpoint)"
            )
        return kwargs

    @property
    def merge_size(self) -> int:
        """Spatial merge size of the vision tower (2 for every released Qwen-VL)."""
        return int(self.model.config.vision_config.spatial_merge_size)

    @property
    def feature_size(self) -> int:
        """Width of a merged feature row (the language model's hidden size)."""
        return int(self.model.get_input_embeddings().weight.shape[1])

    def model_settings(self) -> dict[str, Any]:
        """Merge, patch and temporal sizes of the vision tower."""
        vision = self.model.config.vision_config
        return {
            "spatial_merge_size": vision.spatial_merge_size,
            "patch_size": vision.patch_size,
            "temporal_patch_size": vision.temporal_patch_size,
        }

    def preprocess(self, images: list[Any]) -> Any:
        """The image processor on a batch of PIL images (one call site, easy to count in tests)."""
        return self.image_processor.preprocess(images, return_tensors="pt")

    def image_features(self, images: list[Any]) -> tuple[Any, Any]:
        """``get_image_features`` on a batch; returns (output, image_grid_thw)."""
        inputs = self.preprocess(images)
        grid = inputs["image_grid_thw"]
        output = self.model.get_image_features(
            pixel_values=inputs["pixel_values"].to(self.device, self.model.dtype),
            image_grid_thw=grid.to(self.device),
            return_dict=True,
        )
        return output, grid

    def encode_pils(self, images: list[Any]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        """Merged features per image (copied out of the batch tensor) and the grid."""
        output, grid = self.image_features(images)
        results = []
        for i, features in enumerate(output.pooler_output):
            thw = [int(x) for x in grid[i].tolist()]
            tensors = {"features": features.contiguous().clone()}
            tensors.update(self.extra_tensors(output, i))
            metadata = {"image_grid_thw": thw, "num_tokens": int(features.shape[0]), "merge_size": self.merge_size}
            results.append((tensors, metadata))
        return results

    def extra_tensors(self, output: Any, index: int) -> dict[str, Any]:
        """Tensors beyond ``features`` a family keeps per image (Qwen3-VL: deepstack)."""
        return {}

    def check_package(self, package: VisualPackage) -> None:
        """Grid × merge size agrees with ``num_tokens`` and the feature shape."""
        thw = package.metadata["image_grid_thw"]
        if len(thw) != 3 or any(int(x) <= 0 for x in thw):
            raise CorruptPackageError(package.key, f"image_grid_thw must be three positive ints, got {thw}")
        expected = math.prod(int(x) for x in thw) // self.merge_size**2
        if int(package.metadata["num_tokens"]) != expected:
            raise CorruptPackageError(package.key, f"num_tokens {package.metadata['num_tokens']} != grid {thw} / merge²")
        shape = list(package.tensors["features"].shape)
        if shape != [expected, self.feature_size]:
            raise CorruptPackageError(package.key, f"features shape {shape}, expected {[expected, self.feature_size]}")

    def image_placeholder(self, package: VisualPackage) -> str:
        """``<|vision_start|>`` + num_tokens × ``<|image_pad|>`` + ``<|vision_end|>``."""
        return VISION_START + IMAGE_PAD * int(package.metadata["num_tokens"]) + VISION_END

    def image_token_count(self, package: VisualPackage | ImageInput) -> int | None:
        """Prompt tokens one image takes; pixels are counted from their size through the grid, before encoding."""
        if isinstance(package, ImageInput):
            # From the size alone: released pixels are not decoded again to be counted.
            return self.grid_tokens(_Size(*package.size)) + 2  # the pads between <|vision_start|> and <|vision_end|>
        return super().image_token_count(package)

    def chat_prompt(self, parts: list[str]) -> str:
        """The Qwen chat template: optional system turn, one user turn, then the assistant cue."""
        system = f"<|im_start|>system\n{self.system_prompt}<|im_end|>\n" if self.system_prompt else ""
        return f"{system}<|im_start|>user\n{''.join(parts)}<|im_end|>\n<|im_start|>assistant\n"

    def chat_prompt_turns(self, turns: list[tuple[str, list[str]]]) -> str:
        """Several turns as Qwen's template renders them: a leading system turn replaces the default one."""
        if len(turns) == 1 and turns[0][0] == "user":
            return self.chat_prompt(turns[0][1])  # byte-identical to the single-turn prompt
        text = "" if turns and turns[0][0] == "system" or not self.system_prompt else (
            f"<|im_start|>system\n{self.system_prompt}<|im_end|>\n"
        )
        for role, parts in turns:
            text += f"<|im_start|>{role}\n{''.join(parts)}<|im_end|>\n"
        return text + "<|im_start|>assistant\n"

    # ---------------------------------------------- grid geometry and flat embeddings (vLLM)

    def grid_size(self, image: Any) -> tuple[int, int]:
        """(width, height) the processor resizes a PIL ``image`` to (multiples of patch × merge, within the pixel bounds)."""
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

        processor = self.image_processor
        size = processor.size
        low = getattr(size, "shortest_edge", None) or getattr(processor, "min_pixels", None)
        high = getattr(size, "longest_edge", None) or getattr(processor, "max_pixels", None)
        height, width = smart_resize(
            image.height, image.width, factor=processor.patch_size * processor.merge_size, min_pixels=low, max_pixels=high
        )
        return width, height

    def resize_to_grid(self, image: Any) -> Any:
        """``image`` resized with PIL to the size the processor would give it (a no-op for the processor then).

        refsight's encoder resizes with PIL, other runtimes' processors with torchvision, and
        the two bicubic kernels differ in the last bits: an image sent at its target size sees
        no second resize, so every runtime encodes exactly the pixels refsight would.
        """
        width, height = self.grid_size(image)
        if (width, height) == image.size:
            return image
        return image.resize((width, height), resample=int(self.image_processor.resample))

    def grid_tokens(self, image: Any) -> int:
        """Prompt tokens a PIL ``image`` takes once resized to its grid: (h / patch)·(w / patch) / merge²."""
        width, height = self.grid_size(image)
        patch = int(self.image_processor.patch_size)
        return (height // patch) * (width // patch) // self.merge_size**2

    def flat_embeddings(self, package: VisualPackage) -> Any:
        """The package as one ``[tokens, width]`` tensor, the layout of vLLM's ``image_embeds``: the features."""
        return package.tensors["features"]

    @property
    def embedding_width(self) -> int:
        """Width of one :meth:`flat_embeddings` row."""
        return self.feature_size

    def encoder_output(self, packages: list[VisualPackage]) -> Any:
        """The ``mm_encoder_outputs["image"]`` object for these packages, in prompt order."""
        from transformers.modeling_outputs import BaseModelOutputWithPooling

        return BaseModelOutputWithPooling(pooler_output=tuple(p.tensors["features"] for p in packages))

    def multimodal_inputs(self, packages: list[VisualPackage], input_ids: Any) -> dict[str, Any]:
        """Features via ``mm_encoder_outputs``, the grids, and ``mm_token_type_ids`` (1 on image pads)."""
        import torch

        image_token_id = int(self.model.config.image_token_id)
        return {
            "mm_encoder_outputs": {"image": self.encoder_output(packages)},
            "image_grid_thw": torch.tensor([p.metadata["image_grid_thw"] for p in packages], dtype=torch.long),
            "mm_token_type_ids": (input_ids == image_token_id).to(torch.int),
        }


class Qwen2VLBackend(QwenFamilyBackend):
    """Qwen2-VL (``model_type`` ``qwen2_vl``)."""

    family: ClassVar[str] = "qwen2_vl"
    model_types: ClassVar[tuple[str, ...]] = ("qwen2_vl",)
    model_class_name: ClassVar[str] = "Qwen2VLForConditionalGeneration"


class Qwen25VLBackend(QwenFamilyBackend):
    """Qwen2.5-VL (``model_type`` ``qwen2_5_vl``): windowed vision attention, same package layout."""

    family: ClassVar[str] = "qwen2_5_vl"
    model_types: ClassVar[tuple[str, ...]] = ("qwen2_5_vl",)
    model_class_name: ClassVar[str] = "Qwen2_5_VLForConditionalGeneration"

    def model_settings(self) -> dict[str, Any]:
        """Qwen2-VL's settings plus the attention window layout."""
        vision = self.model.config.vision_config
        return {
            **super().model_settings(),
            "window_size": vision.window_size,
            "fullatt_block_indexes": list(vision.fullatt_block_indexes),
        }
