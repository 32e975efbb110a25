"""Prometheus metrics: request latency histograms and the store's cache counters.

Each app gets its own :class:`prometheus_client.CollectorRegistry` (two apps in one
process, as in tests, never clash). Cache figures are read from the store when
``/metrics`` is scraped, so they are the persistent, cross-process counters that
``refsight stats`` shows, not a per-process tally. The per-tier figures
(``refsight_tier_*{tier="memory"|"redis"|"disk"}``) are this process's (this replica's).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterator

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from ...results import COMPARE_STAGES

__all__ = ["Metrics", "TimingMiddleware", "CONTENT_TYPE_LATEST"]

_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


#: The store's counters: (metric, key in the stats, divisor to the metric's unit, help).
_COUNTERS = (
    ("refsight_cache_hits", "hits", 1, "Package lookups served from the store (no encoder run)"),
    ("refsight_cache_misses", "misses", 1, "Package lookups that ran the encoder"),
    ("refsight_cache_evictions", "evictions", 1, "Packages evicted from the memory tier"),
    ("refsight_cache_encode_seconds_saved", "encode_ms_saved", 1000.0, "Encoder time saved by cache hits"),
    ("refsight_cache_quota_evictions", "quota_evictions", 1, "Packages the byte quota evicted from disk"),
    ("refsight_cache_pruned", "pruned", 1, "Packages removed by prune"),
    ("refsight_prefix_hits", "prefix_hits", 1, "Requests whose reference prefix state was reused (no prefill over it)"),
    ("refsight_prefix_misses", "prefix_misses", 1, "Reference prefix states built (not found, or found corrupt)"),
    ("refsight_prefix_ms_saved", "prefix_ms_saved", 1, "Milliseconds of reference prefill saved by prefix state hits"),
)


class _CacheCollector:
    """Reads the store's counters at scrape time."""

    def __init__(self, read: Callable[[], dict[str, Any]]) -> None:
        self._read = read

    def collect(self) -> Iterator[Any]:
        try:
            stats = self._read()
        except Exception:  # a scrape must not fail because the store is busy or closing
            return
        for name, key, divisor, help_text in _COUNTERS:
            metric = CounterMetricFamily(name, help_text)
            metric.add_metric([], float(stats.get(key) or 0) / divisor)
            yield metric
        yield from _tier_metrics(stats.get("tiers") or {})
        yield from _gauges(stats)
        yield from _runtime_prefix_metrics(stats.get("runtime_prefix_cache") or {})
        yield from _encoder_cache_metrics(stats.get("vllm_encoder_cache"))


def _gauges(stats: dict[str, Any]) -> Iterator[Any]:
    """This process's package lookups, and the store's sizes it reports."""
    for name, help_text in (("hits", "served without an encoder"), ("misses", "that ran the encoder")):
        gauge = GaugeMetricFamily(f"refsight_replica_cache_{name}", f"Package lookups of this process {help_text}")
        gauge.add_metric([], float((stats.get("replica") or {}).get(name) or 0))
        yield gauge
    for name, key, help_text in (
        ("refsight_prefix_bytes", "prefix_bytes", "Bytes of reference prefix states on local disk (compressed)"),
        ("refsight_prefix_raw_bytes", "prefix_raw_bytes", "Bytes of reference prefix states before compression"),
        ("refsight_cache_max_package_bytes", "max_package_bytes", "Byte quota on packages (0: none)"),
        ("refsight_cache_bytes", "bytes", "Bytes of packages on disk (compressed: what the byte quota counts)"),
        ("refsight_cache_raw_bytes", "raw_bytes", "Bytes of packages before compression"),
        ("refsight_cache_packages", "packages", "Packages on local disk"),
        ("refsight_references", "references", "References across all namespaces"),
        ("refsight_cache_memory_bytes", "memory_bytes", "Bytes of packages in the memory tier"),
    ):
        if key in stats:
            gauge = GaugeMetricFamily(name, help_text)
            gauge.add_metric([], float(stats[key] or 0))
            yield gauge


