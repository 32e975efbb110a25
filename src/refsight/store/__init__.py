"""Storage: packages by key (memory LRU → local disk) and the catalog of references.

:func:`open_store` is the one entry point most code needs::

    with open_store("~/.cache/refsight") as store:
        store.packages.put(package)          # disk first, then memory
        store.packages.get(package.key)      # memory hit, else disk (checked), promoted
        store.catalog.add_reference("cat-1", package.image_sha256, {"label": "tabby"})

Nothing here imports torch until a package is actually read or written.

With ``catalog="postgresql://..."`` the catalog and the package index live in PostgreSQL
(:mod:`refsight.store.postgres`) and ``root`` is a shared blob directory (packages and kept
images, content-addressed, no database in it) that several replicas open at once; each
replica keeps its derived data (retrieval index, attribute records) in its own
``local_dir``. With ``root="s3://BUCKET/PREFIX"`` (and a PostgreSQL catalog) the bucket is that
blob directory (:mod:`refsight.store.bucket`), and ``local_dir`` also holds the replica's own
bounded disk cache in front of it (:mod:`refsight.store.local_cache`).
"""

from __future__ import annotations

import os
import tempfile
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

from ..errors import StoreConfigError, StoreError, StoreUnavailableError
from ..support.extras import install_command
from ..vllm_connector.refsight_objects import BucketConfigError, BucketUnavailable, ObjectStore, is_bucket_url
from ..results import PruneReport, QuotaReport
from ._failures import store_failure, unavailable_reason
from .base import (
    COUNTER_NAMES,
    DEFAULT_NAMESPACE,
    PREFIX_COUNTER_NAMES,
    Catalog,
    FingerprintUsage,
    PackageIndex,
    PackageStore,
    PackageUsage,
    Reference,
    ReferenceChanges,
    ReferenceRow,
)
from .catalog import SqlCatalog
from .counters import CounterBuffer
from .disk import DiskPackageStore, PackageRecord
from .local_cache import DEFAULT_LOCAL_CACHE_BYTES, LocalPackageCache
from .encoder_outputs import EncoderOutputs
from .gc import DEFAULT_GRACE_S, collect_garbage, sweep_stale_temps
from .lifecycle import enforce_quota, parse_bytes, prune
from .memory import MemoryPackageStore
from .postgres import PgDatabase, is_catalog_url, redact_url
from .prefixes import DEFAULT_PREFIX_DISK_BYTES, DEFAULT_PREFIX_MEMORY_BYTES, PrefixStore
from .remembered import RememberedImage, RememberedImages
from .schema import DB_NAME, SCHEMA_VERSION
from .sqlite import SqliteDatabase
from .tiered import TieredPackageStore
from .usage import PinnedKeys, UsageBuffer

__all__ = [
    "open_store", "is_bucket_url", "Store", "DiskPackageStore", "PackageRecord", "MemoryPackageStore",
    "TieredPackageStore", "SqlCatalog", "CounterBuffer", "PinnedKeys", "UsageBuffer", "parse_bytes", "PrefixStore",
    "RememberedImage", "RememberedImages",
    "SCHEMA_VERSION", "DEFAULT_MEMORY_BYTES",
    # the interfaces and records of store/base.py
    "PackageStore", "PackageIndex", "PackageUsage", "FingerprintUsage", "Catalog", "Reference", "ReferenceRow",
    "ReferenceChanges", "DEFAULT_NAMESPACE", "COUNTER_NAMES", "PREFIX_COUNTER_NAMES",
]

DEFAULT_MEMORY_BYTES = 512 * 1024 * 1024


