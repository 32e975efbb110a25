"""Prefix states on two tiers: a memory LRU bounded by bytes, then safetensors files on disk.

A prefix state (see :mod:`refsight.backends.prefix`) is the language model's attention
state after the reference part of a prompt. It is *derived* data: it can always be
computed again from the references, so the disk tier is a bounded cache, not a record.

Layout::

    <store>/prefixes/ab/<key>.safetensors

Each file is the safetensors file below in the store's codec's stored form (compressed, or the
plain file when compression saves too little: :mod:`refsight.vllm_connector.refsight_codec`, whose own checks run
first), self-describing and checked on every read: the safetensors header holds
``refsight.prefix`` (key, format, token count, build time, the backend's metadata and the
tensor spec) and ``refsight.checksum``, the xxh3-128 of that JSON text followed by every
tensor byte. A file that is truncated, altered, or holds another key is *corrupt*:
:meth:`PrefixStore.get` deletes it and reports a miss, so the caller rebuilds the state
and a bad state is never served. Writes are atomic (temp file in the same directory,
fsync, rename); the disk tier is bounded by ``disk_bytes`` (least recently used files go
first; a hit refreshes the file's mtime, a file-system touch, never an SQL write).

With a bucket store, the bucket is a third tier, shared by every replica (``shared``): the same
bytes under ``prefixes/ab/<key>.safetensors``. A state one replica built is read by the others
(checked exactly as a file is, then kept on their own disk); a bad object is a miss and deleted; an
unreachable bucket is a miss (a state is never worth a failed request). Two replicas writing one
key write equivalent, self-checking objects: whichever lands last is as good. The bucket's prefix
states are bounded by the bucket's own lifecycle rules (docs/deployment.md), not by ``disk_bytes``.

This module knows nothing of backends: tensors are whatever the codec stores (torch
tensors; bytes-like values become one ``uint8`` tensor).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping

import xxhash

from ..package import canonical_json, tensor_spec
from ..vllm_connector.refsight_codec import CodecError, decompress, raw_size
from ..vllm_connector.refsight_objects import BucketUnavailable, ObjectStore
from . import _safetensors
from ._files import HEX_KEY, SAFETENSORS_SUFFIX, TEMP_PREFIX, staged

__all__ = ["PrefixStore", "StoredPrefix", "PREFIX_DIR", "DEFAULT_PREFIX_MEMORY_BYTES", "DEFAULT_PREFIX_DISK_BYTES"]

PREFIX_DIR = "prefixes"
DEFAULT_PREFIX_MEMORY_BYTES = 1024 * 1024 * 1024
DEFAULT_PREFIX_DISK_BYTES = 8 * 1024 * 1024 * 1024
#: The on-disk layout of a prefix file; a file of another format is treated as corrupt.
PREFIX_FILE_FORMAT = 1

_INFO = "refsight.prefix"
_CHECKSUM = "refsight.checksum"


@dataclass(frozen=True)
class StoredPrefix:
    """What the store keeps for one key: tensors and the JSON facts about them."""

    tensors: Mapping[str, Any]
    meta: Mapping[str, Any]
    tokens: int
    build_ms: float
    nbytes: int


def _check_key(key: object) -> str:
    # Keys become file names: only 64 lowercase hex characters may pass.
    if not isinstance(key, str) or not HEX_KEY.fullmatch(key):
        raise ValueError(f"a prefix key is 64 lowercase hex characters, not {key!r}")
    return key


class PrefixStore:
    """Prefix states by key: memory LRU (``memory_bytes``), then disk (``disk_bytes``) under ``root/prefixes``.

    ``on_corrupt(key, reason)`` is called for each corrupt file found (and deleted); ``shared`` is a
    bucket store's object store, the tier behind the disk. Thread-safe; several processes may share the directory.
    """

    def __init__(
        self, root: str | os.PathLike, *, memory_bytes: int = DEFAULT_PREFIX_MEMORY_BYTES,
        disk_bytes: int = DEFAULT_PREFIX_DISK_BYTES, on_corrupt: Any = None, shared: ObjectStore | None = None,
    ) -> None:
        self.root = Path(root) / PREFIX_DIR
        self.shared = shared
        self.memory_bytes = int(memory_bytes)
        self.disk_bytes = int(disk_bytes)
        self.on_corrupt = on_corrupt
        self._memory: OrderedDict[str, StoredPrefix] = OrderedDict()
        self._memory_used = 0
        self._lock = threading.Lock()

    # -- paths -------------------------------------------------------------------------
    def path_for(self, key: str) -> Path:
        """Where the file of ``key`` lives (256 shards)."""
        _check_key(key)
        return self.root / key[:2] / f"{key}{SAFETENSORS_SUFFIX}"

    # -- memory tier --------------------------------------------------------------------
    @property
    def memory_used(self) -> int:
        """Tensor bytes held in memory (always ≤ ``memory_bytes``)."""
        return self._memory_used

    def _remember(self, key: str, entry: StoredPrefix) -> None:
        with self._lock:
            old = self._memory.pop(key, None)
            if old is not None:
                self._memory_used -= old.nbytes
            if entry.nbytes > self.memory_bytes:
                return  # larger than the whole budget: disk only
            while self._memory and self._memory_used + entry.nbytes > self.memory_bytes:
                _, victim = self._memory.popitem(last=False)
                self._memory_used -= victim.nbytes
            self._memory[key] = entry
            self._memory_used += entry.nbytes

    def _forget(self, key: str) -> None:
        with self._lock:
            old = self._memory.pop(key, None)
            if old is not None:
                self._memory_used -= old.nbytes

    # -- reads -------------------------------------------------------------------------
    def get(self, key: str) -> StoredPrefix | None:
        """The state under ``key`` (memory, else disk, checked and promoted); None when absent or corrupt."""
        _check_key(key)
        with self._lock:
            entry = self._memory.get(key)
            if entry is not None:
                self._memory.move_to_end(key)
                return entry
        entry = self._read(key)
        if entry is None and self.shared is not None:
            entry = self._fetch(key)
        if entry is not None:
            self._remember(key, entry)
        return entry

    def _object(self, key: str) -> str:
        return f"{PREFIX_DIR}/{key[:2]}/{key}{SAFETENSORS_SUFFIX}"

    def _fetch(self, key: str) -> StoredPrefix | None:
        """The state from the bucket, checked, then kept on this disk too; None when absent, bad or unreachable."""
        try:
            buf = self.shared.get(self._object(key))
        except BucketUnavailable:
            return None
        if buf is None:
            return None
        try:
            entry = _parse(key, decompress(memoryview(buf)))
        except (CodecError, _Corrupt) as exc:
            self._unshare(key)
            if self.on_corrupt is not None:
                self.on_corrupt(key, f"bucket object: {exc}")
            return None
        with staged(self.path_for(key), [buf], what=f"prefix state {key}") as file:
            file.publish()
        self._enforce_disk_budget(keep=self.path_for(key))
        return entry

    def _unshare(self, key: str) -> None:
        try:
            self.shared.delete(self._object(key))
        except BucketUnavailable:
            pass

    def contains(self, key: str) -> bool:
        """Whether ``key`` is in memory or on disk (the file is not read)."""
        return key in self._memory or self.path_for(key).is_file()

    def _read(self, key: str) -> StoredPrefix | None:
        path = self.path_for(key)
        try:
            stat = path.stat()
            buf = _safetensors.read_buffer(path, stat.st_size)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            self._corrupt(key, path, stat.st_ino if "stat" in locals() else None, f"cannot read: {exc}")
            return None
        try:
            entry = _parse(key, decompress(buf))
        except CodecError as exc:
            self._corrupt(key, path, stat.st_ino, f"unreadable file: {exc}")
            return None
        except _Corrupt as exc:
            self._corrupt(key, path, stat.st_ino, str(exc))
            return None
        try:
            os.utime(path)  # least recently *used* goes first when the disk tier is full
        except OSError:
            pass
        return entry

    def _corrupt(self, key: str, path: Path, inode: int | None, reason: str) -> None:
        # Delete only the file we judged: a writer may have renamed a good one over it meanwhile.
        try:
            if inode is None or path.stat().st_ino == inode:
                path.unlink()
        except OSError:
            pass
        if self.on_corrupt is not None:
            self.on_corrupt(key, reason)

    # -- writes ------------------------------------------------------------------------
    def put(self, key: str, tensors: Mapping[str, Any], *, meta: Mapping[str, Any], tokens: int, build_ms: float) -> int:
        """Keep a state in memory and on disk (atomic); returns the file's size (compressed)."""
        _check_key(key)
        prepared = _safetensors.prepare(dict(tensors))
        nbytes = sum(t.numel() * t.element_size() for _, t in prepared)
        info = {
            "key": key,
            "format": PREFIX_FILE_FORMAT,
            "tokens": int(tokens),
            "build_ms": float(build_ms),
            "meta": json.loads(canonical_json(dict(meta))),
            "spec": tensor_spec(dict(prepared)),
            "created_at": time.time(),
        }
        info_text = canonical_json(info)
        data = _safetensors.encode(prepared, {})[1:]  # the tensor bytes, as views (no copy)
        hasher = xxhash.xxh3_128(info_text.encode())
        for chunk in data:
            hasher.update(chunk)
        stored = _safetensors.compress_file(prepared, {_INFO: info_text, _CHECKSUM: hasher.hexdigest()})
        final = self.path_for(key)
        # The store's one publish path; no row to record: the file checks itself on every read.
        with staged(final, stored.chunks, what=f"prefix state {key}") as file:
            file.publish()
        size = file.size
        if self.shared is not None:
            try:  # the same bytes, for every other replica
                self.shared.put(self._object(key), stored.chunks)
            except BucketUnavailable:
                pass  # derived data: the next replica that misses builds it again
        self._remember(key, StoredPrefix(dict(prepared), info["meta"], info["tokens"], info["build_ms"], nbytes))
        self._enforce_disk_budget(keep=final)
        return size

    def delete(self, key: str) -> bool:
        """Drop ``key`` from memory and disk; True when a file was removed."""
        self._forget(key)
        if self.shared is not None:
            self._unshare(key)
        try:
            self.path_for(key).unlink()
        except FileNotFoundError:
            return False
        return True

    def clear_memory(self) -> None:
        """Drop the memory tier."""
        with self._lock:
            self._memory.clear()
            self._memory_used = 0

    # -- accounting --------------------------------------------------------------------
    def _files(self) -> Iterator[tuple[Path, os.stat_result]]:
        if not self.root.is_dir():
            return
        for path in self.root.glob(f"*/*{SAFETENSORS_SUFFIX}"):
            if path.name.startswith(TEMP_PREFIX):
                continue
            try:
                yield path, path.stat()
            except FileNotFoundError:
                continue

    def stats(self) -> dict[str, int]:
        """``{"prefixes": files on disk, "bytes": their total size, "raw_bytes": the same before compression,
        "memory_bytes": held in memory}``."""
        count = total = raw = 0
        for path, stat in self._files():
            count += 1
            total += stat.st_size
            raw += _raw_size(path, stat.st_size)
        return {"prefixes": count, "bytes": total, "raw_bytes": raw, "memory_bytes": self._memory_used}

    def _enforce_disk_budget(self, keep: Path) -> None:
        files = sorted(self._files(), key=lambda item: item[1].st_mtime)
        total = sum(stat.st_size for _, stat in files)
        for path, stat in files:
            if total <= self.disk_bytes:
                break
            if path == keep:
                continue
            try:
                path.unlink()
                self._forget(path.name[: -len(SAFETENSORS_SUFFIX)])
                total -= stat.st_size
            except FileNotFoundError:
                continue

    def gc(self, *, temp_age_s: float = 3600.0) -> int:
        """Remove temp files of killed writers older than ``temp_age_s``; returns how many."""
        removed = 0
        if not self.root.is_dir():
            return 0
        now = time.time()
        for path in self.root.glob(f"*/{TEMP_PREFIX}*"):
            try:
                if now - path.stat().st_mtime >= temp_age_s:
                    path.unlink()
                    removed += 1
            except FileNotFoundError:
                pass
        return removed


