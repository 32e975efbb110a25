"""Qwen's smart-resize grid: an image's size decides its tokens, before any encode.

The Qwen-VL image processors resize an image to multiples of patch × merge within their
pixel bounds (``smart_resize``) and cut it into patches; every ``merge²`` patches make one
prompt token. So an image's token count follows from its size alone, and another runtime
sent the image already resized onto its grid (PIL, as refsight's encoder resizes) encodes
exactly the pixels refsight would. The families with this grid are marked in their traits
(:attr:`~refsight.families.entry.Traits.grid`); these functions read only the backend's image processor
and model config.
"""

from __future__ import annotations

from typing import Any

__all__ = ["grid_size", "grid_tokens", "resize_to_grid", "merge_size", "grid_problem", "flat_embeddings"]


def merge_size(backend: Any) -> int:
    """Spatial merge size of the vision tower (2 for every released Qwen-VL)."""
    return int(backend.model.config.vision_config.spatial_merge_size)


def grid_size(backend: Any, width: int, height: int) -> tuple[int, int]:
    """(width, height) the processor resizes an image of this size to (multiples of patch × merge, within the bounds)."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

    processor = backend.image_processor
    size = processor.size
    low = getattr(size, "shortest_edge", None) or getattr(processor, "min_pixels", None)
    high = getattr(size, "longest_edge", None) or getattr(processor, "max_pixels", None)
    height, width = smart_resize(height, width, factor=processor.patch_size * processor.merge_size, min_pixels=low, max_pixels=high)
    return width, height


def grid_tokens(backend: Any, width: int, height: int) -> int:
    """Prompt tokens an image of this size takes once resized to its grid: (h / patch)·(w / patch) / merge²."""
    width, height = grid_size(backend, width, height)
    patch = int(backend.image_processor.patch_size)
    return (height // patch) * (width // patch) // merge_size(backend) ** 2


def resize_to_grid(backend: Any, image: Any) -> Any:
    """A PIL ``image`` resized with PIL to the size the processor would give it (a no-op for the processor then).

    refsight's encoder resizes with PIL, other runtimes' processors with torchvision, and the
    two bicubic kernels differ in the last bits: an image sent at its target size sees no
    second resize, so every runtime encodes exactly the pixels refsight would.
    """
    size = grid_size(backend, image.width, image.height)
    if size == image.size:
        return image
    return image.resize(size, resample=int(backend.image_processor.resample))


def grid_problem(backend: Any, metadata: dict[str, Any]) -> str:
    """Why a package's ``image_grid_thw`` disagrees with its feature rows ("" when they agree): the grid
    travels to vLLM beside the embeddings, and a grid that does not fit them takes its engine down."""
    grid = (metadata.get("layout") or {}).get("image_grid_thw")
    if not isinstance(grid, list) or not all(
        isinstance(row, list) and len(row) == 3 and all(isinstance(x, int) and x > 0 for x in row) for row in grid
    ):
        return f"image_grid_thw {grid!r} is not rows of three positive ints"
    tokens = sum(row[0] * row[1] * row[2] for row in grid) // merge_size(backend) ** 2
    if tokens != metadata.get("feature_rows"):
        return f"image_grid_thw {grid} makes {tokens} tokens, the features hold {metadata.get('feature_rows')} rows"
    return ""


def flat_embeddings(backend: Any, package: Any) -> Any:
    """A package as one ``[tokens, width]`` tensor, vLLM's ``image_embeds`` layout: the features, then each
    deepstack map beside them on the hidden axis (Qwen3-VL)."""
    import torch

    from .encoder_outputs import join

    output = join([package])
    features = output.pooler_output
    tensors = [torch.cat(list(features)) if isinstance(features, (list, tuple)) else features]
    for layer in getattr(output, "deepstack_features", None) or []:
        tensors.append(torch.cat(list(layer)) if isinstance(layer, (list, tuple)) else layer)
    return torch.cat(tensors, dim=-1) if len(tensors) > 1 else tensors[0]