class Store:
    """An opened store directory: ``packages`` (tiered), ``local``, ``memory``, ``catalog``, ``counters``
    and ``prefixes`` (the language model's reference-prefix states: memory LRU, then ``prefixes/`` on disk);
    ``remembered`` says which namespaces' inline images the store keeps (:mod:`refsight.store.remembered`).

    Use as a context manager, or call :meth:`close`. Safe to open the same
    directory from several processes at once. ``counters`` buffers the cache
    counters in memory (reads never write; see :mod:`refsight.store.counters`), and
    ``usage`` the packages' last-use times the same way. ``redis`` is the optional
    Redis tier (tier order: memory → Redis → disk); ``max_package_bytes`` the byte
    quota on packages (see :mod:`refsight.store.lifecycle`); ``pins`` the keys running
    requests hold. ``derived_root`` is where this process keeps derived data (the retrieval index,
    attribute records): ``root`` itself, or with a PostgreSQL catalog a directory of the
    replica's own; ``catalog_url`` names that catalog (password hidden), else None. ``bucket`` is the
    object store of a bucket store (``location`` its ``s3://`` URL, else the directory): packages and
    kept images live there, ``local`` indexes them, and ``cache`` is this replica's disk tier in front.
    """

    def __init__(
        self, root: Path, database: SqliteDatabase | PgDatabase, memory_bytes: int, *, derived_root: Path | None = None,
        redis: PackageStore | None = None, max_package_bytes: int | None = None,
        prefix_memory_bytes: int = DEFAULT_PREFIX_MEMORY_BYTES, prefix_disk_bytes: int = DEFAULT_PREFIX_DISK_BYTES,
        bucket: ObjectStore | None = None, local_cache_bytes: int = DEFAULT_LOCAL_CACHE_BYTES,
    ) -> None:
        self.root = root
        self.derived_root = derived_root or root
        self._db = database
        self.catalog_url = database.safe_url if isinstance(database, PgDatabase) else None
        self.bucket = bucket
        self.location = bucket.url if bucket is not None else str(root)
        self.cache: LocalPackageCache | None = None
        if bucket is not None:
            from .bucket import BucketImages, BucketPackageStore

            self.local: DiskPackageStore = BucketPackageStore(bucket, root, database=database)
            self.catalog = SqlCatalog(root, database=database, images=BucketImages(bucket, root, database))
            self.cache = LocalPackageCache(self.derived_root, local_cache_bytes)
        else:
            self.local = DiskPackageStore(root, database=database)
            self.catalog = SqlCatalog(root, database=database)
        self.remembered = RememberedImages(database)
        self.usage = UsageBuffer(self.local)
        self.pins = PinnedKeys()
        self.counters = CounterBuffer(self.catalog, also=(self.usage.flush,))
        self.memory = MemoryPackageStore(memory_bytes, on_evict=lambda key, package: self.counters.add(evictions=1))
        self.redis = redis
        faster = [tier for tier in (self.memory, redis, self.cache) if tier is not None]
        self.packages = TieredPackageStore([*faster, self.local])
        self.max_package_bytes = None if max_package_bytes is None else parse_bytes(max_package_bytes)
        #: The scopes (a server's tenants) splitting the quota into equal shares (:mod:`.lifecycle`); none: one LRU.
        self.quota_shares: frozenset[str] = frozenset()
        self._encoder_outputs: EncoderOutputs | None = None  # found on first need: a connector may start later
        # Prefix states are derived data of one replica's language model: kept beside its retrieval index,
        # and shared through the bucket of a bucket store.
        self.prefixes = PrefixStore(
            self.derived_root, memory_bytes=prefix_memory_bytes, disk_bytes=prefix_disk_bytes,
            on_corrupt=lambda key, reason: self.counters.add(prefix_corrupt=1), shared=bucket,
        )

    def encoder_outputs(self) -> EncoderOutputs | None:
        """vLLM's encoder outputs kept in this store by refsight's connector (None until a connector used it)."""
        if self._encoder_outputs is None:
            self._encoder_outputs = EncoderOutputs.of(self.root)
        return self._encoder_outputs

    def enforce_quota(self, *, protect: tuple[str, ...] = (), scope: str | None = None) -> QuotaReport | None:
        """Evict least recently used packages and vLLM encoder outputs down to ``max_package_bytes``
        (None: no quota, or under it); ``scope``: the scope of the packages just written (a tenant's is held to
        its share of :attr:`quota_shares` first)."""
        if self.max_package_bytes is None:
            return None
        return enforce_quota(self, self.max_package_bytes, protect=protect, scope=scope)

    def prune(self, fingerprint_digests: list[str], *, dry_run: bool = False) -> PruneReport:
        """Remove the packages of these fingerprints and their links (see :mod:`refsight.store.lifecycle`)."""
        return prune(self, fingerprint_digests, dry_run=dry_run)

    def gc(self, *, grace_s: float = DEFAULT_GRACE_S) -> dict[str, int]:
        """Remove what interrupted writes left behind (see :mod:`refsight.store.gc`); returns counts.

        Temp files, package and image files without an index row, package rows no
        reference links to and image rows no reference uses; rows and temp files
        younger than ``grace_s`` seconds are left to the writes that may still own them. A grace
        below 0 or not finite raises :class:`~refsight.errors.InvalidInputError` (``grace``).
        """
        return collect_garbage(self, grace_s=grace_s)

    def lease(self, key: str) -> AbstractContextManager[bool]:
        """Hold package ``key``'s encode lease across replicas (PostgreSQL catalog), else nothing to hold.

        Within one process, :data:`refsight.cache.packages.PACKAGE_LOCKS` already makes an encode happen once.
        """
        if isinstance(self._db, PgDatabase):
            return self._db.lease(key)
        return nullcontext(True)

    def close(self) -> None:
        """Write pending counters, drop the memory tier and close the database connections. Idempotent."""
        if self._db.closed:
            return
        try:
            self.counters.close()
        except StoreError:
            pass  # the catalog is unreachable (a PostgreSQL outage): counts are statistics, closing must not fail
        self.memory.clear()
        if self.redis is not None:
            self.redis.close()
        self.prefixes.clear_memory()
        if self.bucket is not None:
            self.bucket.close()
        self._db.close()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Store({self.location!r})"


