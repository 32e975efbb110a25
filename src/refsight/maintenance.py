"""Keeping a store healthy: verify and repair packages, re-encode for another model, statistics, gc.

Everything here is maintenance a user or operator asks for (``refsight verify``,
``reencode``, ``stats``, ``gc``); nothing runs on the request path.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

from .backends.base import Backend
from .drift import DEFAULT_THRESHOLD, DriftReport, check_drift
from .errors import RefsightError
from .packages import PackageCache
from .references import ReferenceBook
from .results import AddResult, StoreStats, VerifyReport
from .store import Store

__all__ = ["Maintenance"]


class Maintenance:
    """Verify, repair, re-encode and report on one store."""

    def __init__(
        self,
        store: Store,
        packages: PackageCache,
        references: ReferenceBook,
        progress: Callable[[int, str], AbstractContextManager[Any]],
    ) -> None:
        self.store = store
        self.packages = packages
        self.references = references
        self._progress = progress

    def verify(self, *, repair: bool, backend: Callable[[], Backend]) -> VerifyReport:
        """Check every package (checksum, shapes, dtypes); with ``repair``, re-encode corrupt ones.

        ``backend()`` gives the model repairs use (loaded only when a repair is needed); a
        corrupt package made by another model is reported as unrepairable with the reason,
        and is never served.
        """
        report = VerifyReport()
        for key, problem in self.store.local.verify_all():
            report.checked += 1
            if problem is None:
                continue
            report.corrupt.append(key)
            if repair:
                reason = self._repair(key, backend())
                if reason is None:
                    report.repaired.append(key)
                else:
                    report.unrepairable[key] = reason
        self._check_images(report)
        return report

    def _check_images(self, report: VerifyReport) -> None:
        # A reference without its kept bytes could never be re-encoded: each image read (and
        # its checksum checked) once, however many references share it.
        problems: dict[str, str | None] = {}
        for namespace in self.store.catalog.namespaces():
            for ref in self.store.catalog.list_references(namespace=namespace):
                if ref.image_sha256 not in problems:
                    try:
                        self.store.catalog.get_image(ref.image_sha256)
                        problems[ref.image_sha256] = None
                    except RefsightError as e:
                        problems[ref.image_sha256] = str(e)
                if problems[ref.image_sha256] is not None:
                    report.missing_images[f"{namespace}/{ref.ref_id}"] = problems[ref.image_sha256]

    def _repair(self, key: str, backend: Backend) -> str | None:
        record = self.store.local.record(key)
        if record is None:
            return None  # removed meanwhile: nothing corrupt is left
        if record.fingerprint_digest != backend.fingerprint().digest:
            return f"made by another encoder ({record.fingerprint.model_id}); repair it with that model"
        try:
            self.packages.rebuild(backend, record.image_sha256, scope=record.scope)
        except RefsightError as e:
            return f"cannot re-encode it: {e}"
        return None

    def reencode(self, *, backend: Backend, namespace: str, scope: str | None) -> Iterator[AddResult]:
        """Make sure every reference of ``namespace`` has a durable package for ``backend``."""
        refs = self.references.list(namespace=namespace)
        with self._progress(len(refs), f"encoding for {backend.name}") as bar:
            for ref in refs:
                found = self.packages.reference(backend, ref, scope=scope)
                package = found.package
                yield AddResult(
                    ref.ref_id, ref.image_sha256, package.key, backend.name, found.cached,
                    round(found.encode_ms, 3), package.nbytes,
                )
                bar.update(1)

    def stats(self, *, namespace: str | None, tenant_view: bool = False) -> StoreStats:
        """Statistics of the store; ``tenant_view`` counts only the namespace's packages and hides the counters.

        ``namespace=None`` counts the references of every namespace.
        """
        if tenant_view and namespace is not None:
            refs = self.references.list(namespace=namespace)
            records = [self.store.local.record(k) for k in {k for ref in refs for k in ref.packages.values()}]
            return StoreStats(
                references=len(refs),
                packages=sum(r is not None for r in records),
                bytes=sum(r.bytes for r in records if r is not None),
                hits=None, misses=None, evictions=None, encode_ms_saved=None,
                scope="namespace",
            )
        self.store.counters.flush()  # so the figures include this process's latest counts
        counters = self.store.catalog.counters()
        local = self.store.local.stats()
        return StoreStats(
            references=self.store.catalog.count_references(namespace=namespace),
            packages=local["packages"],
            bytes=local["bytes"],
            hits=int(counters.get("hits", 0)),
            misses=int(counters.get("misses", 0)),
            evictions=int(counters.get("evictions", 0)),
            encode_ms_saved=round(float(counters.get("encode_ms_saved", 0.0)), 3),
            memory_bytes=self.store.memory.nbytes,
            replica=self.store.counters.totals()
            | {f"{tier}_hits": n for tier, n in getattr(self.store.packages, "tier_hits", {}).items()},
        )

    def drift(
        self, backend: Backend, *, namespace: str, scope: str | None, sample: int, seed: int, threshold: float | None
    ) -> DriftReport:
        """``refsight verify --fresh``: stored features against a fresh encode of a random sample."""
        return check_drift(
            self.store, backend, self.references.list(namespace=namespace), sample=sample, seed=seed,
            threshold=DEFAULT_THRESHOLD if threshold is None else threshold, scope=scope,
        )

    def gc(self, **options: Any) -> dict[str, int]:
        """Remove what interrupted writes left (see :meth:`refsight.store.Store.gc`); counts by kind."""
        return self.store.gc(**options)
