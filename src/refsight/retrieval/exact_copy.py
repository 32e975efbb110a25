"""The float32 copy of a graph's vectors, kept beside it and read through a memory map.

The int8 graph only proposes candidates; their order and scores come from the exact float32
vectors. Reading 30 of those rows from the SQLite database costs about a millisecond at a
million entries (a join: two B-tree searches per row); from this copy it costs microseconds.

Files, in the index folder::

    exact.f32      rows of ``dim`` float32, append-only
    exact.labels   one int64 label per row, in the same order, append-only
    exact.lock     flock'd: exclusive by a writer, shared while a reader maps the pair

Like the graph, the copy is *derived*; the database stays the truth. A label's vector never
changes (a replaced reference gets a new label), so a row once written is right for ever;
rows of removed labels are dead weight until the copy is rewritten. Labels the copy lacks
(another process added them, or the copy was lost) are read from the database instead.

Crash safety comes from the order of writes. Rows are appended and fsynced before their
labels, so a label is only present once its row is whole; both files are read as long as the
shorter one, and a writer cuts the torn tail off before appending. A rewrite deletes the
labels file first, so a crash part-way leaves an empty copy, never a misaligned one.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

__all__ = ["ExactCopy"]

ROWS_FILE = "exact.f32"
LABELS_FILE = "exact.labels"
LOCK_FILE = "exact.lock"
_LABEL_BYTES = 8


class ExactCopy:
    """Append-only float32 vectors by label in one index folder (see the module docstring)."""

    def __init__(self, directory: Path | str, dim: int):
        self.directory = Path(directory)
        self.dim = int(dim)
        self._row_bytes = 4 * self.dim
        self._pending: dict[int, np.ndarray] = {}  # appended, not yet written
        self._sorted = np.zeros(0, np.int64)  # the mapped labels, sorted ...
        self._rows_of_sorted = np.zeros(0, np.int64)  # ... and the row of each
        self._rows = np.zeros((0, self.dim), np.float32)
        self._seen: tuple[int, int, int] | None = None  # (labels inode, labels size, rows inode) mapped
        self.refresh()

    def _path(self, name: str) -> Path:
        return self.directory / name

    @contextmanager
    def _locked(self, exclusive: bool) -> Iterator[None]:
        self.directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(self._path(LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            yield
        finally:
            os.close(fd)  # closing releases the lock

    def _stat(self) -> tuple[int, int, int, int] | None:
        """(labels inode, labels size, rows inode, rows size), or None if either file is missing."""
        try:
            labels, rows = self._path(LABELS_FILE).stat(), self._path(ROWS_FILE).stat()
        except FileNotFoundError:
            return None
        return labels.st_ino, labels.st_size, rows.st_ino, rows.st_size

    def _whole_rows(self, stat: tuple[int, int, int, int] | None) -> int:
        """Rows that have both their vector and their label written."""
        return 0 if stat is None else min(stat[1] // _LABEL_BYTES, stat[3] // self._row_bytes)

    # -- reading --------------------------------------------------------------------------

    def refresh(self) -> None:
        """Map what the files hold now, including rows other processes wrote since."""
        stat = self._stat()
        if stat is not None and stat[:3] == self._seen:
            return
        labels, rows = np.zeros(0, np.int64), np.zeros((0, self.dim), np.float32)
        if stat is not None:
            with self._locked(exclusive=False):  # a writer may be swapping the pair: wait for it
                stat = self._stat()
                n = self._whole_rows(stat)
                if n:
                    labels = np.fromfile(self._path(LABELS_FILE), dtype=np.int64, count=n)
                    # the map outlives the lock: a rewrite renames a new file over this one,
                    # and the old inode stays readable for as long as it is mapped
                    rows = np.memmap(self._path(ROWS_FILE), dtype=np.float32, mode="r", shape=(n, self.dim))
        order = np.argsort(labels, kind="stable")
        self._sorted, self._rows_of_sorted, self._rows = labels[order], order, rows.view(np.ndarray)
        self._seen = None if stat is None else stat[:3]

    def held(self) -> np.ndarray:
        """Labels this copy can answer for (written or pending), sorted and unique."""
        pending = np.fromiter(self._pending, np.int64, count=len(self._pending))
        return np.union1d(self._sorted, pending)

    def __len__(self) -> int:
        return len(self.held())

    @property
    def rows_written(self) -> int:
        """Rows in the files, dead ones and duplicates included (what the disk holds)."""
        return len(self._sorted)

    def get(self, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(found labels, their float32 vectors, labels not held)`` for these labels."""
        labels = np.asarray(labels, np.int64).reshape(-1)
        found = np.zeros(len(labels), bool)
        vectors = np.empty((len(labels), self.dim), np.float32)
        if len(self._sorted) and len(labels):
            pos = np.searchsorted(self._sorted, labels).clip(max=len(self._sorted) - 1)
            found = self._sorted[pos] == labels
            vectors[found] = self._rows[self._rows_of_sorted[pos[found]]]
        for i in np.flatnonzero(~found) if self._pending else ():
            vector = self._pending.get(int(labels[i]))
            if vector is not None:
                vectors[i], found[i] = vector, True
        return labels[found], vectors[found], labels[~found]

    # -- writing --------------------------------------------------------------------------

    def append(self, labels: np.ndarray, vectors: np.ndarray) -> None:
        """Queue rows for these labels (written by :meth:`flush`); labels held already are skipped."""
        vectors = np.asarray(vectors, np.float32).reshape(-1, self.dim)
        labels = np.asarray(labels, np.int64).reshape(-1)
        _, _, new = self.get(labels)
        keep = np.isin(labels, new)
        for label, vector in zip(labels[keep], vectors[keep]):
            self._pending[int(label)] = vector.copy()

    @property
    def dirty(self) -> bool:
        """Whether rows are queued but not yet written."""
        return bool(self._pending)

    def flush(self) -> None:
        """Append the queued rows to the files (rows fsynced before labels)."""
        if not self._pending:
            return
        with self._locked(exclusive=True):
            n = self._whole_rows(self._stat())
            written = np.fromfile(self._path(LABELS_FILE), dtype=np.int64, count=n) if n else np.zeros(0, np.int64)
            labels = np.fromiter(self._pending, np.int64, count=len(self._pending))
            labels = labels[~np.isin(labels, written)]  # another process may have written them
            if len(labels):
                # cut any torn tail so the new rows line up with their labels
                for name, size in ((ROWS_FILE, n * self._row_bytes), (LABELS_FILE, n * _LABEL_BYTES)):
                    with open(self._path(name), "ab") as f:
                        f.truncate(size)
                rows = np.stack([self._pending[int(label)] for label in labels])
                _append_synced(self._path(ROWS_FILE), rows.tobytes())
                _append_synced(self._path(LABELS_FILE), labels.tobytes())
        self._pending.clear()
        self.refresh()

    def replace(self, labels: np.ndarray, vectors: np.ndarray) -> None:
        """Rewrite the copy to hold exactly these rows (drops dead rows and anything queued)."""
        labels = np.ascontiguousarray(labels, np.int64).reshape(-1)
        vectors = np.ascontiguousarray(vectors, np.float32).reshape(len(labels), self.dim)
        with self._locked(exclusive=True):
            _unlink(self._path(LABELS_FILE))  # from here until the end the copy reads as empty
            _write_synced(self._path(ROWS_FILE), vectors)
            _write_synced(self._path(LABELS_FILE), labels)
        self._pending.clear()
        self.refresh()

    def clear(self) -> None:
        """Delete the files and forget everything queued."""
        with self._locked(exclusive=True):
            _unlink(self._path(LABELS_FILE))
            _unlink(self._path(ROWS_FILE))
        self._pending.clear()
        self.refresh()


def _append_synced(path: Path, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _write_synced(path: Path, array: np.ndarray) -> None:
    """Write a whole file atomically: temp file, fsync, rename."""
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            array.tofile(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass
