"""Keeping a store healthy: verify and repair packages, re-encode for another model, statistics,
prune, gc.

Everything here is maintenance a user or operator asks for (``refsight verify``,
``reencode``, ``stats``, ``prune``, ``gc``); nothing runs on the request path.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any

from ..backends.base import Backend
from ..context import RequestContext
from .drift import DEFAULT_THRESHOLD, DriftReport, check_drift
from ..errors import InvalidInputError, RefsightError
from ..cache.packages import MODEL_COUNTER_PREFIX, PackageCache
from ..references import ReferenceBook
from ..results import AddResult, ForgetReport, PruneReport, StoreStats, VerifyReport
from ..store import RememberedImage, Store

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
        with self._progress(self.store.local.stats()["packages"], "verifying") as bar:
            for key, problem in self.store.local.verify_all():
                report.checked += 1
                bar.update(1)
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

    def reencode(self, context: RequestContext) -> Iterator[AddResult]:
        """Make sure every reference of the context's namespace has a durable package for its model."""
        backend, refs = context.backend(), self.references.list(namespace=context.namespace)
        with self._progress(len(refs), f"encoding for {backend.name}") as bar:
            for ref in refs:
                found = self.packages.reference(context, ref)
                package = found.package
                yield AddResult(
                    ref.ref_id, ref.image_sha256, package.key, backend.name, found.cached,
                    round(found.encode_ms, 3), package.nbytes,
                )
                bar.update(1)

    def stats(self, *, namespace: str | None, tenant_view: bool = False, backends: Sequence[Backend] = ()) -> StoreStats:
        """Statistics of the store; ``tenant_view`` counts only the namespace's packages and hides the counters.

        ``namespace=None`` counts the references of every namespace. ``backends`` (those already
        loaded; none is loaded for this) that keep a prefix cache of their own (a vLLM server's
        automatic prefix caching: ``prefix_cache_stats()``) report it in ``runtime_prefix_cache``.
        """
        if tenant_view and namespace is not None:
            return self._namespace_stats(namespace)
        self.store.counters.flush()  # so the figures include this process's latest counts
        tiers = self.store.packages.tier_stats()
        counters = self.store.catalog.counters()
        local = self.store.local.stats()
        prefixes = self.store.prefixes.stats()
        remembered, remembered_bytes = self.store.remembered.totals()
        return StoreStats(
            references=self.store.catalog.count_references(namespace=namespace),
            packages=local["packages"],
            bytes=local["bytes"],
            raw_bytes=local["raw_bytes"],
            **{name: int(counters.get(name, 0)) for name in _COUNTS},
            **{name: round(float(counters.get(name, 0.0)), 3) for name in _MILLISECONDS},
            memory_bytes=self.store.memory.nbytes,
            max_package_bytes=self.store.max_package_bytes,
            tiers=tiers,
            replica={k: v for k, v in self.store.counters.totals().items() if not k.startswith(MODEL_COUNTER_PREFIX)}
            | {f"{tier}_hits": c["hits"] for tier, c in tiers.items()},
            models=self._per_model(counters),
            prefix_bytes=prefixes["bytes"],
            prefix_raw_bytes=prefixes["raw_bytes"],
            runtime_prefix_cache=_runtime_prefix_caches(backends),
            vllm_encoder_cache=_vllm_encoder_cache(self.store.root),
            remembered=remembered,
            remembered_bytes=remembered_bytes,
        )

    def _namespace_stats(self, namespace: str) -> StoreStats:
        """A tenant's view: its references and the packages they use, what it remembered; no store-wide counters."""
        refs = self.references.list(namespace=namespace)
        records = [self.store.local.record(k) for k in {k for ref in refs for k in ref.packages.values()}]
        remembered, remembered_bytes = self.store.remembered.totals(namespace=namespace)
        return StoreStats(
            references=len(refs),
            packages=sum(r is not None for r in records),
            bytes=sum(r.bytes for r in records if r is not None),
            raw_bytes=sum(r.raw_bytes for r in records if r is not None),
            hits=None, misses=None, evictions=None, encode_ms_saved=None,
            scope="namespace", remembered=remembered, remembered_bytes=remembered_bytes,
        )

    def _per_model(self, counters: dict[str, float]) -> list[dict[str, Any]]:
        """Hits, the encode time they avoided and the load time they cost, per model (from the per-model counters)."""
        names = {u.fingerprint_digest[:16]: (u.model_id or u.backend) for u in self.store.local.fingerprint_usage()}
        figures: dict[str, dict[str, float]] = {}
        for name, value in counters.items():
            found = _MODEL_COUNTER.fullmatch(name)
            if found:
                figures.setdefault(found[1], {})[found[2]] = value
        return [
            {"model": names.get(digest, digest), "fingerprint": digest, "hits": int(f.get("hits", 0)),
             "encode_ms_saved": round(f.get("encode_ms", 0.0), 3), "load_ms": round(f.get("load_ms", 0.0), 3)}
            for digest, f in sorted(figures.items(), key=lambda item: -item[1].get("hits", 0))
        ]

    def drift(self, context: RequestContext, *, sample: int, seed: int, threshold: float | None) -> DriftReport:
        """``refsight verify --fresh``: stored features against a fresh encode of a random sample."""
        return check_drift(
            self.store, context.backend(), self.references.list(namespace=context.namespace), sample=sample, seed=seed,
            threshold=DEFAULT_THRESHOLD if threshold is None else threshold, scope=context.scope,
        )

    def prune(
        self, *, fingerprints: Sequence[str], models: Sequence[str], dry_run: bool, backend: Callable[[str], Backend]
    ) -> PruneReport:
        """``refsight prune``: drop the packages of fingerprint digests and of models (by name).

        A model matches the fingerprints whose ``model_id`` (or backend name) is the name; when
        none does and the name is a registered model, ``backend(name)`` gives its fingerprint's
        model id. With neither given, a dry run lists every fingerprint the store holds.
        """
        usage = self.store.local.fingerprint_usage()
        digests = list(fingerprints)
        for digest in digests:
            if not isinstance(digest, str) or len(digest) != 64 or digest.strip("0123456789abcdef"):
                raise InvalidInputError(f"fingerprint {digest!r}", "a fingerprint digest is 64 lowercase hex characters")
        for model in models:
            digests += _model_digests(model, usage, backend)
        if not digests:
            if fingerprints or models:  # named, but nothing in the store: an empty report, not an error
                return PruneReport(fingerprints=[], packages=0, bytes=0, links=0, dry_run=dry_run)
            return PruneReport(fingerprints=[u._asdict() for u in usage], packages=0, bytes=0, links=0, dry_run=True)
        return self.store.prune(digests, dry_run=dry_run)

    def remembered(self, *, namespace: str | None) -> list[RememberedImage]:
        """The remembered images of ``namespace`` (None: every namespace), most recently used first."""
        return self.store.remembered.list(namespace=namespace)

    def forget_remembered(self, *, namespace: str | None, dry_run: bool) -> ForgetReport:
        """``refsight prune --remembered``: forget the remembered images of ``namespace`` (None: every namespace);
        their packages go from every tier unless a reference links them or another namespace remembers them.
        ``dry_run`` lists them only."""
        images = self.store.remembered.list(namespace=namespace)
        if dry_run:
            return ForgetReport(images=[i.to_dict() for i in images], packages=0, bytes=0, dry_run=True)
        _, unused = self.store.remembered.forget(namespace=namespace, keys=[i.package_key for i in images])
        sizes = {i.package_key: i.bytes for i in images}
        deleted = [key for key in unused if self.store.packages.delete(key)]
        if deleted:
            self.store.counters.add(pruned=len(deleted))
        return ForgetReport(
            images=[i.to_dict() for i in images], packages=len(deleted), bytes=sum(sizes[k] for k in deleted), dry_run=False,
        )

    def gc(self, **options: Any) -> dict[str, int]:
        """Remove what interrupted writes left (see :meth:`refsight.store.Store.gc`); counts by kind."""
        return self.store.gc(**options)


