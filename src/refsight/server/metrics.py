"""Prometheus metrics: request latency histograms and the store's cache counters.

Each app gets its own :class:`prometheus_client.CollectorRegistry` (two apps in one
process, as in tests, never clash). Cache figures are read from the store when
``/metrics`` is scraped, so they are the persistent, cross-process counters that
``refsight stats`` shows, not a per-process tally.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterator

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

__all__ = ["Metrics", "CONTENT_TYPE_LATEST"]

#: Compare stage → its entry in ``timings_ms`` (present exactly when the stage ran).
_STAGE_TIMINGS = {"recall": "retrieval", "prefilter": "prefilter", "rerank": "rerank", "judge": "generate"}

_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class _CacheCollector:
    """Reads the store's counters at scrape time."""

    def __init__(self, read: Callable[[], dict[str, Any]]) -> None:
        self._read = read

    def collect(self) -> Iterator[Any]:
        try:
            stats = self._read()
        except Exception:  # a scrape must not fail because the store is busy or closing
            return
        for name, help_text in (
            ("hits", "Package lookups served from the store (no encoder run)"),
            ("misses", "Package lookups that ran the encoder"),
            ("evictions", "Packages evicted from the memory tier"),
        ):
            metric = CounterMetricFamily(f"refsight_cache_{name}", help_text)
            metric.add_metric([], float(stats.get(name) or 0))
            yield metric
        saved = CounterMetricFamily("refsight_cache_encode_seconds_saved", "Encoder time saved by cache hits")
        saved.add_metric([], float(stats.get("encode_ms_saved") or 0) / 1000.0)
        yield saved
        for name, help_text in (("hits", "served without an encoder"), ("misses", "that ran the encoder")):
            gauge = GaugeMetricFamily(f"refsight_replica_cache_{name}", f"Package lookups of this process {help_text}")
            gauge.add_metric([], float((stats.get("replica") or {}).get(name) or 0))
            yield gauge
        for name, key, help_text in (
            ("refsight_cache_bytes", "bytes", "Bytes of packages on local disk"),
            ("refsight_cache_packages", "packages", "Packages on local disk"),
            ("refsight_references", "references", "References across all namespaces"),
            ("refsight_cache_memory_bytes", "memory_bytes", "Bytes of packages in the memory tier"),
        ):
            if key in stats:
                gauge = GaugeMetricFamily(name, help_text)
                gauge.add_metric([], float(stats[key] or 0))
                yield gauge


class Metrics:
    """The app's registry: ``observe`` request latencies, ``render`` the text exposition."""

    def __init__(self, read_cache_stats: Callable[[], dict[str, Any]]) -> None:
        self.registry = CollectorRegistry()
        self.latency = Histogram(
            "refsight_request_seconds",
            "HTTP request latency by route template, method and status",
            ["method", "route", "status"],
            buckets=_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(_CacheCollector(read_cache_stats))
        self.stage_calls = Counter(
            "refsight_compare_stage_calls",
            "Compare pipeline stages run (recall, prefilter, rerank, judge)",
            ["stage"],
            registry=self.registry,
        )
        self.stage_references = Counter(
            "refsight_compare_stage_references",
            "References each compare stage took in (recalled, filtered, reranked, judged)",
            ["stage"],
            registry=self.registry,
        )
        self.stage_seconds = Counter(
            "refsight_compare_stage_seconds",
            "Time spent in each compare stage",
            ["stage"],
            registry=self.registry,
        )

    def stages(self, counts: dict[str, int], timings_ms: dict[str, float]) -> None:
        """Count one compare's stages: references per stage, and the stages that ran with their time."""
        for stage, n in counts.items():
            self.stage_references.labels(stage).inc(n)
        for stage, timing in _STAGE_TIMINGS.items():
            if timing in timings_ms:
                self.stage_calls.labels(stage).inc()
                self.stage_seconds.labels(stage).inc(timings_ms[timing] / 1000.0)

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        """Record one request (``route`` is the template, e.g. ``/v1/references/{ref_id}``, to bound cardinality)."""
        self.latency.labels(method, route, str(status)).observe(seconds)

    def render(self) -> bytes:
        """The Prometheus text format."""
        return generate_latest(self.registry)

    def middleware(self) -> Callable:
        """An HTTP middleware function timing every request."""

        async def timing(request, call_next):
            start = time.perf_counter()
            status = 500
            try:
                response = await call_next(request)
                status = response.status_code
                return response
            finally:
                route = request.scope.get("route")
                template = getattr(route, "path", None) or "unmatched"
                self.observe(request.method, template, status, time.perf_counter() - start)

        return timing
