"""benchmarks/codec.py runs end to end at a tiny size: one tiny model's packages and prefix state, the real features."""

from __future__ import annotations

from benchmark_runner import assert_keys, run_benchmark


def test_codec_prints_ratio_and_ms_per_kind_per_candidate_and_the_choice():
    figures = run_benchmark("codec.py", "--models", "tiny-qwen2-vl:bfloat16", "--size", "64", "--repeats", "1")
    assert_keys(figures, "kinds", "choices", "overall", "store", "bar_mb_s", "read_tie", "write_floor_mb_s",
                "random_weights")
    assert {"package bf16", "kv bf16", "real features f32 (block)", "real features bf16 (head)"} <= set(figures["kinds"])
    assert figures["random_weights"] is True  # said so: the tiny model's weights are random
    for kind, entry in figures["kinds"].items():
        assert_keys(entry, "mb", "sources", "candidates", "choice", "store")
        assert {"zstd-1", "shuffle+zstd-1", "bitshuffle+zstd-1", "adaptive+zstd-1"} <= set(entry["candidates"]), kind
        for name, f in (*entry["candidates"].items(), ("store", entry["store"])):
            assert f["ratio"] > 0 and f["compress_ms_per_mb"] >= 0 and f["decompress_ms_per_mb"] >= 0, (kind, name)
            assert f["read_mb_s"] > 0, (kind, name)
        assert entry["choice"] == "raw" or entry["choice"] in entry["candidates"]
    assert figures["overall"] in figures["kinds"]["package bf16"]["candidates"]