def open_store(
    root: str | os.PathLike,
    *,
    memory_bytes: int = DEFAULT_MEMORY_BYTES,
    catalog: str | None = None,
    local_dir: str | os.PathLike | None = None,
    redis: str | None = None,
    max_package_bytes: int | str | None = None,
    local_cache_bytes: int | str | None = None,
) -> Store:
    """Open (creating if needed) the store in directory ``root``, or in the bucket ``s3://BUCKET/PREFIX``.

    ``catalog`` (``postgresql://user@host/db``) puts the catalog and package index in
    PostgreSQL, shared by every replica that opens the same ``root`` with it; ``local_dir``
    is then this replica's directory for derived data (default: one per catalog and root
    under the user cache dir). ``redis`` is a Redis URL (``redis://HOST:PORT/DB``) for the
    tier between memory and disk; ``max_package_bytes`` a byte quota on packages (an int or
    ``"20GiB"``). A bucket store needs ``catalog``; its objects are reached as every S3 tool reaches
    them (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, profiles ...), and ``local_cache_bytes`` bounds
    the replica's disk cache in ``local_dir``; refused credentials or a missing bucket raise
    :class:`~refsight.errors.StoreConfigError`, an unreachable object store
    :class:`StoreUnavailableError`. Raises :class:`StoreError` when the directory cannot be created or written,
    when ``root`` holds a database that is not a refsight store (or a newer one), and
    :class:`StoreUnavailableError` when PostgreSQL cannot be reached;
    :class:`~refsight.errors.InvalidInputError` for a bad Redis URL or quota.
    """
    if catalog is not None and not is_catalog_url(catalog):
        raise StoreError(f"--catalog takes a postgresql:// URL (got {redact_url(str(catalog))!r})")
    quota = None if max_package_bytes is None else parse_bytes(max_package_bytes)  # bad values fail before any file
    cache_bytes = DEFAULT_LOCAL_CACHE_BYTES if local_cache_bytes is None else parse_bytes(
        local_cache_bytes, name="local_cache_bytes")
    if is_bucket_url(root):
        return _open_bucket(str(root), catalog, local_dir, memory_bytes, redis, quota, cache_bytes)
    path = Path(os.path.expanduser(os.fspath(root)))
    tier = _redis_tier(redis)
    try:
        return _open(path, memory_bytes, catalog, local_dir, redis=tier, quota=quota)
    except OSError as exc:
        # ENAMETOOLONG, ELOOP, EACCES on a parent ...: a StoreError naming the path, not a traceback.
        if tier is not None:
            tier.close()
        raise store_failure(exc, path, f"cannot open store directory {path}") from exc
    except BaseException:
        if tier is not None:
            tier.close()
        raise


