"""A small JSON memo shared by processes: entries by key, merged and rewritten atomically under a file lock.

File layout: ``{"version": N, "entries": {key: {...}}}``. Readers never lock (the file is
replaced whole, so they see the old memo or the new one); writers merge with what other
processes wrote meanwhile. A memo that cannot be read or written only costs time: the
callers (checkpoint hashes, recorded encoder fingerprints) recompute what it would have held.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

__all__ = ["read_entries", "write_entry"]


def read_entries(memo: Path, version: int) -> dict[str, dict]:
    """The memo's entries, or {} when the file is missing, unreadable or of another version."""
    try:
        data = json.loads(memo.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("version") != version or not isinstance(data.get("entries"), dict):
        return {}
    return data["entries"]


def write_entry(memo: Path, version: int, key: str, entry: dict, keep: Callable[[str, dict], bool] = lambda k, e: True) -> None:
    """Add (or replace) one entry, merging with the file as it is now; ``keep`` drops stale entries."""
    from filelock import FileLock, Timeout

    from .atomic import replace_atomically

    try:
        memo.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(memo) + ".lock", timeout=30):
            entries = read_entries(memo, version)
            entries[key] = entry
            # Stale entries go, so the memo does not grow without bound.
            entries = {k: v for k, v in entries.items() if k == key or keep(k, v)}
            text = json.dumps({"version": version, "entries": entries}, sort_keys=True)
            replace_atomically(memo, lambda tmp: Path(tmp).write_text(text))
    except (OSError, Timeout):
        pass  # an unwritable memo only means the next process recomputes
