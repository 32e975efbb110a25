"""Chat turns of a request: checked against its segments, or folded into text for a backend without turns."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import InvalidInputError
from .base import ROLES

__all__ = ["plan_turns"]


def plan_turns(
    segments: list[Any], turns: Sequence[tuple[str, int]] | None, supported: bool
) -> tuple[list[Any], list[tuple[str, int]] | None]:
    """Check ``turns`` against ``segments``; for a backend without turns, label them in text instead."""
    if turns is None:
        return segments, None
    turns = [(str(role), int(count)) for role, count in turns]
    for i, (role, count) in enumerate(turns):
        if role not in ROLES:
            raise InvalidInputError(f"turns[{i}]", f"role must be one of {', '.join(ROLES)}, not {role!r}")
        if count < 0:
            raise InvalidInputError(f"turns[{i}]", "a turn's segment count cannot be negative")
    if sum(count for _, count in turns) != len(segments):
        raise InvalidInputError("turns", f"the turns cover {sum(c for _, c in turns)} segments, not {len(segments)}")
    if len(turns) == 1 and turns[0][0] == "user":
        return segments, None  # one user turn is the plain prompt
    if supported:
        return segments, turns
    # The backend renders one user turn: each turn is introduced by its role in the text.
    labelled: list[Any] = []
    start = 0
    for role, count in turns:
        labelled.append(f"{role}:")
        labelled += segments[start:start + count]
        start += count
    return labelled, None
