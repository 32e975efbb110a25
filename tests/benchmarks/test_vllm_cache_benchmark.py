"""vllm_cache.py runs end to end at a tiny size on real vLLM servers it starts itself (``-m vllm``).

Three server starts (vLLM's caches off, its defaults, the restart), each with refsight's
connector on one fresh store; the figures are ratios within the run, the tokens equal.
"""

from __future__ import annotations

import pytest
from benchmark_runner import assert_keys, run_benchmark

pytestmark = pytest.mark.vllm

FIGURES = ("speedup_caches_off_r1", "speedup_caches_off_r4", "speedup_cycling", "speedup_after_restart",
           "ratio_warm", "tokens_equal", "vllm_encoder_cache", "uuid_stats", "random_weights")


def test_vllm_cache_at_a_tiny_size(vllm_python, model_cache):
    figures = run_benchmark("vllm_cache.py", "--model", "tiny-qwen2-vl-vllm", "--size", "56", "--working-set", "8",
                            "--repeats", "2", "--after-restart", "2", "--max-new-tokens", "2", timeout=1800)
    assert_keys(figures, *FIGURES)
    assert figures["tokens_equal"] is True and figures["random_weights"] is True
    assert all(figures[k] > 0 for k in FIGURES[:5])
    counters = figures["vllm_encoder_cache"]
    assert counters["saves"] == 8 and counters["hits"] > 0 and counters["corrupt"] == 0  # each reference encoded once
    assert figures["uuid_stats"]["with_pixels"] > 0  # after the restart: pixels + uuid, loaded by the connector


def test_vllm_cache_figure_a_in_embeds_mode(vllm_python, model_cache):
    """``--images embeds --figures a``: one caches-off server, refsight's arm sending embeddings (its own tower)."""
    figures = run_benchmark("vllm_cache.py", "--model", "tiny-qwen2-vl-vllm", "--size", "56", "--working-set", "4",
                            "--repeats", "2", "--max-new-tokens", "2", "--images", "embeds", "--figures", "a",
                            timeout=900)
    assert_keys(figures, "speedup_caches_off_r1", "speedup_caches_off_r4", "tokens_equal", "mode")
    assert "speedup_cycling" not in figures and "speedup_after_restart" not in figures
    assert figures["mode"]["vllm_images"] == "embeds" and figures["tokens_equal"] is True
    assert figures["speedup_caches_off_r1"] > 0 and figures["speedup_caches_off_r4"] > 0
