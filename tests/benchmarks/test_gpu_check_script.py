"""benchmarks/gpu_check.sh, the script a GPU machine runs, passes on the CPU at a tiny size (so it cannot rot
between the rare runs on a GPU): its equivalence step, then cache_speedup.py's one JSON line."""

from __future__ import annotations

import json
import os
import subprocess

from benchmark_runner import BENCHMARKS


def test_gpu_check_passes_on_the_cpu(model_cache, tmp_path):
    env = {**os.environ, "DEVICE": "cpu", "MODEL": "tiny-qwen2-vl", "SIZE": "56", "OUT": str(tmp_path),
           "PYTEST_K": "tiny-qwen2-vl and float32", "REFSIGHT_MODEL_CACHE": str(model_cache)}
    result = subprocess.run(["bash", str(BENCHMARKS / "gpu_check.sh")], env=env, capture_output=True, text=True,
                            timeout=900, check=False)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "== gpu_check: PASS" in result.stdout and "1 passed" in (tmp_path / "pytest.txt").read_text()
    lines = [line for line in (tmp_path / "cache_speedup.json").read_text().splitlines() if line.startswith("{")]
    assert len(lines) == 1
    figures = json.loads(lines[0])
    assert figures["device"] == "cpu" and figures["dtype"] == "bfloat16" and figures["image_size"] == 56
    assert all(run["tokens_equal"] for run in figures["runs"])
