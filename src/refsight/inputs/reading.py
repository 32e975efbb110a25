"""Reading a user-named file without trusting it: regular files only, never blocking, never unbounded.

``refsight add /dev/zero`` must not read forever, and ``refsight add FIFO`` must
not wait forever for a writer. :func:`read_regular_file` therefore opens with
``O_NONBLOCK`` (opening a FIFO for reading returns at once instead of waiting for
a writer), checks with ``fstat`` on the opened descriptor (no race with a rename
between a check and the open) that it is a regular file, and reads at most
``max_bytes + 1`` bytes whatever ``st_size`` claims (files such as those under
``/proc`` report a size of 0 and then deliver more).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

__all__ = ["FileReadError", "file_kind", "read_regular_file"]


class FileReadError(Exception):
    """A file that cannot be read as asked; ``reason`` is a short phrase for the user."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def file_kind(mode: int) -> str:
    """What a non-regular file is, in words (for messages)."""
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def read_regular_file(path: str | os.PathLike, max_bytes: int) -> bytes:
    """The bytes of the regular file ``path``, at most ``max_bytes`` of them.

    Raises :class:`FileReadError` for a missing or unreadable path, anything that is
    not a regular file (directory, FIFO, device, socket) and a file over
    ``max_bytes``; the reason names which. Never blocks on a FIFO.
    """
    fd = _open(path)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise FileReadError(f"is {file_kind(info.st_mode)}, not a regular file; only regular files are read")
        if info.st_size > max_bytes:
            raise FileReadError(f"file is {info.st_size} bytes, over the {max_bytes}-byte limit")
        return _read_bounded(fd, max_bytes)
    except OSError as e:
        raise FileReadError(f"cannot read file: {e.strerror or e}") from None
    finally:
        os.close(fd)


def _open(path: str | os.PathLike) -> int:
    """A file descriptor of ``path``, opened without blocking (a FIFO) or taking a terminal; :class:`FileReadError`
    naming why it cannot be opened."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0)
    try:
        return os.open(Path(path), flags)
    except FileNotFoundError:
        raise FileReadError("no such file") from None
    except IsADirectoryError:
        raise FileReadError("is a directory, not an image file") from None
    except PermissionError:
        raise FileReadError("permission denied") from None
    except (OSError, ValueError) as e:  # ENAMETOOLONG, ELOOP, ENXIO (a socket), a NUL in the path ...
        raise FileReadError(f"cannot read file: {getattr(e, 'strerror', None) or e}") from None


def _read_bounded(fd: int, max_bytes: int) -> bytes:
    """All of ``fd``'s bytes, refused past ``max_bytes`` whatever its size said."""
    # Read one byte past the limit to detect "more".
    chunks: list[bytes] = []
    total = 0
    while total <= max_bytes:
        chunk = os.read(fd, min(1 << 20, max_bytes + 1 - total))
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    if total > max_bytes:
        raise FileReadError(f"file is over the {max_bytes}-byte limit")
    return b"".join(chunks)
