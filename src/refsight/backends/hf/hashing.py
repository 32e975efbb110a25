"""sha256 of checkpoint files, memoised across processes.

Hashing a multi-gigabyte checkpoint takes tens of seconds, and every process that
loads a model from a local directory needs the hash (it names the revision in the
package keys). So each file's digest is kept in a small JSON memo keyed by what
changes when the file does: (path, size, mtime_ns, inode). Only the first process
ever reads a checkpoint through; the others stat its files and hit the memo. A
rewritten or merely touched file has a new mtime, so it is hashed again.

The memo lives in ``$REFSIGHT_HASH_MEMO_DIR``, else the model cache directory
(:func:`refsight.support.environment.hash_memo_dir`), as ``file-hashes.json``. It is
rewritten atomically (temp file + ``os.replace``) under a file lock, merging with
what other processes wrote meanwhile. A memo that cannot be read or written only
costs time: hashing never fails because of it.

:data:`memo_hits` and :data:`files_hashed` count, per process, digests served from
the memo and files actually read, so tests can prove which happened.
"""

from __future__ import annotations

import hashlib
import os
import sys
import threading
from pathlib import Path

from ...support.json_memo import read_entries, write_entry

__all__ = ["file_sha256", "memo_path", "memo_hits", "files_hashed", "PROGRESS_MIN_BYTES"]

#: Files at least this large show a tqdm progress bar on stderr while they are hashed.
PROGRESS_MIN_BYTES = 256 * 1024 * 1024
_MEMO_NAME = "file-hashes.json"
_MEMO_VERSION = 1
_BLOCK = 1 << 22

#: Digests served from the memo (in-process or on disk) in this process.
memo_hits = 0
#: Files read and hashed in this process.
files_hashed = 0

_lock = threading.Lock()
_memory: dict[str, dict] = {}


def memo_path() -> Path:
    """The memo file: ``$REFSIGHT_HASH_MEMO_DIR/file-hashes.json`` or ``<model cache>/file-hashes.json``."""
    from ...support.environment import hash_memo_dir

    return hash_memo_dir() / _MEMO_NAME


def _stamp(path: Path) -> dict:
    st = path.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "inode": st.st_ino}


def _read(memo: Path) -> dict[str, dict]:
    return read_entries(memo, _MEMO_VERSION)


def _write(memo: Path, key: str, entry: dict) -> None:
    """Add one entry, merging with the file as it is now (other processes may have added theirs)."""
    # Forget files that are gone, so the memo does not grow without bound.
    write_entry(memo, _MEMO_VERSION, key, entry, keep=lambda path, _: os.path.exists(path))


def file_sha256(path: str | os.PathLike) -> str:
    """sha256 hex of one file's bytes, from the memo when (path, size, mtime_ns, inode) still match."""
    global memo_hits, files_hashed

    path = Path(path).resolve()
    key = str(path)
    stamp = _stamp(path)
    with _lock:
        entry = _memory.get(key)
        if entry is None or {k: entry.get(k) for k in stamp} != stamp:
            entry = _read(memo_path()).get(key)
        if isinstance(entry, dict) and {k: entry.get(k) for k in stamp} == stamp and isinstance(entry.get("sha256"), str):
            _memory[key] = entry
            memo_hits += 1
            return entry["sha256"]
    digest = _hash(path, stamp["size"])
    if _stamp(path) != stamp:
        # Rewritten while we read it: the digest is of no version in particular; do not memoise.
        return digest
    entry = {**stamp, "sha256": digest}
    with _lock:
        files_hashed += 1
        _memory[key] = entry
    _write(memo_path(), key, entry)
    return digest


def _hash(path: Path, size: int) -> str:
    h = hashlib.sha256()
    bar = None
    if size >= PROGRESS_MIN_BYTES:
        from tqdm import tqdm

        # Only the first process that meets a large checkpoint pays for this; say so.
        bar = tqdm(total=size, unit="B", unit_scale=True, desc=f"hashing {path.name}", file=sys.stderr, leave=False)
    try:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(_BLOCK), b""):
                h.update(block)
                if bar is not None:
                    bar.update(len(block))
    finally:
        if bar is not None:
            bar.close()
    return h.hexdigest()
