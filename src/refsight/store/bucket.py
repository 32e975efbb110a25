"""The bucket as the blob directory: packages and kept images as objects of an S3-compatible bucket.

``open_store("s3://BUCKET/PREFIX", catalog="postgresql://...")`` keeps the catalog and the package
index in PostgreSQL, as for a shared directory, and the bytes in the bucket (the client:
:mod:`refsight.vllm_connector.refsight_objects`). Each object holds exactly the bytes the blob
directory's file would hold, under a content-addressed name that adds the bytes' xxh3-128::

    packages/ab/cd/<key>.<xxh3>.safetensors     images/ab/<sha256>.<xxh3>

The row is the truth, as on disk; the bucket has no rename, so the name carries the checksum instead:

- **Two writers never overwrite each other's bytes**: each uploads under its own checksum, then
  takes the write lock; the first row wins and the loser removes its own object. Before its row
  is inserted, the winner looks (HEAD, under the lock) that its object is still there, so a
  concurrent delete (also under the lock) can never leave a row without its bytes.
- **A reader trusts nothing it downloads**: size, checksum and header (which derives the very key)
  are checked as for a file; an object that is missing, truncated, altered or another's is a
  :class:`~refsight.errors.CorruptPackageError`: dropped and encoded again, never served.
- **A killed writer leaves no object a reader can take for whole**: a PUT is atomic, a multipart
  upload appears only when completed; what it leaves (an object without a row, an incomplete
  upload) is removed by ``gc`` once older than its grace.
- **An outage is a StoreUnavailableError** (503 ``store_unavailable``) after one short timeout,
  then at once while the client backs off; faster tiers keep serving meanwhile.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import xxhash

from ..errors import CorruptPackageError, NotFoundError, StoreError, StoreUnavailableError
from ..package import VisualPackage
from ..vllm_connector.refsight_codec import Compressed
from ..vllm_connector.refsight_objects import BucketUnavailable, ObjectStore
from ._files import HEX_KEY, SAFETENSORS_SUFFIX
from .disk import DiskPackageStore, PackageRecord
from .images import KeptImages, check_sha

__all__ = ["BucketPackageStore", "BucketImages", "unavailable", "package_object", "image_object"]

log = logging.getLogger("refsight.store.bucket")


def unavailable(objects: ObjectStore, exc: BucketUnavailable, doing: str) -> StoreUnavailableError:
    """The store's error for an object store that did not answer (a 503 whose Retry-After is the bucket's back-off)."""
    return StoreUnavailableError(f"object store {objects.url} is unavailable: cannot {doing}", str(exc),
                                 retry_after=exc.retry_after)


def package_object(key: str, checksum: str) -> str:
    """The object name of the package ``key`` whose bytes have this xxh3-128."""
    return f"packages/{key[:2]}/{key[2:4]}/{key}.{checksum}{SAFETENSORS_SUFFIX}"


def image_object(path: str, checksum: str) -> str:
    """The object name of the kept image recorded under ``path`` (``images/ab/<sha256>``) with this xxh3-128."""
    return f"{path}.{checksum}"


def _checksum(chunks: list) -> tuple[str, int]:
    hasher = xxhash.xxh3_128()
    size = 0
    for chunk in chunks:
        view = memoryview(chunk).cast("B")
        hasher.update(view)
        size += len(view)
    return hasher.hexdigest(), size


def _parse_package(name: str) -> tuple[str, str] | None:
    """``(key, checksum)`` of a package object's name, None for anything else."""
    stem = name.rsplit("/", 1)[-1].removesuffix(SAFETENSORS_SUFFIX)
    key, _, checksum = stem.partition(".")
    return (key, checksum) if HEX_KEY.fullmatch(key) and len(checksum) == 32 else None


