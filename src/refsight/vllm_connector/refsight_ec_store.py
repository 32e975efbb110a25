"""The store side of refsight's vLLM encoder-cache connector: files, checks, index, quota, counters.

Self-contained on purpose (the standard library and refsight's codec beside it, :mod:`refsight_codec`:
xxhash, zstandard and numpy): it runs inside vLLM's own environment, where refsight is not
installed, as a top-level module next to :mod:`refsight_ec_connector` (the folder holding them is
put on vLLM's ``PYTHONPATH``); refsight imports it too, to read the counters for ``refsight stats``
and ``/metrics``.

Layout, under ``<refsight store>/vllm-encoder/`` (a blob directory replicas may share):

- ``ab/<name>.safetensors``: one encoder output, ``name = sha256(fingerprint NUL uuid)``,
  so the same uuid under another model, dtype, vLLM version or processor setting is
  another file. A file is a safetensors file whose header metadata carries the uuid, the
  fingerprint and the sha256 of its tensor bytes. It is kept in the codec's stored form, as
  refsight's packages are (the header and the tensor as zstd frames, the tensor over its byte
  planes; a file the codec would save too little on is kept plain, and plain files written
  before it read as they did); written to a temp file, fsynced and renamed into place, so a
  reader sees a whole file or none;
- ``index.sqlite``: each file's size and last use (the quota's least-recently-used order),
  the bytes refsight's own packages hold in the same store (``external``: the quota is one
  quota over both, written by refsight at each of its quota checks) and the counters
  (``hits``, ``misses``, ``saves``, ``corrupt``, ``evictions``, ``refused``), added to atomically by every process (WAL, ``BEGIN IMMEDIATE``). A hit writes nothing at
  once: its count and last use are buffered and written every :data:`FLUSH_INTERVAL_S`
  seconds (and with the next save, and at :meth:`ECStore.flush`), as refsight's own counters are.

With a bucket store, the bucket is the tier behind this folder, shared by every replica
(``shared``: a :class:`refsight_objects.ObjectStore`): a save uploads the same file under
``vllm-encoder/ab/<name>.safetensors``; a load that misses here downloads it, checks it exactly as
a file (a bad object is a miss, deleted) and keeps it here. An unreachable bucket is a miss: vLLM
encodes, as it would without the connector.

Only uuids refsight gives references (``refsight-`` + 64 hex digits, content-derived) are
ever looked up or saved: vLLM names items without a uuid by per-process counters, which
must never be served to another process. A file that fails any check is moved aside and
counted as corrupt, and the item is a miss: vLLM encodes it again (and saves it again).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sqlite3
import tempfile
import threading
import time
from pathlib import Path

if __package__:  # refsight imports this module from its package
    from .refsight_codec import CodecError, compress, decompress
else:  # inside vLLM, a top-level module beside the codec (this folder is on PYTHONPATH)
    from refsight_codec import CodecError, compress, decompress

__all__ = [
    "COUNTERS", "DIRNAME", "ECStore", "check_blob", "eligible", "pixels_digest_of", "read_counters", "read_file",
    "serialize", "stored_form",
]

#: The folder under a refsight store.
DIRNAME = "vllm-encoder"
#: The counters kept in ``index.sqlite``.
COUNTERS = ("hits", "misses", "saves", "corrupt", "evictions", "refused")
_UUID = re.compile(r"refsight-[0-9a-f]{64}")
#: Longest time a hit's count and last use wait in memory before they are written.
FLUSH_INTERVAL_S = 5.0
#: Largest safetensors header this module reads (a one-tensor header is ~200 bytes).
_MAX_HEADER = 1 << 16
_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1}
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS entries (name TEXT PRIMARY KEY, bytes INTEGER NOT NULL, last_used REAL NOT NULL)",
    "CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL)",
    "CREATE TABLE IF NOT EXISTS external (source TEXT PRIMARY KEY, bytes INTEGER NOT NULL, updated REAL NOT NULL)",
)


def eligible(uuid: str) -> bool:
    """Whether ``uuid`` is a reference uuid refsight gave (content-derived): the only ones kept."""
    return isinstance(uuid, str) and _UUID.fullmatch(uuid) is not None


def serialize(data: bytes, dtype: str, shape: list[int], *, uuid: str, fingerprint: str, pixels: str = "") -> bytes:
    """A one-tensor (``ec_cache``) safetensors file of raw ``data``, its metadata naming what it is
    (``pixels``: a digest of the processed pixels it was encoded from, when vLLM handed them over)."""
    metadata = {"uuid": uuid, "fingerprint": fingerprint, "sha256": hashlib.sha256(data).hexdigest(), "pixels": pixels}
    header = {"__metadata__": metadata, "ec_cache": {"dtype": dtype, "shape": shape, "data_offsets": [0, len(data)]}}
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # safetensors aligns the data to 8 bytes
    return len(raw).to_bytes(8, "little") + raw + data


def stored_form(blob: bytes) -> bytes:
    """The file :func:`serialize` made, in the codec's stored form: its header and its tensor as frames (the tensor
    over byte planes of its element size), or ``blob`` itself when compressing saves too little."""
    size = int.from_bytes(blob[:8], "little")
    (entry,) = (v for k, v in json.loads(blob[8:8 + size]).items() if k != "__metadata__")
    frames = [(blob[:8 + size], 1), (blob[8 + size:], _DTYPE_BYTES[entry["dtype"]])]
    return b"".join(bytes(chunk) for chunk in compress(frames).chunks)


def read_file(path: Path, uuid: str, fingerprint: str) -> bytes | None:
    """The file's safetensors bytes if every check passes (:func:`check_blob`), else None. Never raises for a bad file."""
    try:
        return check_blob(path.read_bytes(), uuid, fingerprint)
    except OSError:
        return None


