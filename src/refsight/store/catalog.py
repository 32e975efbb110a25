"""The catalog: references per namespace and their package links, over the store's database.

It shares the store's database with :class:`~refsight.store.disk.DiskPackageStore` and runs
the same SQL on SQLite and PostgreSQL. Its parts have modules of their own: the change journal
(:mod:`refsight.store.journal`: every added, changed or removed reference journaled under a
per-namespace revision in the same transaction, so derived indexes ask for
:meth:`SqlCatalog.changes_since`), the kept image bytes (:mod:`refsight.store.images`) and the
persistent counters (:class:`~refsight.store.counters.CounterTable`, updated with
``value = value + ?`` inside the database, so concurrent processes never lose a bump).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import InvalidInputError, ReferenceNotFoundError
from ..package import canonical_json
from . import journal
from ..inputs.ref_ids import validate_ref_id
from .base import DEFAULT_NAMESPACE, Catalog, Reference, ReferenceChanges, metadata_from_json
from .counters import CounterTable
from .images import KeptImages, check_sha
from .sqlite import SqliteDatabase, open_database

if TYPE_CHECKING:  # pragma: no cover
    from .postgres import PgDatabase

__all__ = ["SqlCatalog"]

_COLUMNS = "namespace, ref_id, image_sha256, metadata, created_at"
#: How many of a namespace's ids a missing id is compared with for close matches (the store may hold millions).
CLOSE_IDS_SCANNED = 10_000


def _check_namespace(namespace: object) -> str:
    # Namespaces follow the reference-id rules (they may end up in paths and URLs too).
    try:
        return validate_ref_id(namespace)
    except InvalidInputError as exc:
        raise InvalidInputError(namespace, f"invalid namespace: {exc.reason}") from None


class SqlCatalog(Catalog):
    """References, links, kept image bytes and counters of one store."""

    def __init__(
        self, root: str | Path, *, database: SqliteDatabase | PgDatabase | None = None, images: KeptImages | None = None,
    ) -> None:
        self.root = Path(root)
        self._owns_db = database is None
        self._db = open_database(self.root, database)
        # The kept bytes: files under root/images, or (a bucket store's) objects of the bucket.
        self.images = images if images is not None else KeptImages(self.root, self._db)
        self.images_dir = self.images.directory
        self._counters = CounterTable(self._db)

    # -- reading --------------------------------------------------------------------------
    def _reference(self, conn, row) -> Reference:
        namespace, ref_id, image_sha256, metadata, created_at = row
        links = conn.execute(
            "SELECT fingerprint_digest, package_key FROM reference_packages WHERE namespace = ? AND ref_id = ?",
            (namespace, ref_id),
        )
        return Reference(
            ref_id=ref_id, image_sha256=image_sha256, metadata=metadata_from_json(metadata), created_at=created_at,
            namespace=namespace, packages=dict(links.fetchall()),
        )

    def _row(self, conn, namespace: str, ref_id: str):
        return conn.execute(
            f'SELECT {_COLUMNS} FROM "references" WHERE namespace = ? AND ref_id = ?', (namespace, ref_id)
        ).fetchone()

    def _close_ids(self, conn, namespace: str, ref_id: str) -> list[str]:
        """Up to 3 of the namespace's ids that look like ``ref_id`` (a typo's fix), among its first
        :data:`CLOSE_IDS_SCANNED` ids: a mistyped id costs one bounded read, whatever the store's size."""
        import difflib  # only when an id is missing

        rows = conn.execute('SELECT ref_id FROM "references" WHERE namespace = ? ORDER BY ref_id LIMIT ?',
                            (namespace, CLOSE_IDS_SCANNED)).fetchall()
        return difflib.get_close_matches(ref_id, [row[0] for row in rows], n=3, cutoff=0.6)

    def _select(self, where: str, params: tuple) -> list[Reference]:
        conn = self._db.connection()
        # One read transaction, so the rows and their links are one consistent snapshot.
        conn.execute("BEGIN")
        try:
            rows = conn.execute(
                f'SELECT {_COLUMNS} FROM "references" WHERE {where} ORDER BY created_at, ref_id', params
            ).fetchall()
            return [self._reference(conn, r) for r in rows]
        finally:
            conn.execute("COMMIT")

    def get_reference(self, ref_id: str, *, namespace: str = DEFAULT_NAMESPACE) -> Reference:
        """The reference, with its package links; raises :class:`ReferenceNotFoundError`."""
        validate_ref_id(ref_id)
        found = self._select("namespace = ? AND ref_id = ?", (_check_namespace(namespace), ref_id))
        if not found:
            raise ReferenceNotFoundError(ref_id, close=self._close_ids(self._db.connection(), namespace, ref_id))
        return found[0]

    def find_references(self, image_sha256: str, *, namespace: str = DEFAULT_NAMESPACE) -> list[Reference]:
        """References in ``namespace`` whose image has this hash, oldest first."""
        check_sha(image_sha256)
        return self._select("namespace = ? AND image_sha256 = ?", (_check_namespace(namespace), image_sha256))

    def list_references(self, *, namespace: str = DEFAULT_NAMESPACE) -> list[Reference]:
        """All references in ``namespace``, oldest first."""
        return self._select("namespace = ?", (_check_namespace(namespace),))

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

    # -- the journal ----------------------------------------------------------------------
    def revision(self, *, namespace: str = DEFAULT_NAMESPACE) -> int:
        """The namespace's change counter: it grows with every added, changed or removed reference."""
        return journal.current_revision(self._db.connection(), _check_namespace(namespace))

    def changes_since(self, revision: int | None, *, namespace: str = DEFAULT_NAMESPACE) -> ReferenceChanges:
        """What changed in ``namespace`` after ``revision`` (``None``: every reference, as changed).

        Reads one snapshot, so the returned revision covers exactly the returned rows.
        """
        return journal.changes_since(self._db.connection(), _check_namespace(namespace), revision)

    def last_change(self, ref_id: str, *, namespace: str = DEFAULT_NAMESPACE) -> tuple[int, bool] | None:
        """``(revision, removed)`` of the id's latest change in the journal, or None when it has none."""
        return journal.last_change(self._db.connection(), _check_namespace(namespace), validate_ref_id(ref_id))

    # -- writing --------------------------------------------------------------------------
    def add_reference(
        self, ref_id: str, image_sha256: str, metadata: dict[str, Any], *, namespace: str = DEFAULT_NAMESPACE
    ) -> Reference:
        """Create the reference, or merge ``metadata`` into the existing one with the same image.

        Raises :class:`InvalidInputError` for a bad id, hash or metadata, and when
        ``ref_id`` already names another image in this namespace.
        """
        metadata_json = _checked(ref_id, namespace, image_sha256, metadata)
        with self._db.write() as conn:
            self._upsert(conn, namespace, ref_id, image_sha256, metadata, metadata_json)
        return self.get_reference(ref_id, namespace=namespace)

    def ingest_reference(
        self, ref_id: str, image_sha256: str, data: bytes, fmt: str | None, metadata: dict[str, Any], *,
        namespace: str = DEFAULT_NAMESPACE, link: tuple[str, str] | None = None,
    ) -> Reference:
        """Keep the image bytes, create (or merge) the reference and link its package, in ONE transaction.

        ``link`` is ``(fingerprint digest, package key)``. Either all of it is recorded or
        nothing is: a conflicting id raises :class:`InvalidInputError` before any file is
        published, a full disk :class:`~refsight.errors.StoreUnavailableError` (the one
        publish path of :mod:`refsight.store.images`), and a crash between the image file
        and the commit leaves only an unindexed file, which :meth:`gc` removes.
        """
        metadata_json = _checked(ref_id, namespace, image_sha256, metadata)
        if link is not None:
            check_sha(link[0])
            check_sha(link[1])
        with self.images.stage(image_sha256, data) as file, self._db.write() as conn:
            self._upsert(conn, namespace, ref_id, image_sha256, metadata, metadata_json, image=(file, fmt))
            if link is not None:
                _link(conn, namespace, ref_id, *link)
            return self._reference(conn, self._row(conn, namespace, ref_id))

    def _upsert(self, conn, namespace, ref_id, image_sha256, metadata, metadata_json, *, image=None) -> None:
        # Inside the caller's write: the check and the insert (or merge) are one step.
        row = self._row(conn, namespace, ref_id)
        if row is not None and row[2] != image_sha256:
            raise InvalidInputError(
                ref_id, f"reference already exists with another image ({row[2][:12]}…); remove it first or pick another id"
            )
        if image is not None:
            self.images.record(conn, image_sha256, *image)  # after the conflict check: no file for a refusal
        if row is None:
            conn.execute(
                f'INSERT INTO "references" ({_COLUMNS}) VALUES (?, ?, ?, ?, ?)',
                (namespace, ref_id, image_sha256, metadata_json, time.time()),
            )
            journal.record_change(conn, namespace, ref_id, removed=False)
        elif metadata and (merged := canonical_json({**json.loads(row[3]), **metadata})) != row[3]:
            conn.execute('UPDATE "references" SET metadata = ? WHERE namespace = ? AND ref_id = ?', (merged, namespace, ref_id))
            journal.record_change(conn, namespace, ref_id, removed=False)

    def remove_reference(self, ref_id: str, *, namespace: str = DEFAULT_NAMESPACE) -> tuple[Reference, list[str]]:
        """Remove a reference; returns it and the package keys no other reference links to.

        The caller deletes those packages. When no reference (in any namespace) uses
        the image any more, its kept bytes are deleted too.
        """
        validate_ref_id(ref_id)
        _check_namespace(namespace)
        with self._db.write() as conn:
            row = self._row(conn, namespace, ref_id)
            if row is None:
                raise ReferenceNotFoundError(ref_id, close=self._close_ids(conn, namespace, ref_id))
            reference = self._reference(conn, row)
            conn.execute("DELETE FROM reference_packages WHERE namespace = ? AND ref_id = ?", (namespace, ref_id))
            conn.execute('DELETE FROM "references" WHERE namespace = ? AND ref_id = ?', (namespace, ref_id))
            journal.record_change(conn, namespace, ref_id, removed=True)
            orphans = sorted(key for key in set(reference.packages.values()) if not _linked(conn, key))
            image_unused = (
                conn.execute('SELECT 1 FROM "references" WHERE image_sha256 = ? LIMIT 1', (reference.image_sha256,)).fetchone()
                is None
            )
            if image_unused:
                conn.execute("DELETE FROM images WHERE sha256 = ?", (reference.image_sha256,))
        if image_unused:
            self.images.unlink_if_unindexed(reference.image_sha256)
        return reference, orphans

    def link_package(
        self, ref_id: str, fingerprint_digest: str, package_key: str, *, namespace: str = DEFAULT_NAMESPACE
    ) -> None:
        """Record ``package_key`` as the reference's package under that fingerprint (replaces an older link)."""
        validate_ref_id(ref_id)
        _check_namespace(namespace)
        check_sha(fingerprint_digest)
        check_sha(package_key)
        with self._db.write() as conn:
            if self._row(conn, namespace, ref_id) is None:
                raise ReferenceNotFoundError(ref_id)
            _link(conn, namespace, ref_id, fingerprint_digest, package_key)

    def unlink_fingerprint(self, fingerprint_digest: str) -> int:
        """Forget every reference's package link under ``fingerprint_digest`` (``prune``); returns how many.

        The references themselves, their metadata and their kept images stay: a later use
        under that model encodes again from the kept image and links the new package.
        """
        check_sha(fingerprint_digest)
        with self._db.write() as conn:
            return conn.execute(
                "DELETE FROM reference_packages WHERE fingerprint_digest = ?", (fingerprint_digest,)
            ).rowcount

    # -- image bytes and counters (their own modules) ----------------------------------------
    def image_path(self, image_sha256: str) -> Path:
        """Where the kept bytes of an image live."""
        return self.images.path(image_sha256)

    def put_image(self, image_sha256: str, data: bytes, fmt: str | None) -> None:
        """Keep the original bytes under the image's pixel hash (the first bytes kept win)."""
        self.images.put(image_sha256, data, fmt)

    def has_image(self, image_sha256: str) -> bool:
        """Whether the bytes of this image are kept."""
        return self.images.has(image_sha256)

    def image_format(self, image_sha256: str) -> str | None:
        """The container format the kept bytes were in (e.g. ``"PNG"``); raises NotFoundError."""
        return self.images.format(image_sha256)

    def get_image(self, image_sha256: str) -> bytes:
        """The kept original bytes (checksum verified); raises NotFoundError, or StoreError when damaged."""
        return self.images.read(image_sha256)

    def bump(self, **amounts: float) -> None:
        """Add to persistent counters in one transaction, atomically across processes."""
        self._counters.bump(**amounts)

    def counters(self) -> dict[str, float]:
        """Every counter (the standard ones default to 0)."""
        return self._counters.values()

    def close(self) -> None:
        """Close the database connections this catalog opened. Idempotent."""
        if self._owns_db:
            self._db.close()