class BucketPackageStore(DiskPackageStore):
    """Packages as objects of a bucket, indexed in the (PostgreSQL) catalog: the durable tier of a fleet."""

    name = "bucket"

    def __init__(self, objects: ObjectStore, root: Path, *, database) -> None:
        super().__init__(root, database=database)
        self.objects = objects

    def tier_info(self) -> dict:
        """This process's reads, writes, errors and skipped calls on the bucket, and its state."""
        return self.objects.info()

    def _publish(self, package: VisualPackage, stored: Compressed) -> int:
        key = package.key
        chunks = stored.chunks
        checksum, size = _checksum(chunks)
        name = package_object(key, checksum)
        self._upload(name, chunks, f"write package {key}")  # outside any lock: the slow part
        try:
            with self._db.write() as conn:
                won = conn.execute("SELECT bytes, checksum FROM packages WHERE key = ?", (key,)).fetchone()
                if won is None:
                    if not self._exists(name, f"write package {key}"):  # a delete took it meanwhile: once more
                        self._upload(name, chunks, f"write package {key}")
                    self._insert(conn, package, size, checksum, stored.raw_bytes)
                    return size
        except BaseException:
            self.unlink_if_unindexed(key, checksum)
            raise
        if won[1] != checksum:  # another writer's row won: our object is nobody's
            self.unlink_if_unindexed(key, checksum)
        return int(won[0])

    def _upload(self, name: str, chunks: list, doing: str) -> None:
        try:
            self.objects.put(name, chunks)
        except BucketUnavailable as exc:
            raise unavailable(self.objects, exc, doing) from None

    def _exists(self, name: str, doing: str) -> bool:
        try:
            return self.objects.exists(name)
        except BucketUnavailable as exc:
            raise unavailable(self.objects, exc, doing) from None

    def _read_blob(self, record: PackageRecord) -> memoryview:
        name = package_object(record.key, record.checksum)
        try:
            data = self.objects.get(name)
        except BucketUnavailable as exc:
            raise unavailable(self.objects, exc, f"read package {record.key}") from None
        if data is None:
            raise CorruptPackageError(record.key, f"object {name} is missing")
        if len(data) != record.bytes:
            raise CorruptPackageError(record.key, f"size mismatch: object has {len(data)} bytes, the index says {record.bytes}")
        return memoryview(data)

    def unlink_if_unindexed(self, key: str, checksum: str | None = None) -> bool:
        """Remove the objects of ``key`` no row names (``checksum``: that one only, else every one there);
        checked under the write lock. An unreachable bucket leaves them to ``gc``."""
        try:
            names = [package_object(key, checksum)] if checksum else [
                e.name for e in self.objects.listing(f"packages/{key[:2]}/{key[2:4]}/{key}.")]
            with self._db.write() as conn:
                row = conn.execute("SELECT checksum FROM packages WHERE key = ?", (key,)).fetchone()
                doomed = [n for n in names if row is None or n != package_object(key, row[0])]
                for name in doomed:
                    self.objects.delete(name)
        except BucketUnavailable:
            log.info("refsight: object store unavailable: the objects of %s are left to gc", key)
            return False
        return bool(doomed)

    def gc(self, *, temp_age_s: float = 3600.0) -> dict[str, int]:
        """Abort multipart uploads and remove objects without a row, both older than ``temp_age_s``.

        The listing and the index are walked side by side in key order, a page at a time each, so
        neither is ever held whole in memory. Returns ``{"orphans": n, "temps": n}``.
        """
        try:
            temps = self.objects.abort_stale_uploads(temp_age_s)
            cutoff = time.time() - temp_age_s
            orphans = 0
            for key, checksum in self._unindexed_objects(cutoff):
                orphans += self.unlink_if_unindexed(key, checksum)
        except BucketUnavailable as exc:
            raise unavailable(self.objects, exc, "collect garbage") from None
        return {"orphans": orphans, "temps": temps}

    def _unindexed_objects(self, cutoff: float) -> Iterator[tuple[str, str]]:
        rows = self._indexed_checksums()
        row = next(rows, None)
        for entry in self.objects.listing("packages/"):
            parsed = _parse_package(entry.name)
            if parsed is None or entry.modified >= cutoff:
                continue  # not ours, or young: a writer may be about to record it
            while row is not None and row[0] < parsed[0]:
                row = next(rows, None)
            if row is None or row != parsed:
                yield parsed

    def _indexed_checksums(self) -> Iterator[tuple[str, str]]:
        last = ""
        while page := self._db.connection().execute(
            "SELECT key, checksum FROM packages WHERE key > ? ORDER BY key LIMIT 1000", (last,)
        ).fetchall():
            yield from ((str(k), str(c)) for k, c in page)
            last = page[-1][0]


class _Upload:
    """A kept image's object, uploaded and waiting for its row (:meth:`BucketImages.record`)."""

    def __init__(self, path: str, checksum: str, size: int, chunks: list) -> None:
        self.path, self.checksum, self.size, self.chunks = path, checksum, size, chunks
        self.published = False