def check_blob(stored: bytes, uuid: str, fingerprint: str) -> bytes | None:
    """The safetensors file ``stored`` holds (the codec's stored form, or a plain file) if every check passes
    (the codec's, then header, one tensor whose size fits its shape and dtype, uuid, fingerprint, checksum of the
    data), else None. Never raises for bad bytes."""
    try:
        blob = bytes(decompress(memoryview(stored)))
    except CodecError:
        return None
    try:
        size = int.from_bytes(blob[:8], "little")
        if len(blob) < 8 or not 0 < size <= _MAX_HEADER:
            return None
        header = json.loads(blob[8:8 + size])
        metadata = header.pop("__metadata__", None) or {}
        (entry,) = header.values()
        data = blob[8 + size:]
        count = 1
        for dim in entry["shape"]:
            count *= int(dim)
        fits = list(entry["data_offsets"]) == [0, len(data)] and len(data) == count * _DTYPE_BYTES[entry["dtype"]]
        named = metadata.get("uuid") == uuid and metadata.get("fingerprint") == fingerprint
        if fits and named and metadata.get("sha256") == hashlib.sha256(data).hexdigest():
            return blob
    except (ValueError, KeyError, TypeError, AttributeError):
        pass
    return None


def pixels_digest_of(blob: bytes) -> str:
    """The pixel digest a checked file carries ("" when it was saved without one)."""
    size = int.from_bytes(blob[:8], "little")
    return str((json.loads(blob[8:8 + size]).get("__metadata__") or {}).get("pixels") or "")


