"""Atomic, durable file writes shared by the package store and the image catalog.

A write is split in two steps so that callers can publish under a database lock:

1. :func:`write_temp` writes the bytes to a hidden temp file *in the destination
   directory* and fsyncs it, computing the xxh3-128 checksum on the way.
2. :func:`publish` renames it over the final name and fsyncs the directory.

Temp files start with :data:`TEMP_PREFIX`; readers never look at them (they go
through the index), and ``gc`` removes stale ones left by killed writers.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Iterable

import xxhash

__all__ = ["TEMP_PREFIX", "write_temp", "publish", "fsync_dir", "checksum", "read_exact"]

TEMP_PREFIX = ".tmp-"
TEMP_SUFFIX = ".partial"


def checksum(data: bytes | bytearray | memoryview) -> str:
    """xxh3-128 hex of ``data``: a corruption check, not a content key (that stays sha256)."""
    return xxhash.xxh3_128_hexdigest(data)


def fsync_dir(directory: Path) -> None:
    """fsync a directory so that a rename or unlink inside it survives a power loss."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_temp(directory: Path, chunks: Iterable[bytes | bytearray | memoryview]) -> tuple[Path, str, int]:
    """Write ``chunks`` to a new temp file in ``directory``; returns (path, xxh3-128 hex, size).

    The file is fsynced before returning: a rename must never publish a name whose
    data blocks are not yet on disk (after a crash the name could point at zeros).
    The temp file lives in the destination directory so that the later rename is
    atomic (same file system) and never crosses devices.
    """
    directory.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=TEMP_PREFIX, suffix=TEMP_SUFFIX, dir=directory)
    path = Path(name)
    hasher = xxhash.xxh3_128()
    size = 0
    try:
        with os.fdopen(fd, "wb", buffering=0) as f:
            for chunk in chunks:
                view = memoryview(chunk).cast("B")
                hasher.update(view)
                while view:
                    written = f.write(view)
                    view = view[written:]
                    size += written
            os.fsync(f.fileno())
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return path, hasher.hexdigest(), size


def publish(temp: Path, final: Path) -> None:
    """Atomically rename ``temp`` to ``final``, then fsync the directory.

    ``os.replace`` is atomic: a reader sees the old file or the new one, never a
    torn one. The directory fsync makes the new name durable *before* the caller
    records it in the index, so an index row never outlives its file.
    """
    os.replace(temp, final)
    fsync_dir(final.parent)


def read_exact(path: Path, size: int) -> bytearray:
    """Read ``path`` into a new writable bytearray of exactly ``size`` bytes.

    Raises ``ValueError`` when the file is shorter or longer. A bytearray (not
    bytes) lets ``torch.frombuffer`` build writable tensors over it without a copy.
    """
    buf = bytearray(size)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        got = 0
        while got < size:
            n = f.readinto(view[got:])
            if not n:
                raise ValueError(f"file has {got} bytes, index says {size}")
            got += n
        if f.read(1):
            raise ValueError(f"file is longer than the {size} bytes the index records")
    return buf
