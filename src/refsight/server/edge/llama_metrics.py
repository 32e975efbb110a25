"""llama-server's Prometheus metrics (``llamacpp:*``), beside refsight's own on ``/metrics``.

:class:`GenerationCounters` tallies every generation the service runs, whatever the dialect
(OpenAI, llama-server, Ollama, Anthropic): prompt tokens evaluated and those served from a stored
reference-prefix state (llama-server's cached tokens), tokens predicted, and the time of each part,
split where llama-server splits it: at the first generated token. A streamed answer is split by
the clock (its first piece); one that is not streamed by the engine's stage timings (encoding,
reference loading and prefix building or loading are the prompt's; the rest is the answer's).

:class:`LlamaCollector` writes them under llama-server's names: ``prompt_tokens_total``,
``prompt_tokens_cached_total``, ``prompt_seconds_total``, ``tokens_predicted_total``,
``tokens_predicted_seconds_total``, ``n_tokens_max``, the speculative-decoding counters (0: none
runs here), and the gauges ``prompt_tokens_seconds`` and ``predicted_tokens_seconds`` (the rates
over the window since the last scrape, as llama-server averages them; generation without the first
token, whose logits come from the prompt), ``requests_processing`` (requests a model worker runs)
and ``requests_deferred`` (requests waiting for one). llama-server's ``n_decode_total`` and
``n_busy_slots_per_decode`` count ``llama_decode`` calls, which no runtime here reports: they are
left out rather than guessed.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

__all__ = ["GenerationCounters", "LlamaCollector"]

_STAGES_BEFORE_ANSWER = ("encode", "reference_load", "prefix_build", "prefix_load")


@dataclass
class _Bucket:
    """Tokens, the steps that produced them, and their seconds."""

    tokens: int = 0
    steps: int = 0
    seconds: float = 0.0

    def add(self, tokens: int, steps: int, seconds: float) -> None:
        self.tokens, self.steps, self.seconds = self.tokens + tokens, self.steps + steps, self.seconds + seconds

    def rate(self) -> float:
        """Steps per second (0 without time)."""
        return self.steps / self.seconds if self.seconds > 0 else 0.0


class GenerationCounters:
    """Every generation's tokens and times since the server started (thread-safe: workers add, scrapes read)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.prompt, self.predict = _Bucket(), _Bucket()
        self.window_prompt, self.window_predict = _Bucket(), _Bucket()  # since the last scrape
        self.cached = 0
        self.tokens_max = 0
        self.count = 0  # generations finished

    def add(self, result: Any, began: float, first: float | None, ended: float) -> None:
        """One finished generation (``result``: a GenerateResult), timed from ``began`` to ``ended``
        (``first``: when its first piece was handed out; None when it was not streamed)."""
        cached = int(result.prefix_tokens_reused or 0)
        prompt = max(int(result.prompt_tokens) - cached, 0)
        predicted = len(result.tokens)
        if first is not None:
            prompt_s, predict_s = first - began, ended - first
        else:
            ms = result.timings_ms or {}
            prompt_s = sum(float(ms.get(k, 0.0)) for k in _STAGES_BEFORE_ANSWER) / 1000.0
            predict_s = max(ended - began - prompt_s, 0.0)
        steps = max(predicted - 1, 0)  # the first token's logits come from the prompt's evaluation
        with self._lock:
            for bucket in (self.prompt, self.window_prompt):
                bucket.add(prompt, prompt, max(prompt_s, 0.0))
            for bucket in (self.predict, self.window_predict):
                bucket.add(predicted, steps, max(predict_s, 0.0))
            self.cached += cached
            self.tokens_max = max(self.tokens_max, int(result.prompt_tokens) + predicted)
            self.count += 1

    def scrape(self) -> dict[str, float]:
        """The figures now, and a fresh window for the rates."""
        with self._lock:
            figures = {
                "prompt_tokens_total": self.prompt.tokens, "prompt_tokens_cached_total": self.cached,
                "prompt_seconds_total": self.prompt.seconds, "tokens_predicted_total": self.predict.tokens,
                "tokens_predicted_seconds_total": self.predict.seconds, "n_tokens_max": self.tokens_max,
                "prompt_tokens_seconds": self.window_prompt.rate(),
                "predicted_tokens_seconds": self.window_predict.rate(),
            }
            self.window_prompt, self.window_predict = _Bucket(), _Bucket()
        return figures


#: (name, help) of llama-server's counters, in its order; the speculative ones stay 0 here.
_COUNTERS = (
    ("prompt_tokens_total", "Number of prompt tokens processed, excluding cached tokens"),
    ("prompt_tokens_cached_total", "Number of prompt tokens reused from the cache"),
    ("prompt_seconds_total", "Total time spent processing prompts"),
    ("tokens_predicted_total", "Number of generation tokens processed"),
    ("tokens_predicted_seconds_total", "Total time spent generating tokens"),
    ("spec_decode_num_draft_tokens_total", "Speculative: Total draft tokens generated"),
    ("spec_decode_num_accepted_tokens_total", "Speculative: Total draft tokens accepted by the target model"),
    ("spec_decode_num_drafts_total", "Speculative: Total speculative decoding verification steps"),
)
_GAUGES = (
    ("n_tokens_max", "Largest observed sequence length (prompt + generation)"),
    ("prompt_tokens_seconds", "Average prompt throughput in tokens/s"),
    ("predicted_tokens_seconds", "Average generation throughput in tokens/s"),
)


class LlamaCollector:
    """The ``llamacpp:*`` metrics at scrape time, from the service's counters and the work pool."""

    def __init__(self, counters: GenerationCounters, pool: Any) -> None:
        self.counters, self.pool = counters, pool

    def collect(self) -> Iterator[Any]:
        """llama-server's counters and gauges (prometheus_client writes a counter's samples as ``NAME``,
        its ``_total`` suffix kept)."""
        figures = self.counters.scrape()
        for name, help_text in _COUNTERS:
            metric = CounterMetricFamily(f"llamacpp:{name}", help_text)
            metric.add_metric([], float(figures.get(name, 0.0)))
            yield metric
        pending = int(self.pool.pending)
        running = min(pending, int(self.pool.workers))
        for name, help_text, value in (
            *((n, h, float(figures[n])) for n, h in _GAUGES),
            ("requests_processing", "Number of requests processing", float(running)),
            ("requests_deferred", "Number of requests deferred", float(pending - running)),
        ):
            gauge = GaugeMetricFamily(f"llamacpp:{name}", help_text)
            gauge.add_metric([], value)
            yield gauge
