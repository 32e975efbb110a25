"""A replica's own disk in front of the bucket: packages as self-checking files, least recently used out.

Tier order with a bucket store: process memory → Redis → **this** → bucket → encode. Each replica
keeps one under its ``--local-dir`` (nothing in it is shared, nothing in it is the truth):

- **Values check themselves**, as Redis's do (:mod:`refsight.store._packed`: magic, xxh3-128, a
  header deriving the very key it was read under): a file that fails is a miss, deleted, never served.
- **Bounded by bytes** (``max_bytes``; ``--local-cache-bytes``, ``[store] local_cache_bytes``): after a
  write, least recently used files go until the rest fits. The order lives in memory, seeded at open
  from the files' modification times (a hit refreshes its file's time), so it survives a restart.
- **Atomic writes without fsync**: a temp file renamed into place; a crash may lose a file or leave
  a damaged one, which its check turns into a miss.

Layout: ``<local-dir>/package-cache/ab/<key>.pkg``.
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any, Iterator

from ..errors import CorruptPackageError
from ..package import VisualPackage
from ._files import HEX_KEY, TEMP_PREFIX
from ._packed import pack, unpack
from .base import PackageStore

__all__ = ["LocalPackageCache", "DEFAULT_LOCAL_CACHE_BYTES", "CACHE_DIR"]

log = logging.getLogger("refsight.store")

DEFAULT_LOCAL_CACHE_BYTES = 8 * 1024**3
CACHE_DIR = "package-cache"
_SUFFIX = ".pkg"
_STALE_TEMP_S = 3600.0


class LocalPackageCache(PackageStore):
    """Packages under ``root/package-cache``, at most ``max_bytes`` of files; thread-safe."""

    name = "local"

    def __init__(self, root: str | os.PathLike, max_bytes: int = DEFAULT_LOCAL_CACHE_BYTES) -> None:
        self.directory = Path(root) / CACHE_DIR
        self.directory.mkdir(parents=True, exist_ok=True)
        self.max_bytes = int(max_bytes)
        self._lock = threading.Lock()
        self._sizes: OrderedDict[str, int] = OrderedDict()  # least recently used first
        self._used = 0
        self.counts = {"writes": 0, "bytes_written": 0, "corrupt": 0, "evictions": 0}
        self._scan()

    def path_for(self, key: str) -> Path:
        """Where the file of ``key`` lives (256 shards)."""
        return self.directory / key[:2] / f"{key}{_SUFFIX}"

    def _scan(self) -> None:
        now = time.time()
        found = []
        for path in self.directory.glob("*/*"):
            try:
                stat = path.stat()
            except FileNotFoundError:
                continue
            key = path.name.removesuffix(_SUFFIX)
            if path.name.startswith(TEMP_PREFIX):
                if now - stat.st_mtime > _STALE_TEMP_S:
                    path.unlink(missing_ok=True)  # a killed writer's
            elif HEX_KEY.fullmatch(key):
                found.append((stat.st_mtime, key, stat.st_size))
        for _, key, size in sorted(found):
            self._sizes[key] = size
            self._used += size

    # -- PackageStore -----------------------------------------------------------------
    def get(self, key: str) -> VisualPackage | None:
        """The package, or None (absent, or corrupt: then deleted)."""
        if not HEX_KEY.fullmatch(key):
            return None
        path = self.path_for(key)
        try:
            value = path.read_bytes()
        except OSError:
            self._forget(key)
            return None
        try:
            package = unpack(key, value)
        except CorruptPackageError as exc:
            log.warning("refsight: local cache file of %s is corrupt (%s): deleted", key, exc.reason)
            with self._lock:
                self.counts["corrupt"] += 1
            self.delete(key)
            return None
        try:
            os.utime(path)  # least recently *used* goes first, after a restart too
        except OSError:
            pass
        with self._lock:
            if key not in self._sizes:
                self._used += len(value)
            self._sizes[key] = len(value)
            self._sizes.move_to_end(key)
        return package

    def put(self, package: VisualPackage) -> int:
        """Write the package's file (replacing one there); returns its size, 0 when larger than the whole cache."""
        value = pack(package)
        if len(value) > self.max_bytes:
            return 0
        path = self.path_for(package.key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, temp = tempfile.mkstemp(prefix=TEMP_PREFIX, dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(value)
            os.replace(temp, path)
        except BaseException:
            Path(temp).unlink(missing_ok=True)
            raise
        with self._lock:
            self._used += len(value) - self._sizes.pop(package.key, 0)
            self._sizes[package.key] = len(value)
            self.counts["writes"] += 1
            self.counts["bytes_written"] += len(value)
            victims = self._over_budget(keep=package.key)
        for key in victims:
            self.path_for(key).unlink(missing_ok=True)
        return len(value)

    def _over_budget(self, keep: str) -> list[str]:
        # Under the lock: the least recently used keys to drop so that the rest fits.
        victims = []
        for key in list(self._sizes):
            if self._used <= self.max_bytes:
                break
            if key != keep:
                self._used -= self._sizes.pop(key)
                victims.append(key)
        self.counts["evictions"] += len(victims)
        return victims

    def _forget(self, key: str) -> None:
        with self._lock:
            self._used -= self._sizes.pop(key, 0)

    def contains(self, key: str) -> bool:
        """Whether a file of ``key`` is there (not read)."""
        return HEX_KEY.fullmatch(key) is not None and self.path_for(key).is_file()

    def delete(self, key: str) -> bool:
        """Remove the file of ``key``; True when there was one."""
        self._forget(key)
        try:
            self.path_for(key).unlink()
        except (FileNotFoundError, ValueError):
            return False
        return True

    def keys(self) -> Iterator[str]:
        """The keys this process knows to be cached."""
        with self._lock:
            return iter(list(self._sizes))

    def tier_info(self) -> dict[str, Any]:
        """Files, bytes and the budget, with this process's writes, corrupt files and evictions."""
        with self._lock:
            return {**self.counts, "files": len(self._sizes), "bytes_held": self._used, "max_bytes": self.max_bytes,
                    "directory": str(self.directory)}
