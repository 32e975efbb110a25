"""The retrieval benchmark runs end to end at a small size and its two paths agree."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "retrieval.py"


def test_sweep_on_one_build_and_the_store_path_finds_what_the_graph_finds():
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--n", "10000", "--dim", "32", "--queries", "25", "--ef", "16,64"],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 1  # one JSON line, nothing else on stdout
    figures = json.loads(lines[0])
    for key in ("n", "dim", "build_s", "p50_ms", "p99_ms", "recall_at_10", "bytes_per_vector", "exact_p50_ms"):
        assert key in figures, key
    assert [entry["expansion_search"] for entry in figures["sweep"]] == [16, 64]
    assert figures["expansion_search"] == 16 and figures["recall_at_10"] == figures["sweep"][0]["recall_at_10"]
    for entry in figures["sweep"]:
        # the same graph at the same breadth: the database path returns the same neighbours
        assert entry["store_recall_at_10"] == entry["recall_at_10"]
        assert 0.5 < entry["recall_at_10"] <= 1.0
