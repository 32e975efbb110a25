"""refsight's one way to replace a small file: a crash leaves the old file or the new one, never half of one.

Used by the retrieval index, the checkpoint-hash memo and anything else that rewrites a file in
place. (The store's package files have their own staged write, :mod:`refsight.store._files`,
which also checksums and fsyncs the directory; built models are whole directories renamed into
place, :func:`refsight.builtin_models.checkpoints.build_into_cache`.)
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

__all__ = ["replace_atomically"]


def replace_atomically(path: Path, write: Callable[[str], None]) -> None:
    """``write(temp path)`` into a temp file beside ``path``, fsync it, then rename it over ``path``."""
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