def _checked(ref_id: object, namespace: object, image_sha256: object, metadata: object) -> str:
    # The checks every write does before it takes the lock; returns the metadata's canonical JSON.
    validate_ref_id(ref_id)
    _check_namespace(namespace)
    check_sha(image_sha256)
    if not isinstance(metadata, dict) or not all(isinstance(k, str) for k in metadata):
        raise InvalidInputError(metadata, "reference metadata must be a dict with string keys")
    try:
        return canonical_json(metadata)
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(metadata, f"reference metadata must be JSON: {exc}") from None


def _linked(conn, package_key: str) -> bool:
    # A remembered image's package is in use too (store/remembered.py): removing a reference leaves it.
    return conn.execute(
        "SELECT 1 FROM reference_packages WHERE package_key = ? UNION ALL "
        "SELECT 1 FROM remembered_packages WHERE package_key = ? LIMIT 1",
        (package_key, package_key),
    ).fetchone() is not None


def _link(conn, namespace: str, ref_id: str, fingerprint_digest: str, package_key: str) -> None:
    # One link per (reference, fingerprint): a newer package for the same model replaces the older.
    conn.execute(
        "INSERT INTO reference_packages (namespace, ref_id, fingerprint_digest, package_key) VALUES (?, ?, ?, ?) "
        "ON CONFLICT (namespace, ref_id, fingerprint_digest) DO UPDATE SET package_key = excluded.package_key",
        (namespace, ref_id, fingerprint_digest, package_key),
    )
