"""The catalog on SQLite: references, their package links, kept image bytes, counters.

It shares ``<root>/refsight.db`` with :class:`~refsight.store.local.LocalPackageStore`.
Original image bytes live content-addressed as ``images/ab/<sha256>`` (written
with the same temp-fsync-rename-then-row sequence as packages), so a reference
can be re-encoded for another model later. Counters are updated with
``value = value + ?`` inside SQLite, so concurrent processes never lose a bump.
Every added, changed or removed reference is journaled under a per-namespace revision
in the same transaction, so derived indexes can ask for :meth:`SqliteCatalog.changes_since`.
"""

from __future__ import annotations

import json
import math
import re
import time
from pathlib import Path
from typing import Any

from ..errors import InvalidInputError, NotFoundError, ReferenceNotFoundError, StoreError
from ..package import canonical_json
from ._failures import store_failure
from ._files import checksum as file_checksum
from ._files import publish, read_exact, write_temp
from ._sqlite import Database
from .base import (
    COUNTER_NAMES,
    DEFAULT_NAMESPACE,
    Catalog,
    Reference,
    ReferenceChanges,
    ReferenceRow,
    validate_ref_id,
)

__all__ = ["SqliteCatalog"]

_SHA256 = re.compile(r"[0-9a-f]{64}")
_COUNTER = re.compile(r"[a-z][a-z0-9_]{0,63}")


def _check_sha(value: object) -> str:
    # Image hashes name files under images/: only a sha256 hex digest may pass.
    if not isinstance(value, str) or not _SHA256.fullmatch(value):
        raise InvalidInputError(value, "an image hash is 64 lowercase hex characters (a sha256)")
    return value


def _check_namespace(namespace: object) -> str:
    # Namespaces follow the reference-id rules (they may end up in paths and URLs too).
    try:
        return validate_ref_id(namespace)
    except InvalidInputError as exc:
        raise InvalidInputError(namespace, f"invalid namespace: {exc.reason}") from None


