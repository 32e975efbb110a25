"""SmolVLM and Idefics3: per-tile features and the tile layout.

The image processor resizes an image, cuts it into ``rows × cols`` tiles of the
tile size plus one downscaled global tile (or only the global tile for small
images), and the vision tower + pixel-shuffle connector turn each tile into
``image_seq_len`` feature rows. A package holds ``features`` shaped
``[tiles, image_seq_len, hidden]`` and the metadata ``rows``, ``cols``,
``image_seq_len`` and ``num_tokens``; the prompt's ``<fake_token_around_image>``,
``<row_r_col_c>``, ``<global-img>`` and ``<image>`` layout follows from them.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

from ...errors import CorruptPackageError, InvalidInputError
from ...package import VisualPackage
from .base import HFBackend

__all__ = ["SmolVLMBackend", "Idefics3Backend", "image_prompt_string"]

FAKE = "<fake_token_around_image>"
IMAGE = "<image>"
GLOBAL = "<global-img>"


def image_prompt_string(rows: int, cols: int, image_seq_len: int) -> str:
    """The expanded prompt text of one image with this tile layout (as SmolVLM's processor writes it)."""
    if rows == 0 and cols == 0:
        return f"{FAKE}{GLOBAL}{IMAGE * image_seq_len}{FAKE}"
    text = ""
    for r in range(rows):
        for c in range(cols):
            text += f"{FAKE}<row_{r + 1}_col_{c + 1}>{IMAGE * image_seq_len}"
        text += "\n"
    return text + f"\n{FAKE}{GLOBAL}{IMAGE * image_seq_len}{FAKE}"


class SmolVLMBackend(HFBackend):
    """SmolVLM (``model_type`` ``smolvlm``)."""

    family: ClassVar[str] = "smolvlm"
    model_types: ClassVar[tuple[str, ...]] = ("smolvlm",)
    reserved_tokens: ClassVar[tuple[str, ...]] = (FAKE, IMAGE, GLOBAL, "<end_of_utterance>", "<|im_start|>")
    media_tokens: ClassVar[tuple[str, ...]] = (FAKE, IMAGE, GLOBAL)
    #: ``tile_size``: the tile edge (processor ``max_image_size``); ``longest_edge``: resize bound.
    processor_options: ClassVar[tuple[str, ...]] = ("tile_size", "longest_edge", "do_image_splitting")
    #: Text that opens the chat template.
    bos_text: ClassVar[str] = "<|im_start|>"
    model_class_name: ClassVar[str] = "SmolVLMForConditionalGeneration"
    image_processor_path: ClassVar[str] = "transformers.models.smolvlm.image_processing_pil_smolvlm:SmolVLMImageProcessorPil"

    @classmethod
    def processor_overrides(cls, options: dict[str, Any], processor: Any) -> dict[str, Any]:
        """Map ``tile_size`` / ``longest_edge`` / ``do_image_splitting`` / ``max_pixels`` onto processor settings.

        SmolVLM resizes every image so its longest edge is ``size.longest_edge`` and then
        rounds both edges up to whole tiles. ``max_pixels`` therefore becomes the largest
        whole number of tiles ``n`` with ``(n·tile)² <= max_pixels``: every resized image
        then has at most ``max_pixels`` pixels. ``min_pixels`` has no SmolVLM equivalent
        and is refused.
        """
        if options.get("min_pixels") is not None:
            raise InvalidInputError(
                "min_pixels", "SmolVLM has no lower size bound (it resizes the longest edge to size.longest_edge)"
            )
        kwargs: dict[str, Any] = {}
        for key, target in (("tile_size", "max_image_size"), ("longest_edge", "size")):
            value = options.get(key)
            if value is None:
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise InvalidInputError(f"{key}={value!r}", "must be a positive integer number of pixels")
            kwargs[target] = {"longest_edge": value}
        if options.get("do_image_splitting") is not None:
            kwargs["do_image_splitting"] = bool(options["do_image_splitting"])
        max_pixels = options.get("max_pixels")
        if max_pixels is not None:
            if "size" in kwargs:
                raise InvalidInputError("max_pixels", "give max_pixels or longest_edge, not both")
            if not isinstance(max_pixels, int) or isinstance(max_pixels, bool) or max_pixels <= 0:
                raise InvalidInputError(f"max_pixels={max_pixels!r}", "must be a positive integer number of pixels")
            tile = int((kwargs.get("max_image_size") or processor.max_image_size)["longest_edge"])
            tiles = math.isqrt(max_pixels) // tile
            if tiles < 1:
                raise InvalidInputError(
                    f"max_pixels={max_pixels}", f"is below one {tile}×{tile} tile ({tile * tile} pixels)"
                )
            kwargs["size"] = {"longest_edge": tiles * tile}
        return kwargs

    @property
    def feature_size(self) -> int:
        """Width of a feature row (the language model's hidden size)."""
        return int(self.model.get_input_embeddings().weight.shape[1])

    def model_settings(self) -> dict[str, Any]:
        """Vision patch size, native tile size and the connector's pixel-shuffle factor."""
        vision = self.model.config.vision_config
        return {"patch_size": vision.patch_size, "image_size": vision.image_size, "scale_factor": self.model.config.scale_factor}

    def preprocess(self, images: list[Any]) -> Any:
        """The image processor on a batch, one image per row so each keeps its own tiles."""
        return self.image_processor.preprocess([[image] for image in images], return_tensors="pt", return_row_col_info=True)

    def encode_pils(self, images: list[Any]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        """Per-tile features ``[tiles, image_seq_len, hidden]`` and the tile layout per image."""
        inputs = self.preprocess(images)
        output = self.model.get_image_features(
            pixel_values=inputs["pixel_values"].to(self.device, self.model.dtype),
            pixel_attention_mask=inputs["pixel_attention_mask"].to(self.device),
            return_dict=True,
        )
        results = []
        for i, flat in enumerate(output.pooler_output):
            rows, cols = int(inputs["rows"][i][0]), int(inputs["cols"][i][0])
            tiles = rows * cols + 1 if rows or cols else 1
            seq = flat.shape[0] // tiles
            tensors = {"features": flat.reshape(tiles, seq, flat.shape[-1]).contiguous().clone()}
            metadata = {"rows": rows, "cols": cols, "tiles": tiles, "image_seq_len": seq, "num_tokens": tiles * seq}
            results.append((tensors, metadata))
        return results

    def check_package(self, package: VisualPackage) -> None:
        """Tiles = rows × cols (+ global), and features ``[tiles, image_seq_len, hidden]``."""
        meta = package.metadata
        rows, cols, seq = int(meta["rows"]), int(meta["cols"]), int(meta["image_seq_len"])
        if rows < 0 or cols < 0 or seq <= 0 or (rows == 0) != (cols == 0):
            raise CorruptPackageError(package.key, f"bad tile layout rows={rows} cols={cols} image_seq_len={seq}")
        tiles = rows * cols + 1 if rows else 1
        if int(meta["num_tokens"]) != tiles * seq:
            raise CorruptPackageError(package.key, f"num_tokens {meta['num_tokens']} != {tiles} tiles × {seq}")
        shape = list(package.tensors["features"].shape)
        if shape != [tiles, seq, self.feature_size]:
            raise CorruptPackageError(package.key, f"features shape {shape}, expected {[tiles, seq, self.feature_size]}")

    def image_placeholder(self, package: VisualPackage) -> str:
        """Tile markers and ``<image>`` tokens from rows, cols and image_seq_len."""
        meta = package.metadata
        return image_prompt_string(int(meta["rows"]), int(meta["cols"]), int(meta["image_seq_len"]))

    def chat_prompt(self, parts: list[str]) -> str:
        """SmolVLM's template: ``User:`` (no space before an image), the content, then ``Assistant:``."""
        # Every image placeholder starts with FAKE, and user text may not contain it.
        separator = ":" if parts and parts[0].startswith(FAKE) else ": "
        return f"{self.bos_text}User{separator}{''.join(parts)}<end_of_utterance>\nAssistant:"

    def chat_prompt_turns(self, turns: list[tuple[str, list[str]]]) -> str:
        """Several turns as SmolVLM's template renders them (``System:``/``User:``/``Assistant:`` each)."""
        if len(turns) == 1 and turns[0][0] == "user":
            return self.chat_prompt(turns[0][1])  # byte-identical to the single-turn prompt
        text = self.bos_text
        for role, parts in turns:
            separator = ":" if parts and parts[0].startswith(FAKE) else ": "
            text += f"{role.capitalize()}{separator}{''.join(parts)}<end_of_utterance>\n"
        return text + "Assistant:"

    def multimodal_inputs(self, packages: list[VisualPackage], input_ids: Any) -> dict[str, Any]:
        """Per-image features flattened to ``[tiles*seq, hidden]`` through ``mm_encoder_outputs``."""
        from transformers.modeling_outputs import BaseModelOutputWithPooling

        features = [p.tensors["features"].reshape(-1, p.tensors["features"].shape[-1]) for p in packages]
        return {"mm_encoder_outputs": {"image": BaseModelOutputWithPooling(pooler_output=features)}}


class Idefics3Backend(SmolVLMBackend):
    """Idefics3 (``model_type`` ``idefics3``): SmolVLM's layout with a Llama-3 template opener."""

    family: ClassVar[str] = "idefics3"
    model_types: ClassVar[tuple[str, ...]] = ("idefics3",)
    bos_text: ClassVar[str] = "<|begin_of_text|>"
    model_class_name: ClassVar[str] = "Idefics3ForConditionalGeneration"
    image_processor_path: ClassVar[str] = "transformers.models.idefics3.image_processing_pil_idefics3:Idefics3ImageProcessorPil"
