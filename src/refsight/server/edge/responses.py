"""The JSON response every route and error answers with: it never fails on text that is not valid Unicode.

A value read back from the store (metadata, an id, a model's text) could hold a lone
surrogate that got in before intake refused them, or through a path that does not check.
Encoding it as UTF-8 raises, and a listing would answer 500 for as long as the row exists.
:class:`TextSafeJSONResponse` encodes as usual and, only when that fails, again with every
lone surrogate replaced by U+FFFD (:func:`refsight.inputs.text.printable_text`): the reply is valid
UTF-8 JSON and says, visibly, that a character could not be shown.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi.responses import JSONResponse

from ...inputs.text import printable_text

__all__ = ["TextSafeJSONResponse", "printable_data"]


def printable_data(value: Any) -> Any:
    """``value`` (JSON-ready data) with :func:`refsight.inputs.text.printable_text` applied to every string, keys included."""
    if isinstance(value, str):
        return printable_text(value)
    if isinstance(value, dict):
        return {printable_data(k): printable_data(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [printable_data(v) for v in value]
    return value


class TextSafeJSONResponse(JSONResponse):
    """``JSONResponse`` whose rendering survives strings that cannot be encoded (see the module docstring)."""

    def render(self, content: Any) -> bytes:
        """Compact UTF-8 JSON, as Starlette renders it; lone surrogates become U+FFFD."""
        try:
            return super().render(content)
        except UnicodeEncodeError:
            text = json.dumps(printable_data(content), ensure_ascii=False, allow_nan=False, separators=(",", ":"))
            return text.encode("utf-8")
