"""Atomic, durable file writes: the ONE publish path of kept images, packages and prefix states.

A write is split in two steps so that callers can publish under a database lock:

1. :func:`write_temp` writes the bytes to a hidden temp file *in the destination
   directory* and fsyncs it, computing the xxh3-128 checksum on the way.
2. :func:`publish` renames it over the final name and fsyncs the directory.

:func:`staged` wraps both in the order python-diskcache's ``Disk`` uses (file first, row
second): the temp file is written outside any lock, handed to the caller, who publishes it
inside the transaction that records its row; a failure anywhere removes the temp file (and a
published file whose row never committed, through the owner's ``withdraw``), and an ``OSError``
becomes the store's error for it (:func:`~refsight.store._failures.store_failure`: a full disk
is :class:`~refsight.errors.StoreUnavailableError` "no space left on device"), in one place.

Temp files start with :data:`TEMP_PREFIX`; readers never look at them (they go
through the index), and ``gc`` removes stale ones left by killed writers.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import xxhash

from ._failures import store_failure

__all__ = ["TEMP_PREFIX", "HEX_KEY", "SAFETENSORS_SUFFIX", "StagedFile", "staged", "write_temp", "publish", "fsync_dir", "checksum", "read_exact"]

TEMP_PREFIX = ".tmp-"
TEMP_SUFFIX = ".partial"
#: What names a file of the store: a sha256 hex digest (an image hash, a package or prefix key).
HEX_KEY = re.compile(r"[0-9a-f]{64}")
#: The suffix of package and prefix-state files.
SAFETENSORS_SUFFIX = ".safetensors"


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


class StagedFile:
    """A written, fsynced temp file beside ``final``, waiting for :meth:`publish` (see :func:`staged`)."""

    def __init__(self, temp: Path, final: Path, checksum: str, size: int) -> None:
        self.temp, self.final = temp, final
        self.checksum = checksum  # xxh3-128 hex of the bytes
        self.size = size
        self.published = False

    def publish(self) -> None:
        """Rename into place and fsync the directory; call it inside the transaction that records the row."""
        try:
            publish(self.temp, self.final)
        finally:
            # Renamed even if the directory fsync then failed: the final name is ours to withdraw.
            self.published = not self.temp.exists()


@contextmanager
def staged(
    final: Path, chunks: Iterable[bytes | bytearray | memoryview], *, what: str,
    withdraw: Callable[[], object] | None = None,
) -> Iterator[StagedFile]:
    """Write ``chunks`` to a temp file beside ``final`` and yield it for publishing; clean up on failure.

    ``what`` names the file in errors (``"image <sha256>"``). When the block raises after the
    file was published (its row did not commit), ``withdraw()`` is called to remove it again; it
    must check under the database write lock that no row names the file (a concurrent writer
    may have published and recorded the same name meanwhile). Without ``withdraw`` such a file
    stays an orphan for ``gc``.
    """
    try:
        temp, digest, size = write_temp(final.parent, chunks)
    except OSError as exc:
        raise store_failure(exc, final.parent, f"cannot write {what}") from exc
    file = StagedFile(temp, final, digest, size)
    try:
        yield file
    except OSError as exc:
        _withdraw(file, withdraw)
        raise store_failure(exc, final, f"cannot publish {what}") from exc
    except BaseException:
        _withdraw(file, withdraw)
        raise
    finally:
        if not file.published:
            temp.unlink(missing_ok=True)


def _withdraw(file: StagedFile, withdraw: Callable[[], object] | None) -> None:
    if not file.published or withdraw is None:
        return
    try:
        withdraw()
    except Exception:  # noqa: BLE001 - best effort: the original failure is what the caller must see; gc removes it later
        pass


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