def _model_digests(model: str, usage: Sequence[Any], backend: Callable[[str], Backend]) -> list[str]:
    """The fingerprint digests of ``model`` in the store: by model id or backend name, else (a registered
    model) by the model id of its loaded fingerprint."""
    found = [u.fingerprint_digest for u in usage if model in (u.model_id, u.backend)]
    if found:
        return found
    from ..backends.registry import available_models

    if model not in available_models():
        return []
    model_id = backend(model).fingerprint().model_id
    return [u.fingerprint_digest for u in usage if u.model_id == model_id]


#: The store's counters a StoreStats reports as whole counts, and those it reports as milliseconds (3 decimals).
_COUNTS = ("hits", "misses", "evictions", "quota_evictions", "quota_evicted_bytes", "pruned", "prefix_hits",
           "prefix_misses", "prefix_tokens_reused", "corrupt", "prefix_corrupt")
_MILLISECONDS = ("encode_ms_saved", "load_ms", "prefix_ms_saved")
_MODEL_COUNTER = re.compile(re.escape(MODEL_COUNTER_PREFIX) + r"([0-9a-f]{16})_(hits|encode_ms|load_ms)")


def _vllm_encoder_cache(root: Any) -> dict[str, int] | None:
    """The vLLM encoder-cache connector's counters in this store (its own index file; stdlib only)."""
    from ..vllm_connector.refsight_ec_store import read_counters

    return read_counters(root)


def _runtime_prefix_caches(backends: Sequence[Backend]) -> dict[str, dict[str, float]] | None:
    """backend name → its runtime's own prefix-cache figures (queries, hits, hit rate), for those that report one."""
    out: dict[str, dict[str, float]] = {}
    for backend in backends:
        report = getattr(backend, "prefix_cache_stats", None)
        if report is None:
            continue
        try:
            out[backend.name] = report()
        except RefsightError as e:  # a server gone away must not fail `stats`
            out[backend.name] = {"error": str(e)}  # type: ignore[dict-item]
    return out or None
