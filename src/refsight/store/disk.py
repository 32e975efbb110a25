"""The embedded, durable package store: an SQLite index beside one safetensors file per package.

Layout under ``root``::

    refsight.db                              index (and the catalog's tables)
    packages/ab/cd/<key>.safetensors         tensors + the package header as metadata, in the store's
                                             codec's stored form (compressed, or the plain file: store/_codec.py)

The index row is the truth: a file without a row (a writer killed between its
rename and its insert) is invisible to readers and removed by :meth:`gc`. Each row
keeps the file's size (the stored bytes: what the quota counts), its size before compression, its
xxh3-128 checksum, the tensor spec and the fingerprint;
:meth:`get` checks all of them and raises :class:`CorruptPackageError` rather than
serve a package that does not match. Several processes may read and write one
store at once (SQLite WAL + ``BEGIN IMMEDIATE`` around every publish).
"""

from __future__ import annotations

import functools
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, TypeVar

import xxhash

from ..errors import CorruptPackageError, InvalidInputError
from ..package import EncoderFingerprint, VisualPackage, canonical_json, package_key, tensor_spec
from . import _codec, _safetensors
from ._files import HEX_KEY, SAFETENSORS_SUFFIX, TEMP_PREFIX, staged
from .base import FingerprintUsage, PackageIndex, PackageStore, PackageUsage
from .sqlite import SqliteDatabase, open_database

if TYPE_CHECKING:  # pragma: no cover
    from .postgres import PgDatabase

__all__ = ["DiskPackageStore", "PackageRecord", "StoredPackage"]

_HEADER_FIELD = "refsight.header"
_KEY_PAGE = 1000
#: What the lifecycle reads of a package (:class:`~refsight.store.base.PackageUsage`).
_USAGE = "SELECT key, bytes, last_used, fingerprint_digest, scope FROM packages"
_Read = TypeVar("_Read")
_COLUMNS = (
    "key, image_sha256, fingerprint_digest, fingerprint_json, bytes, spec_json, created_at, encode_ms, checksum, scope, "
    "raw_bytes"
)


@dataclass(frozen=True)
class PackageRecord:
    """One index row: what the store knows about a package without reading its file."""

    key: str
    image_sha256: str
    fingerprint_digest: str
    fingerprint_json: str
    bytes: int
    spec_json: str
    created_at: float
    encode_ms: float
    checksum: str
    scope: str | None = None  # the isolation scope salting the key (None: shared)
    raw_bytes: int = 0  # the file's bytes before the codec compressed them (``bytes`` when stored raw)

    @property
    def fingerprint(self) -> EncoderFingerprint:
        """The fingerprint the package was encoded under."""
        return EncoderFingerprint.from_json(self.fingerprint_json)

    @property
    def spec(self) -> dict[str, Any]:
        """Name -> dtype and shape of every tensor."""
        return json.loads(self.spec_json)


@dataclass(frozen=True)
class StoredPackage:
    """A package on disk that passed every check of a read, its tensors left unbuilt (:meth:`DiskPackageStore.check`)."""

    record: PackageRecord
    #: Bytes of its tensors (what ``VisualPackage.nbytes`` would say).
    nbytes: int

    @property
    def key(self) -> str:
        """The package key."""
        return self.record.key


def _check_key(key: object) -> str:
    # Keys become file paths: only 64 lowercase hex characters may pass.
    if not isinstance(key, str) or not HEX_KEY.fullmatch(key):
        raise InvalidInputError(key, "a package key is 64 lowercase hex characters (a sha256)")
    return key


@functools.lru_cache(maxsize=256)
def _fingerprint(fingerprint_json: str) -> tuple[EncoderFingerprint, str, dict[str, Any]]:
    # A store holds few fingerprints: parse and hash each once, not on every get().
    fingerprint = EncoderFingerprint.from_json(fingerprint_json)
    return fingerprint, fingerprint.digest, fingerprint.to_dict()