def _runtime_prefix_metrics(runtimes: dict[str, Any]) -> Iterator[Any]:
    """A runtime's own prefix cache (vLLM's automatic prefix caching), per loaded backend."""
    if not runtimes:
        return
    rate = GaugeMetricFamily(
        "refsight_runtime_prefix_cache_hit_rate", "Prompt tokens served from the runtime's own prefix cache, as a share",
        labels=["backend"],
    )
    for backend, figures in runtimes.items():
        if isinstance(figures, dict) and "hit_rate" in figures:
            rate.add_metric([backend], float(figures["hit_rate"]))
    yield rate


def _encoder_cache_metrics(figures: dict[str, Any] | None) -> Iterator[Any]:
    """refsight's vLLM encoder-cache connector on this store (store-wide), when a server used it."""
    if not figures:
        return
    for field, help_text in (
        ("hits", "vLLM encoder outputs of references served from the store (no encode)"),
        ("misses", "Reference lookups of the vLLM connector that found nothing usable (vLLM encoded)"),
        ("saves", "vLLM encoder outputs of references written to the store"),
        ("corrupt", "Encoder-cache files that failed their checks (moved aside, re-encoded)"),
        ("evictions", "Encoder-cache files the connector's byte quota deleted"),
        ("refused", "Reference uuids sent with other pixels than their file's (not served)"),
    ):
        metric = CounterMetricFamily(f"refsight_vllm_encoder_cache_{field}", help_text)
        metric.add_metric([], float(figures.get(field) or 0))
        yield metric
    gauge = GaugeMetricFamily("refsight_vllm_encoder_cache_bytes", "Bytes of vLLM encoder outputs in the store")
    gauge.add_metric([], float(figures.get("bytes") or 0))
    yield gauge


def _tier_metrics(tiers: dict[str, dict[str, Any]]) -> Iterator[Any]:
    """Per tier (this process): hits, misses, bytes served; Redis's errors and availability."""
    for field, help_text in (
        ("hits", "Package lookups a tier answered (this process)"),
        ("misses", "Package lookups a tier could not answer (this process)"),
        ("bytes", "Tensor bytes of the packages a tier served (this process)"),
        ("errors", "Failed calls to a tier (this process)"),
        ("skipped", "Calls not made while a tier backs off after a failure (this process)"),
        ("corrupt", "Values a tier held that failed their checks, deleted (this process)"),
    ):
        metric = CounterMetricFamily(f"refsight_tier_{field}", help_text, labels=["tier"])
        for tier, figures in tiers.items():
            if field in figures:
                metric.add_metric([tier], float(figures[field] or 0))
        yield metric
    available = GaugeMetricFamily("refsight_tier_available", "Whether a tier is in use now (1) or backing off (0)",
                                  labels=["tier"])
    for tier, figures in tiers.items():
        available.add_metric([tier], float(figures.get("available", True)))
    yield available


class Metrics:
    """The app's registry: ``observe`` request latencies, ``render`` the text exposition."""

    def __init__(self, read_cache_stats: Callable[[], dict[str, Any]]) -> None:
        #: When the server started (Unix seconds): llama-server's ``Process-Start-Time-Unix`` header on ``/metrics``.
        self.started = int(time.time())
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
        for stage in COMPARE_STAGES:  # timed in timings_ms under its own name exactly when it ran
            if stage in timings_ms:
                self.stage_calls.labels(stage).inc()
                self.stage_seconds.labels(stage).inc(timings_ms[stage] / 1000.0)

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        """Record one request (``route`` is the template, e.g. ``/v1/references/{ref_id}``, to bound cardinality)."""
        self.latency.labels(method, route, str(status)).observe(seconds)

    def render(self) -> bytes:
        """The Prometheus text format."""
        return generate_latest(self.registry)


class TimingMiddleware:
    """Times every HTTP request into :class:`Metrics`, from its start until its response is sent.

    Plain ASGI rather than Starlette's ``BaseHTTPMiddleware``: that one runs each request in a task group
    with its own body streams: 0.2-0.6 ms of refsight's own cost per request here (benchmarks/overhead.py, http).
    """

    def __init__(self, app: Callable, metrics: Metrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start, status = time.perf_counter(), 500  # 500 unless a response starts: the app raised

        async def send_noting_status(message: dict) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_noting_status)
        finally:
            # Routing writes the matched route into this same scope: its template bounds the label's cardinality.
            template = getattr(scope.get("route"), "path", None) or "unmatched"
            self.metrics.observe(scope["method"], template, status, time.perf_counter() - start)
