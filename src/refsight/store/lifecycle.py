"""The store's lifecycle: a byte quota on packages and vLLM encoder outputs (least recently used first out)
and ``prune``.

Only derived data is ever dropped here: packages and vLLM's encoder outputs. References, their
metadata and their kept images are never touched: a package is re-encoded from the kept image
the next time it is needed (and linked again), an encoder output by vLLM from the pixels.
Everything goes through a :class:`~refsight.store.base.PackageIndex` and the catalog's
interface, so the embedded SQLite store and a shared catalog run the same code.

- **Quota** (``max_package_bytes``; ``--max-package-bytes`` or ``[store] max_package_bytes`` in
  ``refsight.toml``; it counts stored bytes, the files as the store's codec compressed them: a row's
  ``bytes``, not its ``raw_bytes``): after a durable write pushes the total over the quota, packages and the
  encoder outputs refsight's vLLM connector keeps in the same store
  (:mod:`refsight.store.encoder_outputs`) are evicted least recently used first until it fits
  again. Keys a running request of this process holds
  (:class:`~refsight.store.usage.PinnedKeys`) and the ones just written are skipped. Uses are
  buffered (:mod:`refsight.store.usage`) and flushed before choosing, so this process's order is
  exact; another process's uses are at most a flush interval old. A package a request in another
  process has already loaded stays readable (a mapped file outlives its unlink); one it has not
  loaded yet is a miss, re-encoded.
- **Shares** (``Store.quota_shares``: a server's tenants, when each tenant's packages are salted by its namespace):
  the quota is split into equal shares, one per tenant. A write that puts its tenant's packages over that
  tenant's share evicts that tenant's own least recently used packages (:func:`_hold_share`), and the pass
  over the whole store never evicts a tenant's package: it evicts only what belongs to no tenant (shared
  packages, those of a namespace no longer served, vLLM's encoder outputs). So which of a tenant's packages
  stay depends on its own requests alone, never on another tenant's images (policy 4 in
  ``docs/architecture/policies.md``); the tenants' shares add up to the quota.
- **Prune** (``refsight prune --fingerprint DIGEST | --model NAME``): every package of those
  fingerprints, and the references' links to them, are removed (``dry_run`` lists them only).
"""

from __future__ import annotations

import heapq
import logging
import threading
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from ..results import PruneReport, QuotaReport
from .base import FingerprintUsage, PackageIndex, PackageUsage

if TYPE_CHECKING:  # pragma: no cover
    from . import Store
    from .encoder_outputs import EncoderOutputs

__all__ = ["enforce_quota", "prune", "parse_bytes"]

log = logging.getLogger("refsight.store")

_PAGE = 256
_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9, "t": 10**12,
          "tb": 10**12, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}


def parse_bytes(value: object, *, name: str = "max_package_bytes", minimum: int = 1) -> int:
    """A byte count (at least ``minimum``) from an int or a string such as ``"500MB"``, ``"20GiB"``.

    Raises InvalidInputError naming ``name`` for anything else.
    """
    from ..errors import InvalidInputError

    if isinstance(value, bool):
        raise InvalidInputError(name, f"must be a number of bytes, not {value!r}")
    if isinstance(value, int):
        number, unit = value, ""
    elif isinstance(value, str):
        text = value.strip().lower().replace("_", "")
        digits = text.rstrip("abcdefghijklmnopqrstuvwxyz ")
        unit = text[len(digits):].strip()
        try:
            number = float(digits)
        except ValueError:
            raise InvalidInputError(name, f"must be bytes like 500000000, 500MB or 20GiB, not {value!r}") from None
    else:
        raise InvalidInputError(name, f"must be a number of bytes, not {value!r}")
    if unit not in _UNITS:
        raise InvalidInputError(name, f"unknown unit {unit!r} in {value!r}; use B, KB, MB, GB, TB, KiB, MiB, GiB or TiB")
    total = int(number * _UNITS[unit])
    if total < minimum:
        raise InvalidInputError(name, f"must be at least {minimum} bytes, not {value!r}")
    return total


_quota_lock = threading.Lock()


def enforce_quota(
    store: Store, max_bytes: int, *, protect: Iterable[str] = (), scope: str | None = None
) -> QuotaReport | None:
    """Evict least recently used packages and vLLM encoder outputs until ``store`` holds at most ``max_bytes``;
    None when it already did.

    One quota over both (:mod:`refsight.store.encoder_outputs`): they are evicted in one
    least-recently-used order. ``protect`` (the keys just written) and the keys pinned by running
    requests are never evicted; when only those are left the store stays over its quota until
    they are released. ``scope``: the scope of the packages just written; a tenant's (one of
    ``store.quota_shares``) is first held to its share, from its own packages (see the module).
    """
    outputs = store.encoder_outputs()
    share = max_bytes // len(store.quota_shares) if scope in store.quota_shares else None
    over_share = share is not None and store.local.total_bytes(scope=scope) > share
    total = _total(store, outputs, tell_connector=True)
    if total <= max_bytes and not over_share:
        return None
    # One pass at a time in this process; another process may run its own, and a key both
    # pick is deleted once (deletes are idempotent).
    with _quota_lock:
        try:
            store.usage.flush()  # this process's recent uses count before choosing
        except Exception:  # noqa: BLE001 - a busy index: choose by the uses written so far (they stay pending)
            log.debug("refsight: could not write package uses before a quota pass", exc_info=True)
        total = _total(store, outputs)
        report = QuotaReport(max_bytes=max_bytes, before=total, after=total)
        if share is not None:
            _hold_share(store, scope, share, report, set(protect))
        _evict_oldest(store, outputs, report, set(protect))
        report.after = _total(store, outputs, tell_connector=True)
    if report.evicted:
        store.counters.add(quota_evictions=len(report.evicted), quota_evicted_bytes=report.evicted_bytes)
    if report.evicted or report.encoder_outputs_evicted:
        log.info("refsight: quota %d B: evicted %d package(s), %d B, and %d vLLM encoder output(s), %d B", max_bytes,
                 len(report.evicted), report.evicted_bytes, report.encoder_outputs_evicted,
                 report.encoder_outputs_evicted_bytes)
    return report


