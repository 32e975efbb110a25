"""Load options that map onto a family's image processor: Qwen's pixel bounds, SmolVLM's tiles.

``--min-pixels`` / ``--max-pixels`` are common options, but what they mean depends on how a
family resizes: Qwen's processor takes the bounds as they are, SmolVLM's resizes the longest
edge and rounds up to whole tiles. A family names its mapping in its traits
(:attr:`~refsight.families.entry.Traits.options`); :data:`MAPPINGS` holds each mapping's extra option
names and the function that turns the options into image-processor settings, checked
against the checkpoint's own processor. A family with no mapping refuses the pixel bounds.
"""

from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple

from ...errors import InvalidInputError

__all__ = ["Mapping", "MAPPINGS", "mapping_for", "no_bounds", "pixel_bounds", "tiles", "tile_tokens"]


def _positive_pixels(key: str, value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise InvalidInputError(f"{key}={value!r}", "must be a positive integer number of pixels")
    return value


def no_bounds(options: dict[str, Any], processor: Any, family: str) -> dict[str, Any]:
    """A family whose processor has no pixel bounds: ``min_pixels`` / ``max_pixels`` are refused."""
    for key in ("min_pixels", "max_pixels"):
        if options.get(key) is not None:
            raise InvalidInputError(key, f"is not a setting of the {family} image processor")
    return {}


def pixel_bounds(options: dict[str, Any], processor: Any, family: str) -> dict[str, Any]:
    """Qwen: ``min_pixels`` / ``max_pixels`` override the processor's size bounds (checked against each other)."""
    kwargs = {key: _positive_pixels(key, options[key]) for key in ("min_pixels", "max_pixels") if options.get(key) is not None}
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


def tiles(options: dict[str, Any], processor: Any, family: str) -> dict[str, Any]:
    """SmolVLM / Idefics3: ``tile_size`` / ``longest_edge`` / ``do_image_splitting`` / ``max_pixels`` as processor settings.

    SmolVLM resizes every image so its longest edge is ``size.longest_edge`` and then rounds
    both edges up to whole tiles. ``max_pixels`` therefore becomes the largest whole number
    of tiles ``n`` with ``(n·tile)² <= max_pixels``: every resized image then has at most
    ``max_pixels`` pixels. ``min_pixels`` has no SmolVLM equivalent and is refused.
    """
    if options.get("min_pixels") is not None:
        raise InvalidInputError(
            "min_pixels", f"{family} has no lower size bound (it resizes the longest edge to size.longest_edge)"
        )
    kwargs: dict[str, Any] = {}
    for key, target in (("tile_size", "max_image_size"), ("longest_edge", "size")):
        if options.get(key) is not None:
            kwargs[target] = {"longest_edge": _positive_pixels(key, options[key])}
    if options.get("do_image_splitting") is not None:
        kwargs["do_image_splitting"] = bool(options["do_image_splitting"])
    max_pixels = options.get("max_pixels")
    if max_pixels is not None:
        if "size" in kwargs:
            raise InvalidInputError("max_pixels", "give max_pixels or longest_edge, not both")
        _positive_pixels("max_pixels", max_pixels)
        tile = int((kwargs.get("max_image_size") or processor.max_image_size)["longest_edge"])
        count = math.isqrt(max_pixels) // tile
        if count < 1:
            raise InvalidInputError(f"max_pixels={max_pixels}", f"is below one {tile}×{tile} tile ({tile * tile} pixels)")
        kwargs["size"] = {"longest_edge": count * tile}
    return kwargs


def tile_tokens(processor: Any, config: Any) -> None:
    """SmolVLM / Idefics3: the processor's ``image_seq_len`` (the ``<image>`` tokens of one tile) for the
    tile size in effect: a tile of ``t`` pixels is ``(t / patch)²`` patches, pixel-shuffled by ``scale²``.

    A checkpoint saves the count for its own tile size; a ``tile_size`` option changes how many
    feature rows the connector makes per tile, so the placeholder must change with it.
    """
    tile = int(processor.image_processor.max_image_size["longest_edge"])
    patch, scale = int(config.vision_config.patch_size), int(config.scale_factor)
    processor.image_seq_len = (tile // patch) ** 2 // scale**2


class Mapping(NamedTuple):
    """One family's load options: the names beyond the common ones, their processor settings, and what
    the loaded processor must derive from them (``fit(processor, model_config)``)."""

    names: tuple[str, ...]
    apply: Callable[[dict[str, Any], Any, str], dict[str, Any]]
    fit: Callable[[Any, Any], None] | None = None


#: Mapping name (a family's :attr:`~refsight.families.entry.Traits.options`) → :class:`Mapping`.
MAPPINGS: dict[str, Mapping] = {
    "": Mapping((), no_bounds),
    "pixel_bounds": Mapping((), pixel_bounds),
    "tiles": Mapping(("tile_size", "longest_edge", "do_image_splitting"), tiles, tile_tokens),
}


def mapping_for(name: str) -> Mapping:
    """The :class:`Mapping` a family's traits name."""
    return MAPPINGS[name]
