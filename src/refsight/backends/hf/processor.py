"""A family's transformers processor built for images alone: no video or audio processor.

``AutoProcessor`` loads every sub-processor a checkpoint names, and the video processors
of most VLMs import torchvision, which a CPU machine often cannot import beside its torch.
refsight never sends video, so :func:`image_only_processor` builds the family's processor
class from the PIL image processor and the tokenizer alone, with the checkpoint's own
processor settings (``image_seq_length`` ...) and chat template: the same object the
runtime's own pixel path uses, so placeholders expand exactly as transformers expands them.
"""

from __future__ import annotations

import functools
from typing import Any

from ...errors import ModelLoadError

__all__ = ["image_only_processor", "image_only_class"]

_KEPT = ("image_processor", "tokenizer")


class _Absent(dict):
    """Stands in for a sub-processor that is not built, while the processor's ``__init__`` runs.

    Some ``__init__`` read a setting of their video processor (MiniCPM-V: ``slice_mode``); every
    attribute reads as None. A dict, so the processor's repr (JSON, logged at construction) works.
    It is replaced by None once the processor is built.
    """

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return None


@functools.cache
def image_only_class(processor_class: type) -> type:
    """``processor_class`` accepting None for every sub-processor but the image processor and tokenizer."""

    def check_argument_for_proper_class(self: Any, argument_name: str, argument: Any) -> Any:
        if (argument is None or isinstance(argument, _Absent)) and argument_name not in _KEPT:
            return None  # a video / audio processor refsight never calls
        return processor_class.check_argument_for_proper_class(self, argument_name, argument)

    return type(
        processor_class.__name__, (processor_class,),
        {"check_argument_for_proper_class": check_argument_for_proper_class, "__module__": processor_class.__module__},
    )


def image_only_processor(
    processor_class: type, source: str, image_processor: Any, tokenizer: Any, hub: dict[str, Any], name: str
) -> Any:
    """The family's processor over ``image_processor`` and ``tokenizer``, settings read from ``source``."""
    cls = image_only_class(processor_class)
    try:
        settings, _ = cls.get_processor_dict(source, **hub)
        parts = [image_processor if a == "image_processor" else tokenizer if a == "tokenizer" else _Absent()
                 for a in cls.get_attributes()]
        processor = cls.from_args_and_dict(parts, settings)
        for attribute in cls.get_attributes():
            if isinstance(getattr(processor, attribute, None), _Absent):
                setattr(processor, attribute, None)
    except Exception as e:  # noqa: BLE001 - any failure: this checkpoint's processor cannot be built
        raise ModelLoadError(name, f"cannot build {processor_class.__name__} from {source}: {type(e).__name__}: {e}") from e
    if getattr(processor, "chat_template", None) is None and getattr(tokenizer, "chat_template", None):
        processor.chat_template = tokenizer.chat_template
    if getattr(processor, "image_token", None) is None:
        raise ModelLoadError(name, f"{processor_class.__name__} names no image token; refsight cannot place images")
    return processor
