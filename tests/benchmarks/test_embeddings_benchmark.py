"""embeddings.py runs end to end at a tiny size: the OpenAI SDK's embeddings of new and repeated photos against a
real ``refsight serve`` (the repeat from the store), the plain-Python baseline, and rerank latencies with the
references' packages stored and on ``--no-cache``; it prints its ONE JSON line."""

from __future__ import annotations

from benchmark_runner import assert_keys, run_benchmark
from runtimes import require_module


def test_embeddings_benchmark_at_a_tiny_size(model_cache):
    require_module("openai", "pip install 'refsight[test]'")
    figures = run_benchmark("embeddings.py", "--images", "4", "--batch", "2", "--size", "64", "--documents", "2",
                            "--repeats", "1")
    assert_keys(figures, "first_images_per_s", "repeat_images_per_s", "plain_images_per_s", "first_vs_plain",
                "repeat_vs_plain", "rerank_cached_ms_2", "rerank_no_cache_ms_2", "rerank_speedup_2")
    assert figures["images"] == 4 and figures["repeat_from_store"] is True and figures["vectors_equal"] is True
    assert figures["first_images_per_s"] > 0 and figures["rerank_cached_ms_2"] > 0