class BucketImages(KeptImages):
    """Kept images as objects of a bucket (rows in the catalog, as on disk)."""

    def __init__(self, objects: ObjectStore, root: Path, database) -> None:
        super().__init__(root, database)
        self.objects = objects

    def read(self, image_sha256: str) -> bytes:
        """The kept original bytes (size and checksum verified); NotFoundError, StoreError when damaged,
        StoreUnavailableError while the bucket does not answer."""
        check_sha(image_sha256)
        row = self._db.connection().execute(
            "SELECT path, bytes, checksum FROM images WHERE sha256 = ?", (image_sha256,)).fetchone()
        if row is None:
            raise NotFoundError(image_sha256, "image")
        path, size, digest = row
        try:
            data = self.objects.get(image_object(path, digest))
        except BucketUnavailable as exc:
            raise unavailable(self.objects, exc, f"read image {image_sha256}") from None
        if data is None or len(data) != size or xxhash.xxh3_128_hexdigest(data) != digest:
            raise StoreError(f"kept bytes of image {image_sha256} are damaged: the object is missing, truncated or altered")
        return bytes(data)

    def stage(self, image_sha256: str, data: bytes):
        """The bytes uploaded, ready for :meth:`record` (None when the image is kept already)."""
        check_sha(image_sha256)
        if self.has(image_sha256):
            return _nothing()
        return self._uploaded(image_sha256, [bytes(data)])

    @contextmanager
    def _uploaded(self, image_sha256: str, chunks: list) -> Iterator[_Upload]:
        checksum, size = _checksum(chunks)
        upload = _Upload(f"images/{image_sha256[:2]}/{image_sha256}", checksum, size, chunks)
        self._put(upload)
        try:
            yield upload
        finally:
            if not upload.published:  # refused, lost to another writer or failed: our object is nobody's
                self.unlink_if_unindexed(image_sha256, checksum)

    def _put(self, upload: _Upload) -> None:
        try:
            self.objects.put(image_object(upload.path, upload.checksum), upload.chunks)
        except BucketUnavailable as exc:
            raise unavailable(self.objects, exc, f"keep image {upload.path}") from None

    def record(self, conn, image_sha256: str, file: _Upload | None, fmt: str | None) -> None:
        """Inside the caller's write: the row of the uploaded object, unless a row exists already."""
        if file is None or conn.execute("SELECT 1 FROM images WHERE sha256 = ?", (image_sha256,)).fetchone():
            return
        try:
            if not self.objects.exists(image_object(file.path, file.checksum)):  # a delete took it: once more
                self._put(file)
        except BucketUnavailable as exc:
            raise unavailable(self.objects, exc, f"keep image {image_sha256}") from None
        conn.execute("INSERT INTO images (sha256, path, bytes, format, checksum) VALUES (?, ?, ?, ?, ?)",
                     (image_sha256, file.path, file.size, fmt, file.checksum))
        file.published = True

    def put(self, image_sha256: str, data: bytes, fmt: str | None) -> None:
        """Keep the original bytes under the image's pixel hash (the first bytes kept win)."""
        with self.stage(image_sha256, data) as file:
            if file is not None:
                with self._db.write() as conn:
                    self.record(conn, image_sha256, file, fmt)

    def unlink_if_unindexed(self, image_sha256: str, checksum: str | None = None) -> None:
        """Remove the objects of an image no row names (``checksum``: that one only), under the write lock."""
        path = f"images/{image_sha256[:2]}/{image_sha256}"
        try:
            names = [image_object(path, checksum)] if checksum else [e.name for e in self.objects.listing(f"{path}.")]
            with self._db.write() as conn:
                row = conn.execute("SELECT path, checksum FROM images WHERE sha256 = ?", (image_sha256,)).fetchone()
                for name in names:
                    if row is None or name != image_object(row[0], row[1]):
                        self.objects.delete(name)
        except BucketUnavailable:
            log.info("refsight: object store unavailable: the objects of image %s are left to gc", image_sha256)

    def modified(self, relative: str) -> float:
        """When the kept bytes recorded under ``relative`` were last written (0.0 when they are gone)."""
        try:
            return max((e.modified for e in self.objects.listing(f"{relative}.")), default=0.0)
        except BucketUnavailable as exc:
            raise unavailable(self.objects, exc, "collect garbage") from None

    def collect(self, cutoff: float) -> tuple[int, int]:
        """Remove image objects without a row written before ``cutoff``; ``(0, orphans)`` (no temp objects)."""
        orphans = 0
        try:
            for entry in self.objects.listing("images/"):
                sha, _, checksum = entry.name.rsplit("/", 1)[-1].partition(".")
                if entry.modified >= cutoff or not HEX_KEY.fullmatch(sha):
                    continue
                row = self._db.connection().execute("SELECT checksum FROM images WHERE sha256 = ?", (sha,)).fetchone()
                if row is None or row[0] != checksum:
                    self.unlink_if_unindexed(sha, checksum)
                    orphans += 1
        except BucketUnavailable as exc:
            raise unavailable(self.objects, exc, "collect garbage") from None
        return 0, orphans


@contextmanager
def _nothing() -> Iterator[None]:
    yield None
