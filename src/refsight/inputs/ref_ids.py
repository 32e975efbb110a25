"""The one rule of a reference id: safe as a store key, a file name and a URL segment (also the namespace's rule)."""

from __future__ import annotations

import re

from ..errors import InvalidReferenceIdError

__all__ = ["validate_ref_id"]

_REF_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+=-]{0,127}")


def validate_ref_id(ref_id: object) -> str:
    """Return ``ref_id`` if it is a safe reference id, else raise :class:`InvalidReferenceIdError`.

    Allowed: 1–128 characters of letters, digits and ``. _ - @ + =``, starting with a
    letter or digit, with no ``..`` (ids may appear in paths and URLs).
    """
    if not isinstance(ref_id, str):
        raise InvalidReferenceIdError(ref_id, "a reference id must be a string")
    if not ref_id:
        raise InvalidReferenceIdError(ref_id, "a reference id cannot be empty")
    if len(ref_id) > 128:
        raise InvalidReferenceIdError(ref_id, "a reference id has at most 128 characters")
    if ".." in ref_id or not _REF_ID.fullmatch(ref_id):
        raise InvalidReferenceIdError(
            ref_id, "use letters, digits and . _ - @ + = only, starting with a letter or digit, and no '..'"
        )
    return ref_id
