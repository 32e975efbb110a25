"""Text for a terminal: control characters from user data are shown escaped, never obeyed.

Criteria, metadata, evidence and generated text are user (or model) data. Printed
raw, an ESC sequence in them could recolour, move the cursor, rewrite earlier lines
(``\\r``) or retitle the terminal. :func:`escape_controls` turns C0/C1 control
characters and the Unicode bidirectional overrides into visible escapes (``\\x1b``,
``\\u202e``); JSON output needs none of this (``json.dumps`` escapes them itself).
"""

from __future__ import annotations

import re

__all__ = ["escape_controls"]

# C0 and C1 controls, DEL, and the bidi embedding/override/isolate characters.
_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\u2028\u2029]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def escape_controls(text: str, *, keep: str = "") -> str:
    """``text`` with control characters escaped, except those in ``keep`` (e.g. ``"\\n\\t"`` for layout)."""
    if keep:
        return re.sub(_CONTROLS, lambda m: m.group() if m.group() in keep else _escape(m), text)
    return _CONTROLS.sub(_escape, text)