class SqliteCatalog(Catalog):
    """References and image bytes of one store directory."""

    def __init__(self, root: str | Path, *, database: Database | None = None) -> None:
        self.root = Path(root)
        self._owns_db = database is None
        if database is None:
            try:
                self.root.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise StoreError(f"cannot create store directory {self.root}: {exc}") from exc
        self._db = database if database is not None else Database(self.root)
        self.images_dir = self.root / "images"

    # -- references -------------------------------------------------------------
    def _links(self, conn, namespace: str, ref_id: str) -> dict[str, str]:
        rows = conn.execute(
            "SELECT fingerprint_digest, package_key FROM reference_packages WHERE namespace = ? AND ref_id = ?",
            (namespace, ref_id),
        )
        return dict(rows.fetchall())

    def _reference(self, conn, row) -> Reference:
        namespace, ref_id, image_sha256, metadata, created_at = row
        return Reference(
            ref_id=ref_id,
            image_sha256=image_sha256,
            metadata=json.loads(metadata),
            created_at=created_at,
            namespace=namespace,
            packages=self._links(conn, namespace, ref_id),
        )

    def add_reference(
        self, ref_id: str, image_sha256: str, metadata: dict[str, Any], *, namespace: str = DEFAULT_NAMESPACE
    ) -> Reference:
        """Create the reference, or merge ``metadata`` into the existing one with the same image.

        Raises :class:`InvalidInputError` for a bad id, hash or metadata, and when
        ``ref_id`` already names another image in this namespace.
        """
        validate_ref_id(ref_id)
        _check_namespace(namespace)
        _check_sha(image_sha256)
        metadata_json = _metadata_json(metadata)
        with self._db.write() as conn:
            row = conn.execute(
                'SELECT image_sha256, metadata FROM "references" WHERE namespace = ? AND ref_id = ?',
                (namespace, ref_id),
            ).fetchone()
            if row is None:
                conn.execute(
                    'INSERT INTO "references" (namespace, ref_id, image_sha256, metadata, created_at) VALUES (?, ?, ?, ?, ?)',
                    (namespace, ref_id, image_sha256, metadata_json, time.time()),
                )
                _journal(conn, namespace, ref_id, removed=False)
            elif row[0] != image_sha256:
                raise InvalidInputError(
                    ref_id, f"reference already exists with another image ({row[0][:12]}…); remove it first or pick another id"
                )
            elif metadata and (merged := canonical_json({**json.loads(row[1]), **metadata})) != row[1]:
                conn.execute(
                    'UPDATE "references" SET metadata = ? WHERE namespace = ? AND ref_id = ?',
                    (merged, namespace, ref_id),
                )
                _journal(conn, namespace, ref_id, removed=False)
        return self.get_reference(ref_id, namespace=namespace)

    def ingest_reference(
        self,
        ref_id: str,
        image_sha256: str,
        data: bytes,
        fmt: str | None,
        metadata: dict[str, Any],
        *,
        namespace: str = DEFAULT_NAMESPACE,
        link: tuple[str, str] | None = None,
    ) -> Reference:
        """Keep the image bytes, create (or merge) the reference and link its package, in ONE transaction.

        ``link`` is ``(fingerprint digest, package key)``. Either all of it is recorded or
        nothing is: a conflicting id raises :class:`InvalidInputError` before any file is
        published, and a crash between the image file and the commit leaves only an
        unindexed file, which :meth:`gc` removes.
        """
        validate_ref_id(ref_id)
        _check_namespace(namespace)
        _check_sha(image_sha256)
        metadata_json = _metadata_json(metadata)
        if link is not None:
            _check_sha(link[0])
            _check_sha(link[1])
        if not isinstance(data, (bytes, bytearray, memoryview)) or not len(data):
            raise InvalidInputError(image_sha256, "image bytes must be non-empty bytes")
        final = self.image_path(image_sha256)
        temp = None
        if not self.has_image(image_sha256):
            try:
                temp, digest, size = write_temp(final.parent, [data])
            except OSError as exc:
                raise StoreError(f"cannot write image {image_sha256} under {final.parent}: {exc}") from exc
        published = False
        try:
            with self._db.write() as conn:
                row = conn.execute(
                    'SELECT image_sha256, metadata FROM "references" WHERE namespace = ? AND ref_id = ?',
                    (namespace, ref_id),
                ).fetchone()
                if row is not None and row[0] != image_sha256:
                    raise InvalidInputError(
                        ref_id,
                        f"reference already exists with another image ({row[0][:12]}…); remove it first or pick another id",
                    )
                if temp is not None and not conn.execute("SELECT 1 FROM images WHERE sha256 = ?", (image_sha256,)).fetchone():
                    # The file is renamed into place and fsynced before its row commits.
                    publish(temp, final)
                    published = True
                    conn.execute(
                        "INSERT INTO images (sha256, path, bytes, format, checksum) VALUES (?, ?, ?, ?, ?)",
                        (image_sha256, str(final.relative_to(self.root)), size, fmt, digest),
                    )
                if row is None:
                    conn.execute(
                        'INSERT INTO "references" (namespace, ref_id, image_sha256, metadata, created_at) VALUES (?, ?, ?, ?, ?)',
                        (namespace, ref_id, image_sha256, metadata_json, time.time()),
                    )
                    _journal(conn, namespace, ref_id, removed=False)
                elif metadata and (merged := canonical_json({**json.loads(row[1]), **metadata})) != row[1]:
                    conn.execute(
                        'UPDATE "references" SET metadata = ? WHERE namespace = ? AND ref_id = ?',
                        (merged, namespace, ref_id),
                    )
                    _journal(conn, namespace, ref_id, removed=False)
                if link is not None:
                    _link(conn, namespace, ref_id, *link)
                reference = self._reference(
                    conn,
                    conn.execute(
                        'SELECT namespace, ref_id, image_sha256, metadata, created_at FROM "references" '
                        "WHERE namespace = ? AND ref_id = ?",
                        (namespace, ref_id),
                    ).fetchone(),
                )
        except OSError as exc:
            raise StoreError(f"cannot publish image {image_sha256}: {exc}") from exc
        finally:
            if temp is not None and not published:
                temp.unlink(missing_ok=True)
        return reference

    def get_reference(self, ref_id: str, *, namespace: str = DEFAULT_NAMESPACE) -> Reference:
        """The reference, with its package links; raises :class:`ReferenceNotFoundError`."""
        validate_ref_id(ref_id)
        _check_namespace(namespace)
        conn = self._db.connection()
        # One read transaction so the row and its links are one consistent snapshot.
        conn.execute("BEGIN")
        try:
            row = conn.execute(
                'SELECT namespace, ref_id, image_sha256, metadata, created_at FROM "references" '
                "WHERE namespace = ? AND ref_id = ?",
                (namespace, ref_id),
            ).fetchone()
            if row is None:
                raise ReferenceNotFoundError(ref_id)
            return self._reference(conn, row)
        finally:
            conn.execute("COMMIT")

    def _select(self, where: str, params: tuple) -> list[Reference]:
        conn = self._db.connection()
        conn.execute("BEGIN")
        try:
            rows = conn.execute(
                'SELECT namespace, ref_id, image_sha256, metadata, created_at FROM "references" '
                f"WHERE {where} ORDER BY created_at, ref_id",
                params,
            ).fetchall()
            return [self._reference(conn, r) for r in rows]
        finally:
            conn.execute("COMMIT")

    def find_references(self, image_sha256: str, *, namespace: str = DEFAULT_NAMESPACE) -> list[Reference]:
        """References in ``namespace`` whose image has this hash, oldest first."""
        _check_sha(image_sha256)
        _check_namespace(namespace)
        return self._select("namespace = ? AND image_sha256 = ?", (namespace, image_sha256))

    def list_references(self, *, namespace: str = DEFAULT_NAMESPACE) -> list[Reference]:
        """All references in ``namespace``, oldest first."""
        _check_namespace(namespace)
        return self._select("namespace = ?", (namespace,))

    def namespaces(self) -> list[str]:
        """Every namespace that holds at least one reference, sorted."""
        rows = self._db.connection().execute('SELECT DISTINCT namespace FROM "references" ORDER BY namespace')
        return [r[0] for r in rows.fetchall()]

    def count_references(self, *, namespace: str | None = None) -> int:
        """How many references ``namespace`` holds (all namespaces when None)."""
        conn = self._db.connection()
        if namespace is None:
            return int(conn.execute('SELECT COUNT(*) FROM "references"').fetchone()[0])
        _check_namespace(namespace)
        return int(conn.execute('SELECT COUNT(*) FROM "references" WHERE namespace = ?', (namespace,)).fetchone()[0])

    def revision(self, *, namespace: str = DEFAULT_NAMESPACE) -> int:
        """The namespace's change counter: it grows with every added, changed or removed reference."""
        _check_namespace(namespace)
        return _revision(self._db.connection(), namespace)

    def changes_since(self, revision: int | None, *, namespace: str = DEFAULT_NAMESPACE) -> ReferenceChanges:
        """What changed in ``namespace`` after ``revision`` (``None``: every reference, as changed).

        Reads one snapshot, so the returned revision covers exactly the returned rows.
        """
        _check_namespace(namespace)
        conn = self._db.connection()
        conn.execute("BEGIN")
        try:
            now = _revision(conn, namespace)
            if revision is not None and now <= revision:
                return ReferenceChanges(now, [], [])  # the common case: nothing new
            if revision is None:
                rows = conn.execute(
                    'SELECT ref_id, image_sha256, metadata FROM "references" WHERE namespace = ?', (namespace,)
                ).fetchall()
                removed: list[str] = []
            else:
                rows = conn.execute(
                    'SELECT r.ref_id, r.image_sha256, r.metadata FROM reference_changes c JOIN "references" r '
                    "ON r.namespace = c.namespace AND r.ref_id = c.ref_id "
                    "WHERE c.namespace = ? AND c.revision > ? AND c.removed = 0",
                    (namespace, revision),
                ).fetchall()
                removed = [r[0] for r in conn.execute(
                    "SELECT ref_id FROM reference_changes WHERE namespace = ? AND revision > ? AND removed = 1",
                    (namespace, revision),
                )]
        finally:
            conn.execute("COMMIT")
        changed = [ReferenceRow(ref_id, sha, json.loads(meta)) for ref_id, sha, meta in rows]
        return ReferenceChanges(now, changed, removed)

    def referenced_package_keys(self) -> set[str]:
        """Every package key some reference (in any namespace) links to."""
        rows = self._db.connection().execute("SELECT DISTINCT package_key FROM reference_packages")
        return {r[0] for r in rows.fetchall()}

    def remove_reference(self, ref_id: str, *, namespace: str = DEFAULT_NAMESPACE) -> tuple[Reference, list[str]]:
        """Remove a reference; returns it and the package keys no other reference links to.

        The caller deletes those packages. When no reference (in any namespace) uses
        the image any more, its kept bytes are deleted too.
        """
        validate_ref_id(ref_id)
        _check_namespace(namespace)
        with self._db.write() as conn:
            row = conn.execute(
                'SELECT namespace, ref_id, image_sha256, metadata, created_at FROM "references" '
                "WHERE namespace = ? AND ref_id = ?",
                (namespace, ref_id),
            ).fetchone()
            if row is None:
                raise ReferenceNotFoundError(ref_id)
            reference = self._reference(conn, row)
            conn.execute("DELETE FROM reference_packages WHERE namespace = ? AND ref_id = ?", (namespace, ref_id))
            conn.execute('DELETE FROM "references" WHERE namespace = ? AND ref_id = ?', (namespace, ref_id))
            _journal(conn, namespace, ref_id, removed=True)
            orphans = sorted(
                key
                for key in set(reference.packages.values())
                if conn.execute("SELECT 1 FROM reference_packages WHERE package_key = ? LIMIT 1", (key,)).fetchone() is None
            )
            image_unused = (
                conn.execute('SELECT 1 FROM "references" WHERE image_sha256 = ? LIMIT 1', (reference.image_sha256,)).fetchone()
                is None
            )
            if image_unused:
                conn.execute("DELETE FROM images WHERE sha256 = ?", (reference.image_sha256,))
        if image_unused:
            self._unlink_image_if_unindexed(reference.image_sha256)
        return reference, orphans

    def link_package(
        self, ref_id: str, fingerprint_digest: str, package_key: str, *, namespace: str = DEFAULT_NAMESPACE
    ) -> None:
        """Record ``package_key`` as the reference's package under that fingerprint (replaces an older link)."""
        validate_ref_id(ref_id)
        _check_namespace(namespace)
        _check_sha(fingerprint_digest)
        _check_sha(package_key)
        with self._db.write() as conn:
            exists = conn.execute(
                'SELECT 1 FROM "references" WHERE namespace = ? AND ref_id = ?', (namespace, ref_id)
            ).fetchone()
            if exists is None:
                raise ReferenceNotFoundError(ref_id)
            _link(conn, namespace, ref_id, fingerprint_digest, package_key)

    # -- image bytes --------------------------------------------------------------
    def image_path(self, image_sha256: str) -> Path:
        """Where the kept bytes of an image live."""
        _check_sha(image_sha256)
        return self.images_dir / image_sha256[:2] / image_sha256

    def put_image(self, image_sha256: str, data: bytes, fmt: str | None) -> None:
        """Keep the original bytes under the image's pixel hash (the first bytes kept win)."""
        _check_sha(image_sha256)
        if not isinstance(data, (bytes, bytearray, memoryview)) or not len(data):
            raise InvalidInputError(image_sha256, "image bytes must be non-empty bytes")
        if self.has_image(image_sha256):
            return
        final = self.image_path(image_sha256)
        try:
            temp, digest, size = write_temp(final.parent, [data])
        except OSError as exc:
            raise store_failure(exc, final.parent, f"cannot write image {image_sha256}") from exc
        published = False
        try:
            # Same ordering as packages: fsynced file, rename + directory fsync, then the
            # row, all under the write lock so a concurrent put keeps its file-row pair.
            with self._db.write() as conn:
                if conn.execute("SELECT 1 FROM images WHERE sha256 = ?", (image_sha256,)).fetchone():
                    return
                publish(temp, final)
                published = True
                conn.execute(
                    "INSERT INTO images (sha256, path, bytes, format, checksum) VALUES (?, ?, ?, ?, ?)",
                    (image_sha256, str(final.relative_to(self.root)), size, fmt, digest),
                )
        except OSError as exc:
            raise store_failure(exc, final, f"cannot publish image {image_sha256}") from exc
        finally:
            if not published:
                temp.unlink(missing_ok=True)

    def has_image(self, image_sha256: str) -> bool:
        """Whether the bytes of this image are kept."""
        _check_sha(image_sha256)
        return self._db.connection().execute("SELECT 1 FROM images WHERE sha256 = ?", (image_sha256,)).fetchone() is not None

    def image_format(self, image_sha256: str) -> str | None:
        """The container format the kept bytes were in (e.g. ``"PNG"``); raises NotFoundError."""
        _check_sha(image_sha256)
        row = self._db.connection().execute("SELECT format FROM images WHERE sha256 = ?", (image_sha256,)).fetchone()
        if row is None:
            raise NotFoundError(image_sha256, "image")
        return row[0]

    def get_image(self, image_sha256: str) -> bytes:
        """The kept original bytes (checksum verified); raises NotFoundError, or StoreError when damaged."""
        _check_sha(image_sha256)
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

    def _unlink_image_if_unindexed(self, image_sha256: str) -> None:
        # Checked again under the write lock: a concurrent put_image may have published
        # the same image since our delete, and its file must stay.
        with self._db.write() as conn:
            if conn.execute("SELECT 1 FROM images WHERE sha256 = ?", (image_sha256,)).fetchone():
                return
            self.image_path(image_sha256).unlink(missing_ok=True)

    # -- counters -----------------------------------------------------------------
    def bump(self, **amounts: float) -> None:
        """Add to persistent counters in one transaction, atomically across processes."""
        rows = []
        for name, amount in amounts.items():
            if not _COUNTER.fullmatch(name):
                raise InvalidInputError(name, "a counter name is lowercase letters, digits and _")
            if isinstance(amount, bool) or not isinstance(amount, (int, float)) or not math.isfinite(amount):
                raise InvalidInputError(amount, f"counter {name!r} needs a finite number")
            rows.append((name, float(amount)))
        if not rows:
            return
        with self._db.write() as conn:
            # value = value + excluded.value happens inside the database under its write lock:
            # no read-modify-write in Python, so no bump from another process is lost.
            conn.executemany(
                "INSERT INTO counters (name, value) VALUES (?, ?) "
                "ON CONFLICT (name) DO UPDATE SET value = counters.value + excluded.value",
                rows,
            )

    def counters(self) -> dict[str, float]:
        """Every counter (the standard ones default to 0)."""
        values = {name: 0.0 for name in COUNTER_NAMES}
        values.update(dict(self._db.connection().execute("SELECT name, value FROM counters").fetchall()))
        return values

    def close(self) -> None:
        """Close the database connections this catalog opened. Idempotent."""
        if self._owns_db:
            self._db.close()


