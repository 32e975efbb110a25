"""Garbage collection: what a killed writer or a failed add leaves behind, removed without racing live ones.

Every write publishes its file first and its row second, and an add stores the
package and the image bytes before the reference that links them, so an
interrupted write (SIGKILL, a full disk) can leave:

- temp files (``.tmp-*.partial``) under ``packages/`` and ``images/``;
- package or image files without an index row (killed between rename and commit);
- package rows no reference links to and no remembered image names, and image rows no
  reference uses (the add failed after the bytes landed).

Candidate packages live in the memory tier only, so every package row on disk should
be linked by some reference or name a remembered image (:mod:`refsight.store.remembered`). Rows and temp files younger than ``grace_s`` are left
alone: they may belong to an add still in progress in another thread or process.
Files without a row are removed under the database write lock after a second look,
exactly as deletes do, so a file published meanwhile always stays.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import InvalidInputError
from ._files import TEMP_PREFIX

if TYPE_CHECKING:  # pragma: no cover
    from . import Store

__all__ = ["DEFAULT_GRACE_S", "STARTUP_TEMP_AGE_S", "collect_garbage", "sweep_stale_temps"]

#: Rows and temp files younger than this are assumed to belong to a write in progress.
DEFAULT_GRACE_S = 600.0
#: Opening a store removes temp files older than this (at most once per this interval).
STARTUP_TEMP_AGE_S = 3600.0
_SWEEP_STAMP = ".temp-sweep"


def collect_garbage(store: Store, *, grace_s: float = DEFAULT_GRACE_S) -> dict[str, int]:
    """Remove interrupted writes' leftovers from ``store``; returns how many of each were removed.

    Keys of the result: ``temp_files``, ``orphan_package_files``, ``orphan_image_files``,
    ``unlinked_packages`` (package rows no reference links to) and
    ``unreferenced_images`` (image rows no reference uses).
    """
    cutoff = time.time() - _checked_grace(grace_s)
    counts = {
        "temp_files": 0,
        "orphan_package_files": 0,
        "orphan_image_files": 0,
        "unlinked_packages": 0,
        "unreferenced_images": 0,
    }
    counts["unlinked_packages"] = _unlinked_packages(store, cutoff)
    counts["unreferenced_images"] = _unreferenced_images(store, cutoff)
    files = store.local.gc(temp_age_s=grace_s)
    counts["temp_files"] += files["temps"]
    counts["orphan_package_files"] += files["orphans"]
    temps, orphans = store.catalog.images.collect(cutoff)
    counts["temp_files"] += temps
    counts["orphan_image_files"] += orphans
    counts["temp_files"] += store.prefixes.gc(temp_age_s=grace_s)  # prefix states' killed writes
    return counts


def _checked_grace(grace_s: object) -> float:
    # A negative grace would let gc delete rows and files that live writers still own.
    if isinstance(grace_s, bool) or not isinstance(grace_s, (int, float)) or not math.isfinite(grace_s) or grace_s < 0:
        raise InvalidInputError("grace", f"must be a finite number of seconds, at least 0, not {grace_s!r}")
    return float(grace_s)


def _unlinked_packages(store: Store, cutoff: float) -> int:
    db = store._db
    candidates = [
        row[0]
        for row in db.connection().execute(
            "SELECT key FROM packages p WHERE created_at < ? AND NOT EXISTS "
            "(SELECT 1 FROM reference_packages r WHERE r.package_key = p.key) AND NOT EXISTS "
            "(SELECT 1 FROM remembered_packages m WHERE m.package_key = p.key)",
            (cutoff,),
        )
    ]
    removed = 0
    for key in candidates:
        # Checked again under the write lock: a reference may have linked it since the scan.
        with db.write() as conn:
            gone = conn.execute(
                "DELETE FROM packages WHERE key = ? AND NOT EXISTS "
                "(SELECT 1 FROM reference_packages WHERE package_key = ?) AND NOT EXISTS "
                "(SELECT 1 FROM remembered_packages WHERE package_key = ?)",
                (key, key, key),
            ).rowcount
        if gone:
            removed += 1
            for tier in store.packages.tiers:  # memory, and Redis when configured: no copy outlives the row
                if tier is not store.local:
                    tier.delete(key)
            store.local.unlink_if_unindexed(key)
    return removed


def _unreferenced_images(store: Store, cutoff: float) -> int:
    db, catalog = store._db, store.catalog
    rows = db.connection().execute(
        'SELECT sha256, path FROM images i WHERE NOT EXISTS (SELECT 1 FROM "references" r WHERE r.image_sha256 = i.sha256)'
    ).fetchall()
    removed = 0
    for sha256, relative in rows:
        # Images have no creation time in the index: the file's age stands in for it.
        if catalog.images.modified(relative) >= cutoff:
            continue
        with db.write() as conn:
            gone = conn.execute(
                'DELETE FROM images WHERE sha256 = ? AND NOT EXISTS (SELECT 1 FROM "references" WHERE image_sha256 = ?)',
                (sha256, sha256),
            ).rowcount
        if gone:
            removed += 1
            catalog.images.unlink_if_unindexed(sha256)
    return removed


def sweep_stale_temps(root: Path, *, older_than_s: float = STARTUP_TEMP_AGE_S) -> int:
    """Remove temp files older than ``older_than_s`` under ``root``; cheap enough for every open.

    The walk over the shard directories runs at most once per ``older_than_s`` per
    store (a stamp file records the last one), so opening a large store stays fast.
    """
    stamp = root / _SWEEP_STAMP
    now = time.time()
    if now - _mtime(stamp, default=0.0) < older_than_s:
        return 0
    try:
        stamp.touch()
    except OSError:
        return 0  # a read-only or full store: nothing to sweep into anyway
    removed = 0
    patterns = (("packages", f"*/*/{TEMP_PREFIX}*"), ("images", f"*/{TEMP_PREFIX}*"), ("prefixes", f"*/{TEMP_PREFIX}*"))
    for folder, pattern in patterns:
        base = root / folder
        if not base.is_dir():
            continue
        for path in base.glob(pattern):
            if now - _mtime(path) >= older_than_s:
                removed += _unlink(path)
    return removed


def _mtime(path: Path, default: float | None = None) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        # A missing file counts as old (nothing to protect), unless told otherwise.
        return default if default is not None else 0.0


def _unlink(path: Path) -> int:
    try:
        os.unlink(path)
    except FileNotFoundError:
        return 0  # its writer renamed or removed it meanwhile
    return 1
