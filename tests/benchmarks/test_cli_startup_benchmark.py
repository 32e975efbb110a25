"""The CLI start-up benchmark runs end to end at a tiny size."""

from __future__ import annotations

from benchmark_runner import assert_keys, run_benchmark


def test_cli_startup_prints_its_figures():
    figures = run_benchmark("cli_startup.py", "--refs", "3", "--repeats", "1")
    assert_keys(figures, "baseline_ms", "commands_ms", "slowest_ms", "model_loading_ms", "ratio_vs_python",
                "ratio_vs_model_loading", "text_search_ms", "cached_add_ms", "text_search_vs_target",
                "cached_add_vs_target")
    assert set(figures["commands_ms"]) == {"list", "show", "stats", "models", "prune_dry_run", "gc"}
    assert all(ms > 0 for ms in figures["commands_ms"].values()) and figures["baseline_ms"] > 0
    # A cached add loads no VLM (its fingerprint is the one recorded at the first load): far below an add that does.
    assert figures["cached_add_ms"] < figures["model_loading_ms"]
