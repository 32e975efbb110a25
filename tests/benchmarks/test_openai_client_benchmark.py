"""openai_client.py runs end to end at a tiny size: the ``openai`` SDK (data URLs) against real ``refsight serve``
processes (a fresh store, restarted on the same store, ``--no-cache``), with no refsight-specific call, and prints
its ONE JSON line."""

from __future__ import annotations

from benchmark_runner import assert_keys, run_benchmark
from runtimes import require_module
from test_ollama_client_benchmark import FIGURES


def test_openai_client_benchmark_at_a_tiny_size(model_cache):
    require_module("llama_cpp.mtmd_cpp", "pip install 'refsight[llamacpp]'")
    require_module("openai", "pip install 'refsight[test]'")
    figures = run_benchmark("openai_client.py", "--model", "tiny-qwen2-vl-gguf", "--size", "56", "--requests", "2",
                            "--max-new-tokens", "2")
    assert_keys(figures, *FIGURES)
    assert figures["client"] == "openai-python" and figures["references"] == 3 and figures["requests"] == 2
    assert figures["first_s"] > 0 and figures["after_restart_s"] > 0 and figures["cached_s"] > 0
    assert figures["tokens_equal"] is True  # remembered packages and prefix states answer as the baseline does
