"""cache_speedup.py runs end to end at a tiny size on each runtime, and its three paths give the same tokens.

transformers and llama.cpp here; the vLLM server (``-m vllm``, CI's vLLM step) from the session's
server pool (``tests/vllm_servers.py``), so no extra server starts.
"""

from __future__ import annotations

import pytest
from benchmark_runner import assert_keys, run_benchmark

FIGURES = ("model", "references", "fresh_ms", "cached_ms", "speedup", "peer_ms", "peer_speedup",
           "reference_encode_ms", "reference_load_ms", "ref_side_ratio", "package_bytes", "device", "dtype",
           "random_weights", "runs")
RUN_FIGURES = ("fresh_ms", "cached_ms", "peer_ms", "candidate_encode_ms", "lm_ms", "cached_over_encode_plus_lm")


def _check(figures: dict, counts: list[int]) -> None:
    assert_keys(figures, *FIGURES)
    assert [run["references"] for run in figures["runs"]] == counts and figures["random_weights"] is True
    for run in figures["runs"]:
        assert_keys(run, *RUN_FIGURES)
        assert run["tokens_equal"], run  # fresh == cached == the runtime's own pixel path


@pytest.mark.parametrize("model", ["tiny-qwen2-vl", "tiny-qwen2-vl-gguf", "tiny-gemma3", "tiny-internvl"])
def test_cache_speedup_at_a_tiny_size(model_cache, model):
    figures = run_benchmark("cache_speedup.py", "--model", model, "--size", "56", "--refs", "1,2",
                            "--max-new-tokens", "3")
    _check(figures, [1, 2])


def test_cache_speedup_with_prefix_states_past_a_sliding_window(model_cache):
    """tiny-gemma3's window is 64 tokens: four references' prefix is longer, and the cached path serves it."""
    figures = run_benchmark("cache_speedup.py", "--model", "tiny-gemma3", "--size", "56", "--refs", "1,4",
                            "--max-new-tokens", "3", "--prefix-states")
    _check(figures, [1, 4])
    assert figures["prefix_states"] is True
    assert all(run["prefix_tokens_reused"] > 0 for run in figures["runs"])
    assert figures["runs"][-1]["prefix_tokens_reused"] > 64


@pytest.mark.vllm
def test_cache_speedup_on_a_vllm_server(model_cache, vllm_servers):
    server = vllm_servers.get("tiny-qwen2-vl-vllm", 8)
    figures = run_benchmark("cache_speedup.py", "--model", f"vllm:{server.url}", "--size", "56", "--refs", "1,2",
                            "--max-new-tokens", "3")
    _check(figures, [1, 2])
    assert figures["device"] is None  # the language model runs in the server
