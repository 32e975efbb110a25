"""pydantic's validation errors as the one line a 4xx says: each field named as the client wrote it, once.

A union's members are tried one by one, and pydantic names each in the error's location (``dict[str,float]``,
``literal['']``, ``PromptObject``): those steps are left out, and what each member wanted is joined under the one
field (``think: Input should be a valid boolean, or 'low', 'medium' or 'high'``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["error_field", "validation_message"]

#: A step of a validation error's location that names a type a union tried, not a field (``dict[str,float]``,
#: ``list[ContentPart]``, ``str``, ``PromptObject``).
_TYPE_STEP = re.compile(r".*\[.*|str|int|float|bool|none|dict|list|[A-Z][A-Za-z]*")


def error_field(error: Mapping[str, Any]) -> str:
    """The field a pydantic error is about, as the client wrote it (``logit_bias.1``; ``messages.0.content``), the
    union's type names left out; ``body`` when it is the whole body."""
    steps = [str(s) for s in error.get("loc", ()) if s != "body"]
    return ".".join(s for s in steps if not _TYPE_STEP.fullmatch(s)) or "body"


def validation_message(errors: Sequence[Mapping[str, Any]]) -> str:
    """pydantic's errors as one line, each field once: what each type of a union wanted joined (``think: Input should
    be a valid boolean, or 'low', 'medium' or 'high'``)."""
    wanted: dict[str, list[str]] = {}
    for err in errors:
        said = wanted.setdefault(error_field(err), [])
        message = str(err.get("msg", "invalid"))
        said.append(message if not said else message.removeprefix("Input should be "))
    parts = [f"{where}: {', or '.join(dict.fromkeys(said))}" for where, said in list(wanted.items())[:5]]
    return "; ".join(parts) or "the request is invalid"
