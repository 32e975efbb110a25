"""vLLM's encoder outputs in a store, as the store's byte quota sees them.

refsight's encoder-cache connector (:mod:`refsight.vllm_connector`) runs inside a vLLM server and
keeps vLLM's encoder outputs of references under ``<store>/vllm-encoder/``, with an index of its
own (:class:`~refsight.vllm_connector.refsight_ec_store.ECStore`, standard library only). The
store has ONE byte quota over its packages and those files:

- refsight's quota pass (:func:`refsight.store.lifecycle.enforce_quota`) counts both and evicts
  across both in one least-recently-used order;
- at each of its quota checks refsight writes its packages' bytes into the connector's index,
  so a save inside vLLM counts them too (the connector can only evict its own files).
"""

from __future__ import annotations

from pathlib import Path

from ..vllm_connector.refsight_ec_store import DIRNAME, ECStore
from .base import PackageUsage

__all__ = ["EncoderOutputs"]

#: What refsight's packages are called in the connector's index (its ``external`` table).
PACKAGES_SOURCE = "refsight-packages"


class EncoderOutputs:
    """The connector's files of one store: their bytes, least recently used order and eviction."""

    def __init__(self, files: ECStore) -> None:
        self._files = files

    @classmethod
    def of(cls, root: Path) -> EncoderOutputs | None:
        """The encoder outputs of the store at ``root``; None when no connector ever used it (nothing is created)."""
        folder = Path(root) / DIRNAME
        if not (folder / "index.sqlite").is_file():
            return None
        return cls(ECStore(folder, ""))  # housekeeping by file name: no fingerprint needed

    def total_bytes(self) -> int:
        """Bytes of every indexed encoder output."""
        return self._files.total_bytes()

    def least_recently_used(self, limit: int, *, after: tuple[float, str] | None = None) -> list[PackageUsage]:
        """Up to ``limit`` files, least recently used first, as the quota pass reads packages (key = file name)."""
        return [PackageUsage(name, size, used, "") for name, size, used in self._files.least_recently_used(limit, after=after)]

    def delete(self, name: str) -> bool:
        """Evict one file (the connector counts it among its evictions); True when it was there."""
        return self._files.evict(name)

    def record_packages(self, nbytes: int) -> None:
        """Tell the connector what the store's packages hold, for its own quota checks."""
        self._files.record_external_bytes(PACKAGES_SOURCE, nbytes)