def _redis_tier(redis: str | None) -> PackageStore | None:
    if redis is None:
        return None
    from .redis_tier import RedisPackageStore

    return RedisPackageStore(redis)


def _open_bucket(
    url: str, catalog: str | None, local_dir, memory_bytes: int, redis: str | None, quota: int | None, cache_bytes: int,
) -> Store:
    """A bucket store: the catalog in PostgreSQL, the bytes in the bucket, a disk cache in ``local_dir``."""
    if catalog is None:
        raise StoreConfigError(f"--store {url} needs --catalog postgresql://... (the bucket holds the bytes, the "
                               "catalog their index and the references)")
    try:
        import boto3  # noqa: F401 - the client of every object store
    except ImportError as exc:
        raise StoreConfigError(f"a bucket store needs boto3: {install_command('s3')} ({exc})") from None
    from ..support.environment import default_replica_dir

    try:
        objects = ObjectStore(url)
    except BucketConfigError as exc:
        raise StoreConfigError(f"--store: {exc}") from None
    opened: list = [objects]
    try:
        objects.check()  # refused credentials, no such bucket: one line, at start, never a 500 later
        derived = Path(os.path.expanduser(os.fspath(local_dir))) if local_dir else default_replica_dir(catalog, url)
        derived.mkdir(parents=True, exist_ok=True)
        tier = _redis_tier(redis)
        opened.append(tier)
        database = PgDatabase(catalog, derived)
        return Store(derived, database, memory_bytes, derived_root=derived, redis=tier, max_package_bytes=quota,
                     bucket=objects, local_cache_bytes=cache_bytes)
    except BucketConfigError as exc:
        _close(opened)
        raise StoreConfigError(f"--store: {exc}") from None
    except BucketUnavailable as exc:
        _close(opened)
        raise StoreUnavailableError(f"--store: {exc}", "object store unreachable") from None
    except OSError as exc:
        _close(opened)
        raise store_failure(exc, Path(str(local_dir)), f"cannot open the local directory {local_dir}") from exc
    except BaseException:
        _close(opened)
        raise


def _close(opened: list) -> None:
    for part in opened:
        if part is not None:
            part.close()


def _open(
    path: Path, memory_bytes: int, catalog: str | None = None, local_dir=None, *, redis: PackageStore | None = None,
    quota: int | None = None,
) -> Store:
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
    if catalog is not None:
        if (path / DB_NAME).exists():
            raise StoreError(f"{path} is an embedded store (it holds {DB_NAME}); a shared blob directory holds none")
        from ..support.environment import default_replica_dir

        derived = Path(os.path.expanduser(os.fspath(local_dir))) if local_dir else default_replica_dir(catalog, path)
        derived.mkdir(parents=True, exist_ok=True)
        database = PgDatabase(catalog, path)
        sweep_stale_temps(path)
        return Store(path, database, memory_bytes, derived_root=derived, redis=redis, max_package_bytes=quota)
    database = SqliteDatabase(path)
    # Temp files of writers killed long ago (an hour or more); cheap, at most hourly.
    sweep_stale_temps(path)
    return Store(path, database, memory_bytes, redis=redis, max_package_bytes=quota)
