"""Run a ``benchmarks/`` script as users do (its own process) and read its ONE JSON line.

Every benchmark prints exactly one JSON line on stdout (progress goes to stderr); a smoke
test runs it at a tiny size and checks the keys, so no script can rot unnoticed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def run_benchmark(script: str, *args: str, timeout: float = 600, env: dict[str, str] | None = None) -> dict[str, Any]:
    """``python benchmarks/SCRIPT ARGS``: exit 0 and one JSON line on stdout, returned as a dict."""
    result = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *args], capture_output=True, text=True, timeout=timeout,
        check=False, env={**os.environ, "HF_HUB_DISABLE_PROGRESS_BARS": "1", **(env or {})},
    )
    assert result.returncode == 0, f"{script} exited {result.returncode}:\n{result.stderr[-4000:]}"
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 1, f"{script} printed {len(lines)} lines, not one JSON line:\n{result.stdout[-2000:]}"
    return json.loads(lines[0])


def assert_keys(figures: dict[str, Any], *keys: str) -> None:
    """Every key is present (a benchmark's documented figures)."""
    missing = [key for key in keys if key not in figures]
    assert not missing, f"missing keys {missing} in {sorted(figures)}"