class _Corrupt(Exception):
    pass


def _raw_size(path: Path, size: int) -> int:
    # What the codec's fixed header says (16 bytes read, nothing checked: a statistic); a raw file: its size.
    try:
        with open(path, "rb") as f:
            return raw_size(f.read(16), size)
    except OSError:
        return size  # removed meanwhile


def _parse(key: str, buf: memoryview) -> StoredPrefix:
    """Decode and check one file's bytes; raises :class:`_Corrupt` with the reason."""
    try:
        tensors, metadata = _safetensors.decode(buf)
        info_text = metadata[_INFO]
        stored_checksum = metadata[_CHECKSUM]
        info = json.loads(info_text)
    except (_safetensors.SafetensorsFormatError, KeyError, TypeError, ValueError) as exc:
        raise _Corrupt(f"unreadable file: {exc}") from None
    header_len = int.from_bytes(buf[:8], "little")
    hasher = xxhash.xxh3_128(info_text.encode())
    hasher.update(buf[8 + header_len:])
    if hasher.hexdigest() != stored_checksum:
        raise _Corrupt("checksum mismatch")
    if not isinstance(info, dict) or info.get("key") != key or info.get("format") != PREFIX_FILE_FORMAT:
        raise _Corrupt("the file holds another key or format")
    if tensor_spec(tensors) != info.get("spec"):
        raise _Corrupt("tensor names, dtypes or shapes differ from the header")
    nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
    return StoredPrefix(tensors, info.get("meta") or {}, int(info.get("tokens", 0)), float(info.get("build_ms", 0.0)), nbytes)