@functools.lru_cache(maxsize=4096)
def _key(image_sha256: str, fingerprint_json: str, scope: str | None) -> str:
    # package_key is pure; memoised because re-serialising the fingerprint costs ~20 µs.
    return package_key(image_sha256, _fingerprint(fingerprint_json)[0], scope)


def _row(package: VisualPackage, size: int, checksum: str, raw_bytes: int) -> tuple:
    # The index row of a package whose file holds ``size`` bytes with this checksum (``_COLUMNS``, last_used).
    fingerprint = package.fingerprint
    return (
        package.key, package.image_sha256, fingerprint.digest, fingerprint.to_json(), size,
        canonical_json(package.spec), float(package.created_at), float(package.encode_ms), checksum, package.scope,
        raw_bytes, time.time(),
    )


class DiskPackageStore(PackageStore, PackageIndex):
    """Packages as safetensors files under ``root/packages``, indexed in ``root/refsight.db``."""

    name = "disk"  # with a PostgreSQL catalog: the shared blob directory

    def __init__(self, root: str | Path, *, database: SqliteDatabase | PgDatabase | None = None) -> None:
        self.root = Path(root)
        self._owns_db = database is None
        self._db = open_database(self.root, database)
        self.packages_dir = self.root / "packages"

    # -- paths ------------------------------------------------------------------
    def path_for(self, key: str) -> Path:
        """Where the file of ``key`` lives (two levels of 256 shards keep directories small)."""
        _check_key(key)
        return self.packages_dir / key[:2] / key[2:4] / f"{key}{SAFETENSORS_SUFFIX}"

    # -- index ------------------------------------------------------------------
    def record(self, key: str) -> PackageRecord | None:
        """The index row of ``key``, or None."""
        _check_key(key)
        row = self._db.connection().execute(f"SELECT {_COLUMNS} FROM packages WHERE key = ?", (key,)).fetchone()
        return PackageRecord(*row) if row else None

    def contains(self, key: str) -> bool:
        """Whether the index has a row for ``key`` (the file is not read)."""
        _check_key(key)
        return self._db.connection().execute("SELECT 1 FROM packages WHERE key = ?", (key,)).fetchone() is not None

    def keys(self) -> Iterator[str]:
        """Every indexed key, in key order, a page at a time (a million rows never sit in memory at once)."""
        last = ""
        while rows := self._db.connection().execute(
            "SELECT key FROM packages WHERE key > ? ORDER BY key LIMIT ?", (last, _KEY_PAGE)
        ).fetchall():
            yield from (row[0] for row in rows)
            last = rows[-1][0]

    def records(self) -> Iterator[PackageRecord]:
        """Every index row, in key order."""
        rows = self._db.connection().execute(f"SELECT {_COLUMNS} FROM packages ORDER BY key").fetchall()
        return iter([PackageRecord(*r) for r in rows])

    def stats(self) -> dict[str, int]:
        """``{"packages": count, "bytes": total file bytes, "raw_bytes": the same before compression}``."""
        count, total, raw = self._db.connection().execute(
            "SELECT COUNT(*), COALESCE(SUM(bytes), 0), COALESCE(SUM(raw_bytes), 0) FROM packages"
        ).fetchone()
        return {"packages": int(count), "bytes": int(total), "raw_bytes": int(raw)}

    def __len__(self) -> int:
        return self.stats()["packages"]

    # -- write ------------------------------------------------------------------
    def put(self, package: VisualPackage) -> int:
        """Store ``package`` durably (idempotent); returns the size of its file in bytes (compressed)."""
        key = package.key
        existing = self.record(key)
        if existing is not None:
            return existing.bytes
        try:
            # Tensors first: a non-tensor gets a clearer message than header() would give.
            prepared = _safetensors.prepare(package.tensors)
            header_text = canonical_json(package.header())
            stored = _codec.compress_file(prepared, {_HEADER_FIELD: header_text})
        except (TypeError, ValueError) as exc:
            raise InvalidInputError(f"package {key}", f"cannot be stored: {exc}") from exc
        return self._publish(package, stored)

    def _publish(self, package: VisualPackage, stored: _codec.Compressed) -> int:
        """Make the stored bytes durable and record their row: the blob directory's way (the bucket has its own)."""
        key = package.key
        # 1. Write and fsync a temp file next to the final name, outside any lock: the slow part
        #    runs in parallel across processes (the store's one publish path, see _files.staged).
        with staged(self.path_for(key), stored.chunks, what=f"package {key}", withdraw=lambda: self.unlink_if_unindexed(key)) as file:
            # 2. Under the database write lock: another process may have published the same key
            #    meanwhile. Its file and row must stay paired (our file differs in created_at, so
            #    replacing it would break its checksum): keep theirs.
            with self._db.write() as conn:
                won = conn.execute("SELECT bytes FROM packages WHERE key = ?", (key,)).fetchone()
                if won is not None:
                    return int(won[0])
                # 3. Rename, then fsync the directory, *then* insert the row: a row must never
                #    point at a name that a crash could still lose. A crash between the rename and
                #    the commit leaves an orphan file, invisible to readers (they go through the
                #    index) and removed by gc().
                file.publish()
                self._insert(conn, package, file.size, file.checksum, stored.raw_bytes)
        return file.size

    @staticmethod
    def _insert(conn, package: VisualPackage, size: int, checksum: str, raw_bytes: int) -> None:
        """Inside the caller's write: the row of ``package``, whose stored bytes (``size``, ``checksum``; ``raw_bytes``
        before compression) are durable."""
        conn.execute(f"INSERT INTO packages ({_COLUMNS}, last_used) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                     _row(package, size, checksum, raw_bytes))

    def delete(self, key: str) -> bool:
        """Remove the row (and the remembered-image rows naming it), then the file; True when a row was removed."""
        _check_key(key)
        # Drop the row first: from that moment no reader can reach the file.
        with self._db.write() as conn:
            removed = conn.execute("DELETE FROM packages WHERE key = ?", (key,)).rowcount > 0
            # No remembered image outlives its package (store/remembered.py).
            conn.execute("DELETE FROM remembered_packages WHERE package_key = ?", (key,))
        if removed:
            self.unlink_if_unindexed(key)
        return removed

    def unlink_if_unindexed(self, key: str) -> bool:
        """Remove the file of ``key`` if no row names it (checked under the write lock); True when removed."""
        # A concurrent put of the same key may have published a new file and row since the
        # caller's DELETE, and that file must stay. Puts publish under the same lock, so the
        # check and the unlink are one step.
        path = self.path_for(key)
        with self._db.write() as conn:
            if conn.execute("SELECT 1 FROM packages WHERE key = ?", (key,)).fetchone():
                return False
            try:
                path.unlink()
            except FileNotFoundError:
                return False
        return True

    # -- read -------------------------------------------------------------------
    def get(self, key: str) -> VisualPackage | None:
        """Load and check the package; None when not indexed; CorruptPackageError on any mismatch."""
        return self._read(key, self._load)

    def check(self, key: str) -> StoredPackage | None:
        """:meth:`get`'s checks (size, checksum, header, spec) without building a tensor (no torch import).

        None when not indexed; CorruptPackageError on any mismatch. What a caller that only links or
        counts a stored package (a cached ``add``) reads instead of the tensors.
        """
        return self._read(key, self._checked)

    def _read(self, key: str, load: Callable[[PackageRecord], _Read]) -> _Read | None:
        record = self.record(key)
        if record is None:
            return None
        try:
            return load(record)
        except CorruptPackageError:
            # A concurrent delete (and maybe a new put) may have changed the file between
            # our row read and our file read: judge against the current row, once.
            current = self.record(key)
            if current is None:
                return None
            if current == record:
                raise
            return load(current)

    def _bytes(self, record: PackageRecord) -> memoryview:
        """The file's bytes, checked against the row's size and checksum, then decompressed (once) and checked again."""
        key = record.key
        buf = self._read_blob(record)
        # The checksum covers every byte (header and tensors): check it before parsing anything.
        digest = xxhash.xxh3_128_hexdigest(buf)
        if digest != record.checksum:
            raise CorruptPackageError(key, f"checksum mismatch (file {digest}, index {record.checksum})")
        try:
            # Bounded by the row: a file that claims another raw size is refused before anything is allocated.
            return _codec.decompress(buf, expected=record.raw_bytes)
        except _codec.CodecError as exc:
            raise CorruptPackageError(key, f"unreadable file: {exc}") from None

    def _read_blob(self, record: PackageRecord) -> memoryview:
        """The bytes of the row's file, of the row's size (mapped, not copied); CorruptPackageError when they are not."""
        key = record.key
        path = self.path_for(key)
        try:
            return _safetensors.read_buffer(path, record.bytes)
        except FileNotFoundError:
            raise CorruptPackageError(key, f"file {path} is missing") from None
        except ValueError as exc:
            raise CorruptPackageError(key, f"size mismatch: {exc}") from None
        except OSError as exc:
            raise CorruptPackageError(key, f"cannot read {path}: {exc}") from None

    def _checked(self, record: PackageRecord) -> StoredPackage:
        buf = self._bytes(record)
        try:
            layout = _safetensors.describe(buf)
        except _safetensors.SafetensorsFormatError as exc:
            raise CorruptPackageError(record.key, f"unreadable file: {exc}") from None
        self._check_header(record, layout.metadata, layout.spec)
        return StoredPackage(record, layout.nbytes)

    def _load(self, record: PackageRecord) -> VisualPackage:
        buf = self._bytes(record)
        try:
            tensors, meta = _safetensors.decode(buf)
        except _safetensors.SafetensorsFormatError as exc:
            raise CorruptPackageError(record.key, f"unreadable file: {exc}") from None
        header, fingerprint = self._check_header(record, meta, tensor_spec(tensors))
        return VisualPackage(
            tensors=tensors,
            metadata=header.get("metadata", {}),
            image_sha256=record.image_sha256,
            fingerprint=fingerprint,
            created_at=float(header.get("created_at", record.created_at)),
            encode_ms=float(header.get("encode_ms", record.encode_ms)),
            scope=record.scope,
        )

    def _check_header(
        self, record: PackageRecord, meta: Mapping[str, str], spec: dict[str, Any]
    ) -> tuple[dict[str, Any], EncoderFingerprint]:
        """The file's header and the fingerprint, once both agree with the row: key, image, scope, spec."""
        key = record.key
        try:
            header = json.loads(meta[_HEADER_FIELD])
            image_sha256 = header["image_sha256"]
            # Parsed and hashed once per fingerprint (cached): get() stays close to a raw read.
            fingerprint, fingerprint_digest, fingerprint_dict = _fingerprint(record.fingerprint_json)
        except (KeyError, TypeError, ValueError) as exc:
            raise CorruptPackageError(key, f"unreadable file: {exc}") from None
        if header.get("fingerprint") != fingerprint_dict or fingerprint_digest != record.fingerprint_digest:
            raise CorruptPackageError(key, "fingerprint differs from the index")
        scope = header.get("scope")
        if scope != record.scope:
            raise CorruptPackageError(key, "the file's isolation scope differs from the index")
        if image_sha256 != record.image_sha256 or _key(image_sha256, record.fingerprint_json, scope) != key:
            raise CorruptPackageError(key, "the file holds another package (image hash or fingerprint differ)")
        if spec != json.loads(record.spec_json) or spec != header.get("spec"):
            raise CorruptPackageError(key, f"tensor names, dtypes or shapes differ from the index: {spec}")
        return header, fingerprint

    def verify(self, key: str) -> str | None:
        """None when the package of ``key`` passes every check, else the problem in words."""
        record = self.record(key)
        if record is None:
            return "not in the index"
        try:
            self._load(record)
        except CorruptPackageError as exc:
            return exc.reason
        return None

    def verify_all(self) -> Iterator[tuple[str, str | None]]:
        """``(key, problem or None)`` for every indexed package (what ``refsight verify`` reports)."""
        for key in self.keys():
            problem = self.verify(key)
            if problem != "not in the index":  # deleted while we walked: not a problem
                yield key, problem

    # -- lifecycle (PackageIndex) ----------------------------------------------------
    def total_bytes(self, *, scope: str | None = None) -> int:
        """Bytes of every indexed package file (``scope``: of the packages salted by that scope)."""
        if scope is None:
            return self.stats()["bytes"]
        row = self._db.connection().execute("SELECT SUM(bytes) FROM packages WHERE scope = ?", (scope,)).fetchone()
        return int(row[0] or 0)

    def least_recently_used(
        self, limit: int, *, after: tuple[float, str] | None = None, scope: str | None = None
    ) -> list[PackageUsage]:
        """Up to ``limit`` packages (``scope``: salted by it), least recently used first, after ``(last_used, key)``."""
        conditions = {"(last_used, key) > (?, ?)": after, "scope = ?": None if scope is None else (scope,)}
        given = {sql: params for sql, params in conditions.items() if params is not None}  # ties go by key
        where = f" WHERE {' AND '.join(given)}" if given else ""
        rows = self._db.connection().execute(f"{_USAGE}{where} ORDER BY last_used, key LIMIT ?",
                                             (*(p for params in given.values() for p in params), int(limit)))
        return [PackageUsage(*row) for row in rows.fetchall()]

    def touch(self, uses: Mapping[str, float]) -> None:
        """Move each key's ``last_used`` forward to the given time (never back); one transaction."""
        if not uses:
            return
        with self._db.write() as conn:
            conn.executemany(
                "UPDATE packages SET last_used = ? WHERE key = ? AND last_used < ?",
                [(float(t), key, float(t)) for key, t in uses.items()],
            )

    def fingerprint_usage(self) -> list[FingerprintUsage]:
        """Packages and bytes per fingerprint, largest first."""
        rows = self._db.connection().execute(
            "SELECT fingerprint_digest, MIN(fingerprint_json), COUNT(*), SUM(bytes) FROM packages "
            "GROUP BY fingerprint_digest ORDER BY SUM(bytes) DESC, fingerprint_digest"
        ).fetchall()
        out = []
        for digest, fingerprint_json, count, total in rows:
            fingerprint = _fingerprint(fingerprint_json)[0]
            out.append(FingerprintUsage(digest, fingerprint.backend, fingerprint.model_id, int(count), int(total)))
        return out

    def packages_of(self, fingerprint_digest: str) -> list[PackageUsage]:
        """Every package made under ``fingerprint_digest``, least recently used first."""
        rows = self._db.connection().execute(f"{_USAGE} WHERE fingerprint_digest = ? ORDER BY last_used, key",
                                             (fingerprint_digest,))
        return [PackageUsage(*row) for row in rows.fetchall()]

    # -- maintenance --------------------------------------------------------------
    def gc(self, *, temp_age_s: float = 3600.0) -> dict[str, int]:
        """Remove orphan package files (no index row) and temp files older than ``temp_age_s``.

        Temp files younger than that may belong to a live writer, so they stay.
        Returns ``{"orphans": n, "temps": n}``.
        """
        removed = {"orphans": 0, "temps": 0}
        if not self.packages_dir.is_dir():
            return removed
        now = time.time()
        # A snapshot of the index narrows the candidates; each candidate is then checked
        # again under the write lock, so a package published meanwhile is never removed.
        indexed = set(self.keys())
        for path in sorted(self.packages_dir.glob("*/*/*")):
            name = path.name
            if name.startswith(TEMP_PREFIX):
                try:
                    if now - path.stat().st_mtime >= temp_age_s:
                        path.unlink()
                        removed["temps"] += 1
                except FileNotFoundError:
                    pass  # its writer renamed or removed it meanwhile
            elif name.endswith(SAFETENSORS_SUFFIX) and HEX_KEY.fullmatch(name[: -len(SAFETENSORS_SUFFIX)]):
                key = name[: -len(SAFETENSORS_SUFFIX)]
                if key not in indexed and self.unlink_if_unindexed(key):
                    removed["orphans"] += 1
        return removed

    def close(self) -> None:
        """Close the database connections this store opened. Idempotent."""
        if self._owns_db:
            self._db.close()
