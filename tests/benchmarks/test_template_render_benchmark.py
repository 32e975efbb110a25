"""template_render.py runs end to end at a tiny size: a render's cost in the bounded renderer against the same render
in this process, one JSON line (the same text both ways: the script asserts it). Wall-clock figures on a shared
machine: only their shape is checked here."""

from __future__ import annotations

import math

from benchmark_runner import assert_keys, run_benchmark


def test_template_render_benchmark_prints_each_case():
    figures = run_benchmark("template_render.py", "--renders", "20")
    for case in ("short", "long"):
        assert_keys(figures, f"{case}_inprocess_us", f"{case}_worker_us", f"{case}_overhead_us", f"{case}_ratio",
                    f"{case}_again_us")
        assert math.isfinite(figures[f"{case}_ratio"]) and figures[f"{case}_worker_us"] > 0
    assert figures["worker_start_ms"] > 0
