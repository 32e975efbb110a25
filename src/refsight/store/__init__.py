"""Storage: packages by key (memory LRU → local disk) and the catalog of references.

:func:`open_store` is the one entry point most code needs::

    with open_store("~/.cache/refsight") as store:
        store.packages.put(package)          # disk first, then memory
        store.packages.get(package.key)      # memory hit, else disk (checked), promoted
        store.catalog.add_reference("cat-1", package.image_sha256, {"label": "tabby"})

Nothing here imports torch until a package is actually read or written.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from ..errors import StoreError
from ._failures import store_failure, unavailable_reason
from ._sqlite import SCHEMA_VERSION, Database
from .base import (
    COUNTER_NAMES,
    DEFAULT_NAMESPACE,
    PREFIX_COUNTER_NAMES,
    Catalog,
    PackageStore,
    Reference,
    ReferenceChanges,
    ReferenceRow,
    validate_ref_id,
)
from .catalog import SqliteCatalog
from .counters import CounterBuffer
from .gc import DEFAULT_GRACE_S, collect_garbage, sweep_stale_temps
from .local import LocalPackageStore, PackageRecord
from .memory import MemoryPackageStore
from .prefixes import DEFAULT_PREFIX_DISK_BYTES, DEFAULT_PREFIX_MEMORY_BYTES, PrefixStore
from .tiered import TieredPackageStore

__all__ = [
    "open_store",
    "Store",
    "PackageStore",
    "Catalog",
    "Reference",
    "ReferenceRow",
    "ReferenceChanges",
    "validate_ref_id",
    "LocalPackageStore",
    "PackageRecord",
    "MemoryPackageStore",
    "TieredPackageStore",
    "SqliteCatalog",
    "CounterBuffer",
    "DEFAULT_NAMESPACE",
    "COUNTER_NAMES",
    "PREFIX_COUNTER_NAMES",
    "PrefixStore",
    "SCHEMA_VERSION",
    "DEFAULT_MEMORY_BYTES",
]

DEFAULT_MEMORY_BYTES = 512 * 1024 * 1024


class Store:
    """An opened store directory: ``packages`` (tiered), ``local``, ``memory``, ``catalog``, ``counters``
    and ``prefixes`` (the language model's reference-prefix states: memory LRU, then ``prefixes/`` on disk).

    Use as a context manager, or call :meth:`close`. Safe to open the same
    directory from several processes at once. ``counters`` buffers the cache
    counters in memory (reads never write; see :mod:`refsight.store.counters`).
    """

    def __init__(
        self, root: Path, database: Database, memory_bytes: int, *,
        prefix_memory_bytes: int = DEFAULT_PREFIX_MEMORY_BYTES, prefix_disk_bytes: int = DEFAULT_PREFIX_DISK_BYTES,
    ) -> None:
        self.root = root
        self._db = database
        self.local = LocalPackageStore(root, database=database)
        self.catalog = SqliteCatalog(root, database=database)
        self.counters = CounterBuffer(self.catalog)
        self.memory = MemoryPackageStore(memory_bytes, on_evict=lambda key, package: self.counters.add(evictions=1))
        self.packages = TieredPackageStore([self.memory, self.local])
        self.prefixes = PrefixStore(
            root, memory_bytes=prefix_memory_bytes, disk_bytes=prefix_disk_bytes,
            on_corrupt=lambda key, reason: self.counters.add(prefix_corrupt=1),
        )

    def gc(self, *, grace_s: float = DEFAULT_GRACE_S) -> dict[str, int]:
        """Remove what interrupted writes left behind (see :mod:`refsight.store.gc`); returns counts.

        Temp files, package and image files without an index row, package rows no
        reference links to and image rows no reference uses; rows and temp files
        younger than ``grace_s`` seconds are left to the writes that may still own them.
        """
        return collect_garbage(self, grace_s=grace_s)

    def close(self) -> None:
        """Write pending counters, drop the memory tier and close the database connections. Idempotent."""
        if self._db.closed:
            return
        self.counters.close()
        self.memory.clear()
        self.prefixes.clear_memory()
        self._db.close()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Store({str(self.root)!r})"


def open_store(root: str | os.PathLike, *, memory_bytes: int = DEFAULT_MEMORY_BYTES) -> Store:
    """Open (creating if needed) the store in directory ``root``.

    Raises :class:`StoreError` when the directory cannot be created or written, or
    when ``root`` holds a database that is not a refsight store (or a newer one).
    """
    path = Path(os.path.expanduser(os.fspath(root)))
    try:
        return _open(path, memory_bytes)
    except OSError as exc:
        # ENAMETOOLONG, ELOOP, EACCES on a parent ...: a StoreError naming the path, not a traceback.
        raise store_failure(exc, path, f"cannot open store directory {path}") from exc


def _open(path: Path, memory_bytes: int) -> Store:
    if path.exists() and not path.is_dir():
        raise StoreError(f"store path {path} exists and is not a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise store_failure(exc, path, f"cannot create store directory {path}") from exc
    # Probe writability now, so the failure names the directory instead of surfacing
    # later as an obscure SQLite or rename error halfway through a write.
    try:
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        if unavailable_reason(exc, path) is None:
            raise StoreError(f"store directory {path} is not writable: {exc.strerror or exc}") from exc
        raise store_failure(exc, path, f"store directory {path} is not writable") from exc
    database = Database(path)
    # Temp files of writers killed long ago (an hour or more); cheap, at most hourly.
    sweep_stale_temps(path)
    return Store(path, database, memory_bytes)
