"""The HTTP load benchmarks run end to end at a tiny size: one in-process server, and two replicas
(``refsight serve`` processes) on a real throwaway PostgreSQL catalog with a real Redis tier."""

from __future__ import annotations

from benchmark_runner import assert_keys, run_benchmark

FIGURES = ("requests", "errors", "rps", "p50_ms", "p99_ms", "encodes", "distinct_images", "clients", "model")


def test_serve_load_encodes_each_image_once(model_cache):
    figures = run_benchmark("serve_load.py", "--clients", "2", "--requests", "3", "--references", "2",
                            "--candidates", "1", "--search-every", "3")
    assert_keys(figures, *FIGURES, "distinct_encoded")
    assert figures["errors"] == 0 and figures["encodes"] == figures["distinct_images"] == 3


def test_serve_load_sweeps_worker_counts(model_cache):
    """``--sweep``: each worker count with every core per worker and with the budget, one line."""
    figures = run_benchmark("serve_load.py", "--sweep", "1,2", "--clients", "2", "--requests", "2", "--references", "2",
                            "--candidates", "1", "--search-every", "0")
    assert_keys(figures, "sweep", "cores", "errors")
    assert figures["errors"] == 0 and [row["workers"] for row in figures["sweep"]] == [1, 2]
    for row in figures["sweep"]:
        assert row["all_cores_threads"] == figures["cores"]
        assert row["budget_threads"] == max(1, figures["cores"] // row["workers"])
        assert row["budget_vs_all_cores"] > 0


def test_serve_replicas_share_one_store(model_cache):
    figures = run_benchmark("serve_load.py", "--replicas", "2", "--cache", "auto", "--clients", "2", "--requests", "2",
                            "--references", "2", "--candidates", "2", "--search-every", "0")
    assert_keys(figures, *FIGURES, "replicas", "encodes_per_replica", "proof_b_encodes", "tier_share", "add_s")
    assert figures["errors"] == 0 and figures["proof_b_encodes"] == 0
    assert figures["encodes"] == figures["distinct_images"] == 4 and set(figures["tier_share"]) >= {"redis", "encode"}
