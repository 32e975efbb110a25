"""Qwen3-VL: merged features, the deepstack features and the grid (patch 16, merge 2).

Qwen3-VL adds "deepstack" features: outputs of a few intermediate vision layers,
merged like the final ones, that the language model adds to its hidden states at
the image positions of its first layers. A package therefore holds ``features``
and ``deepstack.0`` ... ``deepstack.{k-1}`` (all ``[num_tokens, hidden]``); the
metadata records ``deepstack_layers`` = k.
"""

from __future__ import annotations

from typing import Any, ClassVar

from ...errors import CorruptPackageError
from ...package import VisualPackage
from .qwen2_vl import QwenFamilyBackend

__all__ = ["Qwen3VLBackend"]


class Qwen3VLBackend(QwenFamilyBackend):
    """Qwen3-VL (``model_type`` ``qwen3_vl``)."""

    family: ClassVar[str] = "qwen3_vl"
    model_types: ClassVar[tuple[str, ...]] = ("qwen3_vl",)
    system_prompt: ClassVar[str | None] = None
    model_class_name: ClassVar[str] = "Qwen3VLForConditionalGeneration"

    @property
    def deepstack_layers(self) -> int:
        """How many deepstack feature maps the vision tower emits."""
        return len(self.model.config.vision_config.deepstack_visual_indexes)

    def model_settings(self) -> dict[str, Any]:
        """Qwen settings plus the deepstack layer indexes and position-embedding grid."""
        vision = self.model.config.vision_config
        return {
            **super().model_settings(),
            "deepstack_visual_indexes": list(vision.deepstack_visual_indexes),
            "num_position_embeddings": vision.num_position_embeddings,
        }

    def encode_pils(self, images: list[Any]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        """As Qwen2-VL, and record how many deepstack maps each package carries."""
        results = super().encode_pils(images)
        for _, metadata in results:
            metadata["deepstack_layers"] = self.deepstack_layers
        return results

    def extra_tensors(self, output: Any, index: int) -> dict[str, Any]:
        """``deepstack.{layer}``: this image's slice of each deepstack feature map."""
        return {
            f"deepstack.{layer}": per_image[index].contiguous().clone()
            for layer, per_image in enumerate(output.deepstack_features)
        }

    def check_package(self, package: VisualPackage) -> None:
        """Qwen checks plus one deepstack tensor per layer, each shaped like ``features``."""
        super().check_package(package)
        if int(package.metadata.get("deepstack_layers", -1)) != self.deepstack_layers:
            raise CorruptPackageError(
                package.key, f"deepstack_layers {package.metadata.get('deepstack_layers')} != {self.deepstack_layers}"
            )
        shape = list(package.tensors["features"].shape)
        for layer in range(self.deepstack_layers):
            name = f"deepstack.{layer}"
            if name not in package.tensors:
                raise CorruptPackageError(package.key, f"missing tensor {name}")
            if list(package.tensors[name].shape) != shape:
                raise CorruptPackageError(package.key, f"{name} shape {list(package.tensors[name].shape)} != {shape}")

    def flat_embeddings(self, package: VisualPackage) -> Any:
        """``[features | deepstack.0 | deepstack.1 ...]`` concatenated on the hidden axis (vLLM's layout)."""
        import torch

        tensors = [package.tensors["features"]]
        tensors += [package.tensors[f"deepstack.{layer}"] for layer in range(self.deepstack_layers)]
        return torch.cat(tensors, dim=-1) if len(tensors) > 1 else tensors[0]

    @property
    def embedding_width(self) -> int:
        """Features and every deepstack map side by side."""
        return self.feature_size * (1 + self.deepstack_layers)

    def encoder_output(self, packages: list[VisualPackage]) -> Any:
        """Pooled features and deepstack features, per image, in prompt order."""
        from transformers.models.qwen3_vl.modeling_qwen3_vl import BaseModelOutputWithDeepstackFeatures

        return BaseModelOutputWithDeepstackFeatures(
            pooler_output=tuple(p.tensors["features"] for p in packages),
            deepstack_features=[
                tuple(p.tensors[f"deepstack.{layer}"] for p in packages) for layer in range(self.deepstack_layers)
            ],
        )