def _total(store: Store, outputs: EncoderOutputs | None, *, tell_connector: bool = False) -> int:
    """Bytes under the quota; ``tell_connector``: also record the packages' share where the connector's own
    checks read it (at the check and after a pass, not again in between)."""
    packages = store.local.total_bytes()
    if outputs is None:
        return packages
    if tell_connector:
        outputs.record_packages(packages)
    return packages + outputs.total_bytes()


def _hold_share(store: Store, scope: str, share: int, report: QuotaReport, protected: set[str]) -> None:
    """Evict ``scope``'s own least recently used packages until they hold at most ``share`` bytes."""
    held = store.local.total_bytes(scope=scope)
    for usage in _oldest(store.local, scope):
        if held <= share:
            return
        if _evict_package(store, usage, report, protected):
            held -= usage.bytes


def _evict_oldest(store: Store, outputs: EncoderOutputs | None, report: QuotaReport, protected: set[str]) -> None:
    """Evict in one least-recently-used order over packages and encoder outputs until the report fits; a
    tenant's package (its scope one of ``store.quota_shares``) is held to its share by its own writes instead."""
    streams = [((False, usage) for usage in _oldest(store.local) if usage.scope not in store.quota_shares)]
    if outputs is not None:
        streams.append((True, usage) for usage in _oldest(outputs))
    for is_output, usage in heapq.merge(*streams, key=lambda item: (item[1].last_used, item[1].key)):
        if report.after <= report.max_bytes:
            return
        if is_output:
            _evict_output(outputs, usage, report)
        else:
            _evict_package(store, usage, report, protected)


def _evict_package(store: Store, usage: PackageUsage, report: QuotaReport, protected: set[str]) -> bool:
    """Evict one package, counted in the report, unless it is in use (``protected``, pinned: counted as skipped);
    whether it went."""
    if usage.key in protected or usage.key in store.pins:
        report.skipped_in_use += 1
        return False
    if not _evict(store, usage):
        return False
    report.evicted.append(usage.key)
    report.evicted_bytes += usage.bytes
    report.after -= usage.bytes
    return True


def _evict_output(outputs: EncoderOutputs | None, usage: PackageUsage, report: QuotaReport) -> None:
    """Evict one encoder output, counted in the report."""
    if outputs is not None and outputs.delete(usage.key):
        report.encoder_outputs_evicted += 1
        report.encoder_outputs_evicted_bytes += usage.bytes
        report.after -= usage.bytes


def _oldest(index: PackageIndex | EncoderOutputs, scope: str | None = None) -> Iterator[PackageUsage]:
    """Every entry of ``index`` (``scope``: its packages salted by that scope), least recently used first, a page at
    a time (deletes behind the cursor are safe)."""
    after: tuple[float, str] | None = None
    while page := (index.least_recently_used(_PAGE, after=after, scope=scope) if scope is not None
                   else index.least_recently_used(_PAGE, after=after)):
        yield from page
        after = (page[-1].last_used, page[-1].key)


def _evict(store: Store, usage: PackageUsage) -> bool:
    # Every tier: a quota-evicted package must not linger in memory or Redis and be written back.
    removed = store.local.delete(usage.key)
    for tier in store.packages.tiers:
        if tier is not store.local:
            tier.delete(usage.key)
    return removed


def prune(store: Store, fingerprint_digests: Iterable[str], *, dry_run: bool) -> PruneReport:
    """Remove every package of these fingerprints and the references' links to them (``dry_run``: list only)."""
    digests = list(dict.fromkeys(fingerprint_digests))
    usage = {u.fingerprint_digest: u for u in store.local.fingerprint_usage()}
    fingerprints = [_describe(usage[d]) if d in usage else {"fingerprint_digest": d, "packages": 0, "bytes": 0}
                    for d in digests]
    victims = [p for d in digests for p in store.local.packages_of(d)]
    report = PruneReport(
        fingerprints=fingerprints, packages=len(victims), bytes=sum(p.bytes for p in victims), links=0,
        dry_run=dry_run, keys=[p.key for p in victims],
    )
    if dry_run:
        return report
    for victim in victims:
        _evict(store, victim)
    # Links last: a crash before this leaves links to absent packages (a miss, re-encoded), never
    # an unlinked package a later gc would have to find.
    report.links = sum(store.catalog.unlink_fingerprint(d) for d in digests)
    if victims:
        store.counters.add(pruned=len(victims))
    return report


def _describe(usage: FingerprintUsage) -> dict[str, Any]:
    return usage._asdict()
