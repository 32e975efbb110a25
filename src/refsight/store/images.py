"""Kept image bytes: the original file of every reference image, content-addressed by its pixel hash.

Layout: ``<root>/images/ab/<sha256>``, one row in ``images`` (path, size, format, xxh3-128) each,
so a reference can be re-encoded for another model later. Files go through the store's one
publish path (:func:`~refsight.store._files.staged`: temp file, fsync, rename and directory
fsync inside the transaction that inserts the row, cleanup on failure); the first bytes kept
for a hash win. A file is unlinked only under the write lock after its row is gone, so a
concurrent publish of the same image always keeps its file-row pair.
"""

from __future__ import annotations

import os
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

from ..errors import InvalidInputError, NotFoundError, StoreError
from ._files import HEX_KEY, TEMP_PREFIX, StagedFile, read_exact, staged
from ._files import checksum as file_checksum

__all__ = ["KeptImages", "check_sha"]


def check_sha(value: object) -> str:
    """``value`` when it is a sha256 hex digest (image hashes name files), else :class:`InvalidInputError`."""
    if not isinstance(value, str) or not HEX_KEY.fullmatch(value):
        raise InvalidInputError(value, "an image hash is 64 lowercase hex characters (a sha256)")
    return value


class KeptImages:
    """The kept original bytes of a store's images (files under ``root/images``, rows in its database)."""

    def __init__(self, root: Path, database) -> None:
        self.root = Path(root)
        self.directory = self.root / "images"
        self._db = database

    def path(self, image_sha256: str) -> Path:
        """Where the kept bytes of an image live."""
        check_sha(image_sha256)
        return self.directory / image_sha256[:2] / image_sha256

    def has(self, image_sha256: str) -> bool:
        """Whether the bytes of this image are kept."""
        check_sha(image_sha256)
        return self._db.connection().execute("SELECT 1 FROM images WHERE sha256 = ?", (image_sha256,)).fetchone() is not None

    def format(self, image_sha256: str) -> str | None:
        """The container format the kept bytes were in (e.g. ``"PNG"``); raises NotFoundError."""
        check_sha(image_sha256)
        row = self._db.connection().execute("SELECT format FROM images WHERE sha256 = ?", (image_sha256,)).fetchone()
        if row is None:
            raise NotFoundError(image_sha256, "image")
        return row[0]

    def read(self, image_sha256: str) -> bytes:
        """The kept original bytes (checksum verified); raises NotFoundError, or StoreError when damaged."""
        check_sha(image_sha256)
        row = self._db.connection().execute(
            "SELECT path, bytes, checksum FROM images WHERE sha256 = ?", (image_sha256,)
        ).fetchone()
        if row is None:
            raise NotFoundError(image_sha256, "image")
        path, size, digest = row
        try:
            data = read_exact(self.root / path, size)
        except (OSError, ValueError) as exc:
            raise StoreError(f"kept bytes of image {image_sha256} are damaged: {exc}") from exc
        if file_checksum(data) != digest:
            raise StoreError(f"kept bytes of image {image_sha256} are damaged: checksum mismatch")
        return bytes(data)

    # -- writes -----------------------------------------------------------------------
    def stage(self, image_sha256: str, data: bytes) -> AbstractContextManager[StagedFile | None]:
        """The bytes written to a temp file, ready for :meth:`record` (None when the image is kept already)."""
        check_sha(image_sha256)
        if not isinstance(data, (bytes, bytearray, memoryview)) or not len(data):
            raise InvalidInputError(image_sha256, "image bytes must be non-empty bytes")
        if self.has(image_sha256):
            return nullcontext(None)
        return staged(
            self.path(image_sha256), [data], what=f"image {image_sha256}",
            withdraw=lambda: self.unlink_if_unindexed(image_sha256),
        )

    def record(self, conn, image_sha256: str, file: StagedFile | None, fmt: str | None) -> None:
        """Inside the caller's write: publish ``file`` and insert its row, unless a row exists already."""
        if file is None or conn.execute("SELECT 1 FROM images WHERE sha256 = ?", (image_sha256,)).fetchone():
            return  # the first bytes kept win (a concurrent writer may have just kept them)
        # The file is renamed into place and its directory fsynced before its row commits.
        file.publish()
        conn.execute(
            "INSERT INTO images (sha256, path, bytes, format, checksum) VALUES (?, ?, ?, ?, ?)",
            (image_sha256, str(file.final.relative_to(self.root)), file.size, fmt, file.checksum),
        )

    def put(self, image_sha256: str, data: bytes, fmt: str | None) -> None:
        """Keep the original bytes under the image's pixel hash (the first bytes kept win)."""
        with self.stage(image_sha256, data) as file:
            if file is not None:
                with self._db.write() as conn:
                    self.record(conn, image_sha256, file, fmt)

    def unlink_if_unindexed(self, image_sha256: str) -> None:
        """Remove the file of an image that has no row, checked again under the write lock."""
        # A concurrent put may have published the same image since the caller's delete: its file must stay.
        with self._db.write() as conn:
            if conn.execute("SELECT 1 FROM images WHERE sha256 = ?", (image_sha256,)).fetchone():
                return
            self.path(image_sha256).unlink(missing_ok=True)

    # -- garbage (store/gc.py) -------------------------------------------------------------
    def modified(self, relative: str) -> float:
        """When the kept bytes recorded under ``relative`` were written (0.0 when they are gone)."""
        try:
            return (self.root / relative).stat().st_mtime
        except OSError:
            return 0.0

    def collect(self, cutoff: float) -> tuple[int, int]:
        """Remove temp files and files without a row written before ``cutoff``; ``(temps, orphans)``."""
        if not self.directory.is_dir():
            return 0, 0
        indexed = {row[0] for row in self._db.connection().execute("SELECT sha256 FROM images")}
        temps = orphans = 0
        for path in sorted(self.directory.glob("*/*")):
            name = path.name
            if name.startswith(TEMP_PREFIX):
                if self.modified(str(path.relative_to(self.root))) < cutoff:
                    try:
                        os.unlink(path)
                        temps += 1
                    except FileNotFoundError:
                        pass  # its writer renamed or removed it meanwhile
            elif name not in indexed and HEX_KEY.fullmatch(name):
                self.unlink_if_unindexed(name)  # looks again under the write lock
                orphans += not path.exists()
        return temps, orphans
