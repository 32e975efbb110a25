"""The digest of a weights file, which the pretrained models' fingerprints name."""

from __future__ import annotations

import hashlib
from pathlib import Path


def file_sha256(path: Path) -> str:
    """sha256 hex of the file's bytes, read in 1 MiB blocks (weights files are tens of megabytes)."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
