"""The base of every request body: strict types, and in a dialect's body the fields refsight does not use, named.

**Strict types** (:class:`StrictBody`, pydantic's strict mode): a string is not a number or a boolean, a number
is not a boolean, and a fractional number is not an integer, in every field of every body (``"max_tokens": "5"``,
``"stream": "yes"``, ``"n_probs": true`` are a 400 or 422 naming the field, on every dialect); a field's own type
decides, never a field-by-field check.

**A dialect takes the fields its real clients send** (:class:`DialectBody`: OpenAI's, vLLM's, llama-server's,
Ollama's and Anthropic's bodies). A field refsight does not know is accepted; so is a *hint*, a known field whose
value cannot change the answer (``cache_prompt``, ``num_thread``, ``metadata`` ...). Both are named in the
reply's ``refsight.ignored`` (:meth:`DialectBody.ignored_fields`: their paths, ``options.num_thread``,
``messages[0].content[1].cache_control``) and logged once at INFO (:func:`log_ignored`), as vLLM logs the fields
it ignores; never refused. A field that would change the answer is known, and honoured or refused by name where
its body is checked.
"""

from __future__ import annotations

import logging
import re
import threading
from typing import ClassVar

from pydantic import BaseModel, ConfigDict

__all__ = ["StrictBody", "DialectBody", "log_ignored", "MAX_LOGGED_NAMES"]

log = logging.getLogger("refsight.server")

#: Distinct ignored field names logged in a process's life (the names are the clients'; the log stays bounded).
MAX_LOGGED_NAMES = 1024
#: The characters of a field name a log line shows.
_NAME_CHARS = 80
_INDEX = re.compile(r"\[\d+\]")
_logged: set[str] = set()
_logged_lock = threading.Lock()


class StrictBody(BaseModel):
    """A request body whose fields take their own type only (see the module docstring); unknown fields refused."""

    model_config = ConfigDict(strict=True, extra="forbid")


class DialectBody(StrictBody):
    """A dialect's request body (or a part of one): unknown fields accepted, and named with the hints."""

    model_config = ConfigDict(extra="allow")
    #: Declared fields whose value cannot change the answer: accepted and named in ``refsight.ignored`` when sent.
    hints: ClassVar[frozenset[str]] = frozenset()

    def ignored_fields(self, where: str = "") -> list[str]:
        """The paths of the fields sent here that refsight does not use: unknown ones and hints, then those of the
        parts (a nested body, or a list of them) in field order. ``where``: this body's own path, dot included."""
        own = sorted({*(self.model_extra or {}), *(self.hints & self.model_fields_set)})
        names = [where + name for name in own]
        for name in type(self).model_fields:
            value = getattr(self, name)
            if isinstance(value, DialectBody):
                names += value.ignored_fields(f"{where}{name}.")
            elif isinstance(value, list):
                for i, item in enumerate(value):
                    if isinstance(item, DialectBody):
                        names += item.ignored_fields(f"{where}{name}[{i}].")
        return names


def log_ignored(route: str, names: list[str]) -> list[str]:
    """``names`` (what a request to ``route`` sent that refsight does not use), each name logged at INFO the first
    time it is seen (indexes aside: ``messages[3].name`` is ``messages[].name``), at most
    :data:`MAX_LOGGED_NAMES` in the process's life; returns ``names``."""
    if not names:
        return names
    fresh = []
    with _logged_lock:
        for name in names:
            key = _INDEX.sub("[]", name)[:_NAME_CHARS]
            if key not in _logged and len(_logged) < MAX_LOGGED_NAMES:
                _logged.add(key)
                fresh.append(key)
    if fresh:
        log.info("%s: the request sent fields refsight does not use, ignored (and named in the reply's "
                 "refsight.ignored): %s", route, ", ".join(fresh))
    return names
