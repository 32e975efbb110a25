"""The KV prefix-cache benchmark runs end to end at a tiny size and its three paths agree."""

from __future__ import annotations

import pytest
from benchmark_runner import run_benchmark

pytestmark = pytest.mark.slow  # runs a benchmark script


def test_prefix_cache_benchmark_prints_one_json_line_and_reuses_the_state(model_cache):
    args = ["--model", "tiny-qwen2-vl", "--size", "56", "--refs", "2", "--rubrics", "2", "--candidates", "1"]
    figures = run_benchmark("prefix_cache.py", *args, "--max-new-tokens", "3")
    for key in (
        "fresh_ms", "package_ms", "prefix_ms", "candidate_only_ms", "package_over_prefix", "prefix_over_candidate_only",
        "prefix_bytes_per_token", "prefix_build_ms",
    ):
        assert figures[key] is not None and figures[key] > 0, key
    assert figures["tokens_identical"] == {"package_vs_fresh": True, "prefix_vs_package": True}
    assert figures["requests"] == 2 and figures["prefix_misses"] == 1 and figures["prefix_hits"] >= 3
    assert 0 < figures["prefix_from_disk_tokens_reused"] == figures["prefix_tokens"] < figures["prompt_tokens"]
    # tiny-qwen2-vl: 2 layers x (key + value) x 2 KV heads x head dim 16 x 4 bytes per token
    assert figures["prefix_bytes_per_token"] == 2 * 2 * 2 * 16 * 4
