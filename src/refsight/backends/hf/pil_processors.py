"""PIL image processors for families transformers gives only a torchvision one, where a PIL one of
another family lays images out the same way.

``gemma4_unified`` (encoder-free Gemma 4): transformers 5.24 ships only
``Gemma4UnifiedImageProcessor`` (torchvision). It resizes exactly as Gemma 4 does (the same
aspect-ratio-preserving size for ``patch_size`` p, ``pooling_kernel_size`` k and
``max_soft_tokens``), cuts p-pixel patches and merges each k×k group into one ``(k·p)²·3``
row (``patches_merge``) at the group's position, padded to ``max_soft_tokens`` rows. That
merge is, row for row, Gemma 4's own patchify at ``k·p`` pixels with pooling 1: the groups
come in raster order, a group's pixels in row-major ``(row, column, channel)`` order, its
position the merged grid's. So :class:`Gemma4UnifiedImageProcessorPil` is
``Gemma4ImageProcessorPil`` called at the model-patch size: the same ``pixel_values`` shape,
``image_position_ids`` and ``num_soft_tokens_per_image`` as the torchvision class; the pixels
differ only as PIL's and torchvision's bicubic resize do (measured against torchvision 0.28 on
the sample photos at p 4 and 16, budgets 70 and 280: at most 2/255; 19/255 on random noise
squeezed 37×211 → 12×72; an image already on the grid is not resized by either).

The family traits name these classes (:attr:`~refsight.families.entry.Traits.image_processor`);
:func:`~.classes.image_processor_class` resolves the names here before transformers' table.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

__all__ = ["PIL_CLASSES", "pil_class"]


def _gemma4_unified() -> type:
    from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil

    class Gemma4UnifiedImageProcessorPil(Gemma4ImageProcessorPil):
        """``gemma4_unified``'s image layout on PIL: Gemma 4's at the model-patch size (module docstring)."""

        def _preprocess(self, images: list[Any], *args: Any, **kwargs: Any) -> Any:
            k = int(kwargs["pooling_kernel_size"])
            return super()._preprocess(
                images, *args, **{**kwargs, "patch_size": int(kwargs["patch_size"]) * k, "pooling_kernel_size": 1}
            )

    Gemma4UnifiedImageProcessorPil.__module__ = __name__
    Gemma4UnifiedImageProcessorPil.__qualname__ = Gemma4UnifiedImageProcessorPil.__name__
    return Gemma4UnifiedImageProcessorPil


#: Class name → the function that defines it (importing transformers only when called).
PIL_CLASSES: dict[str, Callable[[], type]] = {"Gemma4UnifiedImageProcessorPil": _gemma4_unified}


@functools.cache
def pil_class(name: str) -> type:
    """The class ``name`` of :data:`PIL_CLASSES` (defined once)."""
    return PIL_CLASSES[name]()
