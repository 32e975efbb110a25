"""overhead.py runs end to end at a tiny size: refsight's own ms per request on each runtime path, one JSON line.

The figures are wall-clock differences on a shared machine, so only their shape is checked here (present,
finite, the runtime's own time positive); the closing note of issue 41 has the measured values.
"""

from __future__ import annotations

import math

import pytest
from benchmark_runner import assert_keys, run_benchmark


def _check(figures: dict, *paths: str) -> None:
    for path in paths:
        assert_keys(figures, f"{path}_p50_ms", f"{path}_p95_ms", f"{path}_runtime_p50_ms")
        assert math.isfinite(figures[f"{path}_p50_ms"]) and figures[f"{path}_p95_ms"] >= figures[f"{path}_p50_ms"]
        assert figures[f"{path}_runtime_p50_ms"] > 0  # the runtime's calls were found and timed


def test_overhead_of_transformers_and_the_http_front_door(model_cache):
    _check(run_benchmark("overhead.py", "--paths", "transformers,http", "--requests", "3"), "transformers", "http")


def test_overhead_of_llama_cpp(model_cache):
    _check(run_benchmark("overhead.py", "--paths", "llamacpp", "--requests", "3"), "llamacpp")


@pytest.mark.vllm
def test_overhead_of_vllm(vllm_servers, model_cache):
    server = vllm_servers.get("tiny-qwen2-vl-vllm", 8)  # the pool's server: no start of its own
    figures = run_benchmark("overhead.py", "--paths", "vllm", "--requests", "3", "--vllm-url", server.url)
    _check(figures, "vllm")
    assert figures["vllm_mode"] == {"vllm_images": "pixels", "vllm_keeps_uuids": True}
