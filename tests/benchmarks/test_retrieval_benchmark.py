"""The retrieval benchmark runs end to end at a small size and its two paths (graph, store) agree."""

from __future__ import annotations

import pytest
from benchmark_runner import run_benchmark

pytestmark = pytest.mark.slow  # runs a benchmark script


def test_sweep_on_one_build_and_the_store_path_finds_what_the_graph_finds():
    figures = run_benchmark("retrieval.py", "--n", "10000", "--dim", "32", "--queries", "25", "--ef", "16,64",
                            timeout=300)
    for key in ("n", "dim", "build_s", "p50_ms", "p99_ms", "recall_at_10", "bytes_per_vector", "exact_p50_ms"):
        assert key in figures, key
    assert [entry["expansion_search"] for entry in figures["sweep"]] == [16, 64]
    assert figures["expansion_search"] == 16 and figures["recall_at_10"] == figures["sweep"][0]["recall_at_10"]
    for entry in figures["sweep"]:
        # the retriever builds its own graph from the database with the same parameters: at the same
        # breadth it finds what the benchmark's graph finds (HNSW builds differ only in tie order)
        assert abs(entry["store_recall_at_10"] - entry["recall_at_10"]) <= 0.02
        assert 0.5 < entry["recall_at_10"] <= 1.0
