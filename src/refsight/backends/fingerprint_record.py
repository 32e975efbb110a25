"""Encoder fingerprints recorded when a model loads, read back without loading it.

A package key needs the encoder's fingerprint, which a backend computes from the loaded
model (processor settings, dtype, attention kernels, the weights' revision). Loading a VLM
takes seconds; a command that only links a stored package (a cached ``refsight add``) should
not pay for it. So each load records, in ``<hash memo dir>/fingerprints.json`` (beside the
checkpoint-hash memo, :func:`refsight.support.environment.hash_memo_dir`), the backend's fingerprint and
batch size under :func:`record_key` — the model name, its options, the versions of refsight
and of the model runtimes, the host and the device-selecting environment — together with
the stamp ``(size, mtime_ns, inode)`` of every file and directory the backend names in
:meth:`~refsight.backends.base.Backend.fingerprint_sources`.

:func:`recorded` gives that fingerprint back only while every stamp still matches: weights
rewritten, replaced, touched or moved, or a file added to the model's directory, and the
record is not used (the model loads and records again). A backend whose fingerprint is not
a matter of local files (a hub branch that may move, a server) names no sources and is
never recorded. The record is read only where no model runs; every encode and comparison
uses the loaded backend's own fingerprint, so a record can cost a link, never a wrong feature.
"""

from __future__ import annotations

import hashlib
import os
import platform
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from ..errors import RefsightError
from ..support.json_memo import read_entries, write_entry
from ..package import EncoderFingerprint, canonical_json
from ..version import __version__

if TYPE_CHECKING:  # pragma: no cover
    from .base import Backend

__all__ = ["EncoderFacts", "facts_of", "record", "recorded", "record_key", "records_path", "RECORD_VERSION"]

#: Bump when what a backend's fingerprint depends on changes in ways the key below cannot see.
RECORD_VERSION = 1
_RECORDS_NAME = "fingerprints.json"
#: Distributions whose version can change a fingerprint (processor classes, kernels, the llama.cpp build).
_RUNTIMES = ("transformers", "torch", "torchvision", "llama_cpp_python", "vllm")
#: Environment variables that choose the device a model loads on (and so its dtype and kernels).
_DEVICE_ENV = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "PYTORCH_ENABLE_MPS_FALLBACK")


@dataclass(frozen=True)
class EncoderFacts:
    """What linking a stored package needs from a model: its fingerprint, batch size and backend name."""

    fingerprint: EncoderFingerprint
    batch_size: int
    name: str


def facts_of(backend: Backend) -> EncoderFacts:
    """A loaded backend's facts (exact: computed by the backend itself)."""
    return EncoderFacts(backend.fingerprint(), max(1, int(backend.batch_size)), backend.name)


def records_path() -> Path:
    """``$REFSIGHT_HASH_MEMO_DIR/fingerprints.json``, else ``<model cache>/fingerprints.json``."""
    from ..support.environment import hash_memo_dir

    return hash_memo_dir() / _RECORDS_NAME


def _installed(distribution: str) -> str | None:
    try:
        return version(distribution)
    except PackageNotFoundError:
        return None


def record_key(model: str, options: Mapping[str, Any]) -> str:
    """sha256 over everything besides the model's files that a fingerprint may depend on."""
    context = {
        "record_version": RECORD_VERSION, "model": model, "options": dict(options), "refsight": __version__,
        "runtimes": {name: _installed(name) for name in _RUNTIMES},
        # A model cache shared by hosts (a network home) must not hand a CPU host a GPU host's dtype.
        "host": platform.node(), "env": {name: os.environ.get(name) for name in _DEVICE_ENV},
    }
    return hashlib.sha256(canonical_json(context).encode()).hexdigest()


def _stamp(path: str) -> list[int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns, st.st_ino]


def _unchanged(files: Any) -> bool:
    """Every recorded path still has its recorded stamp."""
    return isinstance(files, dict) and bool(files) and all(_stamp(path) == stamp for path, stamp in files.items())


def recorded(model: str, options: Mapping[str, Any]) -> EncoderFacts | None:
    """The facts recorded at ``model``'s last load with ``options``, while its files are unchanged; else None."""
    entry = read_entries(records_path(), RECORD_VERSION).get(record_key(model, options))
    if not isinstance(entry, dict) or not _unchanged(entry.get("files")):
        return None
    try:
        return EncoderFacts(EncoderFingerprint.from_json(entry["fingerprint"]), int(entry["batch_size"]), str(entry["name"]))
    except (KeyError, TypeError, ValueError, RefsightError):  # a damaged record only costs a load
        return None


def record(model: str, options: Mapping[str, Any], backend: Backend) -> None:
    """Record a loaded backend's facts (nothing when it names no sources, or the record already holds them)."""
    sources = backend.fingerprint_sources()
    if not sources:
        return
    files = {str(Path(p).resolve()): _stamp(str(Path(p).resolve())) for p in sources}
    if any(stamp is None for stamp in files.values()):
        return  # a source vanished under the load: nothing sound to record
    facts = facts_of(backend)
    entry = {"fingerprint": facts.fingerprint.to_json(), "batch_size": facts.batch_size, "name": facts.name, "files": files}
    path, key = records_path(), record_key(model, options)
    if read_entries(path, RECORD_VERSION).get(key) == entry:
        return  # every load after the first: nothing to write
    write_entry(path, RECORD_VERSION, key, entry, keep=lambda _, old: _unchanged(old.get("files")))
