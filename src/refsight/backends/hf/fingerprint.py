"""What goes into a transformers backend's fingerprint: the settings that change its visual features.

The image processor's settings (as plain JSON), the family, the model-side settings
the family names (merge size, deepstack layers ...), the processor class actually run
and the attention kernels: two packages share a key only when all of these agree.
"""

from __future__ import annotations

from typing import Any

from ...package import EncoderFingerprint

__all__ = ["attn_implementation", "hf_fingerprint", "jsonable", "HF_PACKAGE_FORMAT"]

#: The format of transformers packages, in every key they have (``EncoderFingerprint.format_version``).
#: 2: every family's package is what :class:`~.generic.GenericBackend` stores: ``get_image_features``'
#: output as named tensors with its ``structure``, the expanded ``placeholder`` and the processor's
#: ``layout``. Format 1 Qwen and SmolVLM packages held ``features`` with ``image_grid_thw`` or tile
#: rows / cols instead. The format is in the key, so a format 1 package is never read as a format 2
#: one: a reference is encoded again from its kept image on first use (or all at once with
#: ``refsight reencode``), and the old packages age out as any unused package does.
HF_PACKAGE_FORMAT = 2

# Keys of an image processor's ``to_dict()`` that name the class, not a setting.
_NON_SETTINGS = {"image_processor_type", "processor_class", "_processor_class", "_valid_processor_keys", "backend"}


def jsonable(value: Any) -> Any:
    """Settings as plain JSON values (enums, tuples and numpy scalars included)."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, (bool, str)) or value is None:
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if hasattr(value, "item"):
        return value.item()
    if hasattr(value, "value"):  # enums such as PILImageResampling
        return jsonable(value.value)
    return str(value)


def attn_implementation(model: Any) -> dict[str, str]:
    """The attention kernels in use, per (sub-)config: they change features beyond rounding."""
    config = model.config
    out = {}
    holders = (("model", config), ("text", getattr(config, "text_config", None)), ("vision", getattr(config, "vision_config", None)))
    for part, holder in holders:
        value = getattr(holder, "_attn_implementation", None) if holder is not None else None
        if value is not None:
            out[part] = str(value)
    return out


def hf_fingerprint(backend: Any) -> EncoderFingerprint:
    """The fingerprint of an ``HFBackend`` from its processor, model and family settings."""
    processor = backend.image_processor
    settings = {k: v for k, v in processor.to_dict().items() if k not in _NON_SETTINGS and not callable(v)}
    settings = jsonable(settings)
    settings["family"] = backend.family
    settings["model"] = jsonable(backend.model_settings())
    # The class actually run (the saved config may name a torchvision twin):
    # two implementations of one processor need not agree to the last bit.
    settings["processor"] = type(processor).__name__
    settings["attn_implementation"] = attn_implementation(backend.model)
    return EncoderFingerprint(
        backend=f"hf-{backend.family}",
        model_id=backend.model_id,
        revision=backend.revision,
        dtype=str(backend.model.dtype).removeprefix("torch."),
        preprocessing=settings,
        format_version=HF_PACKAGE_FORMAT,
    )