def _link(conn, namespace: str, ref_id: str, fingerprint_digest: str, package_key: str) -> None:
    # One link per (reference, fingerprint): a newer package for the same model replaces the older.
    conn.execute(
        "INSERT INTO reference_packages (namespace, ref_id, fingerprint_digest, package_key) VALUES (?, ?, ?, ?) "
        "ON CONFLICT (namespace, ref_id, fingerprint_digest) DO UPDATE SET package_key = excluded.package_key",
        (namespace, ref_id, fingerprint_digest, package_key),
    )


def _metadata_json(metadata: object) -> str:
    if not isinstance(metadata, dict) or not all(isinstance(k, str) for k in metadata):
        raise InvalidInputError(metadata, "reference metadata must be a dict with string keys")
    try:
        return canonical_json(metadata)
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(metadata, f"reference metadata must be JSON: {exc}") from None


def _revision(conn, namespace: str) -> int:
    # The journal's highest revision in the namespace (an index lookup, not a scan).
    row = conn.execute("SELECT MAX(revision) FROM reference_changes WHERE namespace = ?", (namespace,)).fetchone()
    return int(row[0] or 0)


def _journal(conn, namespace: str, ref_id: str, *, removed: bool) -> None:
    # Inside the caller's BEGIN IMMEDIATE, so MAX()+1 cannot race another writer.
    conn.execute(
        "INSERT INTO reference_changes (namespace, ref_id, revision, removed) "
        "SELECT ?, ?, COALESCE(MAX(revision), 0) + 1, ? FROM reference_changes WHERE namespace = ? "
        "ON CONFLICT (namespace, ref_id) DO UPDATE SET revision = excluded.revision, removed = excluded.removed",
        (namespace, ref_id, int(removed), namespace),
    )