class ECStore:
    """Encoder outputs of one fingerprint in ``root`` (``<store>/vllm-encoder``), bounded by ``max_bytes``.

    ``max_bytes`` is the store's one quota: these files plus the bytes recorded as ``external``
    (refsight's packages) must fit it. A save past it evicts this folder's least recently used
    files (the connector cannot delete refsight's packages; refsight's own quota pass evicts
    across both in one least-recently-used order). Housekeeping by file name (refsight's quota
    pass) needs no fingerprint: ``ECStore(root, "")``.
    """

    def __init__(self, root: str | os.PathLike, fingerprint: str, *, max_bytes: int = 0, shared=None) -> None:
        self.root = Path(root)
        self.fingerprint = fingerprint
        self.max_bytes = int(max_bytes)  # 0: unbounded
        self.shared = shared  # a bucket store's ObjectStore: the tier behind this folder
        self.root.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}
        self._touched: dict[str, float] = {}
        self._flushed = time.monotonic()
        with self._write() as conn:
            for statement in _SCHEMA:
                conn.execute(statement)

    # -- files ----------------------------------------------------------------------
    def name(self, uuid: str) -> str:
        """The file name of ``uuid`` under this fingerprint."""
        return hashlib.sha256(f"{self.fingerprint}\0{uuid}".encode()).hexdigest()

    def path(self, uuid: str) -> Path:
        """Where ``uuid``'s encoder output lives."""
        name = self.name(uuid)
        return self.root / name[:2] / f"{name}.safetensors"

    def load(self, uuid: str) -> bytes | None:
        """The checked safetensors bytes of ``uuid``'s file (a hit), or None (a miss; a bad file is moved aside and
        counted)."""
        if not eligible(uuid):
            return None
        path = self.path(uuid)
        if not path.exists() and not self._fetch(uuid):
            self.count(misses=1)
            return None
        blob = read_file(path, uuid, self.fingerprint)
        if blob is None:
            self._quarantine(path)
            self.count(corrupt=1, misses=1)
            return None
        with self._lock:
            self._touched[self.name(uuid)] = time.time()
        self.count(hits=1)
        return blob

    def _object(self, uuid: str) -> str:
        name = self.name(uuid)
        return f"{DIRNAME}/{name[:2]}/{name}.safetensors"

    def _fetch(self, uuid: str) -> bool:
        """Bring ``uuid``'s file from the bucket (checked) into this folder; False when it is not to be had."""
        if self.shared is None:
            return False
        try:
            blob = self.shared.get(self._object(uuid))
        except Exception:  # noqa: BLE001 - the bucket away is a miss: vLLM encodes
            return False
        if blob is None:
            return False
        if check_blob(blob, uuid, self.fingerprint) is None:
            self.count(corrupt=1)
            self._unshare(uuid)
            return False
        self._publish(uuid, bytes(blob))
        return True

    def _unshare(self, uuid: str) -> None:
        try:
            self.shared.delete(self._object(uuid))
        except Exception:  # noqa: BLE001 - best effort: a later save overwrites it
            pass

    def save(self, uuid: str, blob: bytes) -> bool:
        """Publish ``blob`` (:func:`serialize`'s file) for ``uuid`` atomically, in the codec's stored form, here and
        in the bucket (False: not eligible, or a whole file is already there)."""
        path = self.path(uuid)
        if not eligible(uuid) or read_file(path, uuid, self.fingerprint) is not None:
            return False
        stored = stored_form(blob)
        self._publish(uuid, stored)
        if self.shared is not None:
            try:
                self.shared.put(self._object(uuid), [stored])
            except Exception:  # noqa: BLE001 - the bucket away: this replica keeps it; another encodes once more
                pass
        self.count(saves=1)
        self.flush()  # a save is rare (it follows an encode): the quota then sees every recent use
        self.enforce_quota(keep=self.name(uuid))
        return True

    def _publish(self, uuid: str, blob: bytes) -> None:
        """Write the file atomically (temp, fsync, rename) and its index row."""
        path = self.path(uuid)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, temp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".safetensors")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(blob)
                f.flush()
                os.fsync(f.fileno())
            os.replace(temp, path)
        except BaseException:
            if os.path.exists(temp):
                os.unlink(temp)
            raise
        with self._write() as conn:
            conn.execute(
                "INSERT INTO entries (name, bytes, last_used) VALUES (?, ?, ?) "
                "ON CONFLICT (name) DO UPDATE SET bytes = excluded.bytes, last_used = excluded.last_used",
                (self.name(uuid), len(blob), time.time()),
            )

    def enforce_quota(self, *, keep: str = "") -> int:
        """Delete least recently used files (never ``keep``) until they and the external bytes fit ``max_bytes``;
        how many went."""
        if self.max_bytes <= 0:
            return 0
        evicted = 0
        with self._write() as conn:
            total = conn.execute("SELECT COALESCE(SUM(bytes), 0) FROM entries").fetchone()[0]
            total += conn.execute("SELECT COALESCE(SUM(bytes), 0) FROM external").fetchone()[0]
            rows = conn.execute("SELECT name, bytes FROM entries WHERE name != ? ORDER BY last_used", (keep,)).fetchall()
            for name, size in rows:
                if total <= self.max_bytes:
                    break
                self._remove(conn, name)
                total -= size
                evicted += 1
            if evicted:
                _bump(conn, evictions=evicted)
        return evicted

    def least_recently_used(self, limit: int, *, after: tuple[float, str] | None = None) -> list[tuple[str, int, float]]:
        """Up to ``limit`` files as (name, bytes, last used), least recently used first (ties by name),
        after ``(last_used, name)``."""
        self.flush()
        last, name = after if after is not None else (float("-inf"), "")
        return [(str(n), int(b), float(t)) for n, b, t in self._connection().execute(
            "SELECT name, bytes, last_used FROM entries WHERE last_used > ? OR (last_used = ? AND name > ?) "
            "ORDER BY last_used, name LIMIT ?", (last, last, name, int(limit)))]

    def evict(self, name: str) -> bool:
        """Delete one file by name and its index row (counted ``evictions``); True when it was indexed."""
        with self._write() as conn:
            gone = self._remove(conn, name)
            if gone:
                _bump(conn, evictions=1)
        return gone

    def _remove(self, conn: sqlite3.Connection, name: str) -> bool:
        """Drop one file and its index row inside the caller's transaction; True when the row was there."""
        gone = conn.execute("DELETE FROM entries WHERE name = ?", (name,)).rowcount > 0
        (self.root / name[:2] / f"{name}.safetensors").unlink(missing_ok=True)
        return gone

    def record_external_bytes(self, source: str, nbytes: int) -> None:
        """Record what ``source`` (refsight's packages) holds under the same quota."""
        with self._write() as conn:
            conn.execute(
                "INSERT INTO external (source, bytes, updated) VALUES (?, ?, ?) "
                "ON CONFLICT (source) DO UPDATE SET bytes = excluded.bytes, updated = excluded.updated",
                (source, int(nbytes), time.time()),
            )

    def _quarantine(self, path: Path) -> None:
        """Move a bad file aside (kept for a look, out of every lookup) and drop its index row."""
        try:
            os.replace(path, path.with_name(path.name + ".bad"))
        except OSError:
            pass
        with self._write() as conn:
            conn.execute("DELETE FROM entries WHERE name = ?", (path.name.removesuffix(".safetensors"),))

    # -- index and counters --------------------------------------------------------------
    def count(self, **amounts: int) -> None:
        """Add to the counters: buffered, written within :data:`FLUSH_INTERVAL_S` seconds."""
        with self._lock:
            for name, amount in amounts.items():
                self._counts[name] = self._counts.get(name, 0) + int(amount)
            due = time.monotonic() - self._flushed >= FLUSH_INTERVAL_S
        if due:
            self.flush()

    def flush(self) -> None:
        """Write the buffered counts and last uses now (one transaction)."""
        with self._lock:
            counts, touched, self._counts, self._touched = self._counts, self._touched, {}, {}
            self._flushed = time.monotonic()
        if not counts and not touched:
            return
        with self._write() as conn:
            _bump(conn, **counts)
            conn.executemany("UPDATE entries SET last_used = ? WHERE name = ?", [(t, n) for n, t in touched.items()])

    def total_bytes(self) -> int:
        """Bytes of every indexed file."""
        return int(self._connection().execute("SELECT COALESCE(SUM(bytes), 0) FROM entries").fetchone()[0])

    def _connection(self) -> sqlite3.Connection:
        pid, conn = getattr(self._local, "conn", (0, None))
        if conn is None or pid != os.getpid():  # one per thread; a forked child never reuses its parent's
            conn = _connect(self.root / "index.sqlite")
            self._local.conn = (os.getpid(), conn)
        return conn

    def _write(self) -> "_Transaction":
        return _Transaction(self._connection())


