"""prefix_cache_runtimes.py runs end to end at a tiny size on llama.cpp and (``-m vllm``) on a vLLM server
from the session's pool (``tests/vllm_servers.py``)."""

from __future__ import annotations

import pytest
from benchmark_runner import assert_keys, run_benchmark

pytestmark = pytest.mark.slow  # runs a benchmark script

COMMON = ("benchmark", "runtime", "model", "size", "references", "rubrics", "candidates", "random_weights",
          "package_ms", "prefix_ms", "package_over_prefix", "tokens_equal")


def test_prefix_cache_runtimes_on_llama_cpp(model_cache):
    figures = run_benchmark("prefix_cache_runtimes.py", "--model", "tiny-qwen2-vl-gguf", "--size", "56", "--refs", "2")
    assert_keys(figures, *COMMON, "fresh_ms", "prefix_hit_ms_each", "candidate_only_ms_each", "prefix_hits",
                "prefix_tokens", "prefix_bytes_per_token")
    assert figures["runtime"] == "llamacpp" and figures["tokens_equal"] is True
    assert figures["prefix_hits"] == figures["rubrics"] * figures["candidates"] - 1  # the first request builds it


@pytest.mark.vllm
def test_prefix_cache_runtimes_on_a_vllm_server(model_cache, vllm_servers):
    server = vllm_servers.get("tiny-qwen2-vl-vllm", 8)
    # vLLM caches whole KV blocks only (128 tokens on a CPU): four 224² references (64 tokens each) fill two.
    figures = run_benchmark("prefix_cache_runtimes.py", "--model", f"vllm:{server.url}", "--size", "224", "--refs", "4")
    assert_keys(figures, *COMMON, "prefix_cache_queries", "prefix_cache_hits", "prefix_cache_hit_rate")
    assert figures["runtime"] == "vllm" and figures["tokens_equal"] is True
    assert figures["prefix_cache_hits"] > 0  # the fixed opening lets vLLM reuse the reference prefix
