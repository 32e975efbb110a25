"""Naming store failures for what they are: a full or read-only disk is not a corrupt store.

SQLite reports a full disk in several ways: ``SQLITE_FULL`` ("database or disk is
full"), but also ``SQLITE_IOERR`` ("disk I/O error") when it cannot grow its shared
memory file, or ``SQLITE_CANTOPEN``. The OS reports ``ENOSPC``, ``EDQUOT`` or
``EROFS``. :func:`store_failure` turns any of them into a
:class:`~refsight.errors.StoreUnavailableError` whose message says "no space left on
device" (or "read-only file system", "disk quota exceeded"), checking the file system
itself when the error code alone is ambiguous; anything else stays a plain
:class:`~refsight.errors.StoreError` with the original reason.
"""

from __future__ import annotations

import errno
import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..errors import StoreError, StoreUnavailableError

__all__ = ["closed_on_failure", "store_failure", "unavailable_reason"]

_UNAVAILABLE_ERRNOS = {
    errno.ENOSPC: "no space left on device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EROFS: "read-only file system",
}
# SQLite primary result codes (the low byte of the extended code).
_SQLITE_READONLY, _SQLITE_IOERR, _SQLITE_CORRUPT, _SQLITE_CANTOPEN, _SQLITE_FULL, _SQLITE_NOTADB = 8, 10, 11, 14, 13, 26
# Below this much free space, an I/O error is taken to be a full disk: SQLite and the
# package writer fail well before the last byte is used.
_NEARLY_FULL_BYTES = 1 << 20


def _filesystem_reason(path: Path) -> str | None:
    """"no space left on device" / "read-only file system" when the file system of ``path`` is so."""
    probe = path
    while True:
        try:
            info = os.statvfs(probe)
            break
        except FileNotFoundError:
            if probe == probe.parent:
                return None
            probe = probe.parent  # not created yet: its closest existing parent's file system
        except OSError:
            return None
    if info.f_flag & getattr(os, "ST_RDONLY", 1):
        return "read-only file system"
    if info.f_bavail * info.f_frsize < _NEARLY_FULL_BYTES or (info.f_files and info.f_favail == 0):
        return "no space left on device"
    return None


def unavailable_reason(exc: BaseException, path: Path) -> str | None:
    """Why ``exc`` means the store cannot be written for now, or None when it means something else."""
    if isinstance(exc, OSError) and exc.errno in _UNAVAILABLE_ERRNOS:
        return _UNAVAILABLE_ERRNOS[exc.errno]
    code = getattr(exc, "sqlite_errorcode", None)
    primary = code & 0xFF if isinstance(code, int) else None
    if primary == _SQLITE_FULL:
        return "no space left on device"
    if isinstance(exc, OSError):
        # EIO may be a full disk in disguise (e.g. a failed write-back); other errnos say what they are.
        return _filesystem_reason(path) if exc.errno == errno.EIO else None
    if primary in (_SQLITE_IOERR, _SQLITE_CANTOPEN, _SQLITE_READONLY) or (
        primary is None and isinstance(exc, sqlite3.OperationalError)
    ):
        return _filesystem_reason(path)
    return None


def store_failure(exc: BaseException, path: Path, action: str) -> StoreError:
    """The refsight error for ``exc`` raised while doing ``action`` on ``path`` (to be raised by the caller).

    A full, over-quota or read-only disk gives :class:`StoreUnavailableError`; SQLite's
    "not a database" and "corrupt" give "is not a refsight store"; anything else a
    :class:`StoreError` with the original reason.
    """
    reason = unavailable_reason(exc, path)
    where = "" if str(path) in action else f" ({path})"
    if reason is not None:
        return StoreUnavailableError(f"{action}: {reason}{where}", reason)
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int) and code & 0xFF in (_SQLITE_NOTADB, _SQLITE_CORRUPT):
        return StoreError(f"{path} is not a refsight store: {exc}")
    detail = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    return StoreError(f"{action}: {detail}{where}")


@contextmanager
def closed_on_failure(resource: Any) -> Iterator[None]:
    """Close ``resource`` when the block raises: a database whose setup failed keeps no connection open."""
    try:
        yield
    except BaseException:
        resource.close()
        raise