class _Transaction:
    """``BEGIN IMMEDIATE`` … ``COMMIT`` (rolled back on error): one writer at a time across processes."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def __enter__(self) -> sqlite3.Connection:
        self.conn.execute("BEGIN IMMEDIATE")
        return self.conn

    def __exit__(self, kind, value, traceback) -> None:
        self.conn.execute("COMMIT" if kind is None else "ROLLBACK")


def _connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(str(path), timeout=30.0, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: survives a crashed process; the files are fsynced
    conn.execute("PRAGMA busy_timeout=30000")
    return conn


def _bump(conn: sqlite3.Connection, **amounts: int) -> None:
    conn.executemany(
        "INSERT INTO counters (name, value) VALUES (?, ?) ON CONFLICT (name) DO UPDATE SET value = value + excluded.value",
        [(name, int(amount)) for name, amount in amounts.items() if amount],
    )


def read_counters(store_root: str | os.PathLike) -> dict[str, int] | None:
    """The connector's counters and bytes on disk for a refsight store, or None when no connector used it."""
    index = Path(store_root) / DIRNAME / "index.sqlite"
    if not index.is_file():
        return None
    # A plain connection that only reads: a read-only one cannot open a WAL database whose -shm is gone.
    conn = sqlite3.connect(str(index), timeout=30.0)
    try:
        values = {name: 0 for name in COUNTERS}
        values.update({str(k): int(v) for k, v in conn.execute("SELECT name, value FROM counters")})
        values["bytes"] = int(conn.execute("SELECT COALESCE(SUM(bytes), 0) FROM entries").fetchone()[0])
        return values
    except sqlite3.Error:
        return None
    finally:
        conn.close()
