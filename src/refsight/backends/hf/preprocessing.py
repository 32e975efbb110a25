"""Image-processor settings a user may override (``processor_kwargs``), checked before any weight loads.

The settings a processor class accepts are the keys of its ``valid_kwargs`` TypedDict,
less the per-call ones that are not settings (``return_tensors``, ``device`` ...).
A name outside that set is refused by name. Values are then tried for real: the
processor is built with them and run on one small image, so a value of the wrong
type fails at load with the setting named, not on the first reference.
"""

from __future__ import annotations

import json
from typing import Any, Mapping

from ...errors import InvalidInputError

__all__ = ["settable_keys", "coerce_value", "check_processor_kwargs", "probe_processor"]

# Keys of valid_kwargs that steer one call rather than describe preprocessing.
_PER_CALL = {"return_tensors", "data_format", "input_data_format", "device", "return_row_col_info", "disable_grouping"}


def settable_keys(processor_class: Any) -> set[str]:
    """The image-processor settings ``processor_kwargs`` may set for ``processor_class``."""
    valid = getattr(processor_class, "valid_kwargs", None)
    keys: set[str] = set(getattr(valid, "__annotations__", {}) or {})
    for base in getattr(valid, "__mro__", ()):
        keys |= set(getattr(base, "__annotations__", {}) or {})
    if not keys:  # an older processor without the TypedDict: its own attribute names
        keys = {k for k in processor_class().to_dict() if not k.startswith("_")}
    return keys - _PER_CALL


def coerce_value(value: Any) -> Any:
    """A CLI string that holds a JSON object or list (``size={"longest_edge": 512}``) becomes it."""
    if isinstance(value, str) and value.strip()[:1] in ("{", "["):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def check_processor_kwargs(processor_class: Any, kwargs: Mapping[str, Any] | None) -> dict[str, Any]:
    """``kwargs`` with JSON strings decoded; unknown setting names raise :class:`InvalidInputError`."""
    kwargs = dict(kwargs or {})
    known = settable_keys(processor_class)
    unknown = sorted(set(kwargs) - known)
    if unknown:
        raise InvalidInputError(
            f"processor_kwargs: {', '.join(unknown)}",
            f"not a setting of {processor_class.__name__}; settable: {', '.join(sorted(known))}",
        )
    return {k: coerce_value(v) for k, v in kwargs.items()}


def probe_processor(processor: Any, keys: list[str]) -> None:
    """Run ``processor`` on one small image; a failure names the overridden ``keys``."""
    if not keys:
        return
    from PIL import Image

    try:
        processor.preprocess([Image.new("RGB", (64, 48), (120, 80, 40))], return_tensors="pt")
    except Exception as e:  # noqa: BLE001 - any failure here is a bad setting
        raise InvalidInputError(
            f"processor settings {', '.join(sorted(keys))}", f"the image processor refuses them: {type(e).__name__}: {e}"
        ) from None
