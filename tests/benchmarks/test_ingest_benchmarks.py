"""The ingest benchmarks run end to end at a tiny size: bulk ingest (in-process and on Ray) and the
recall → rerank → judge pipeline against judging every reference."""

from __future__ import annotations

from benchmark_runner import assert_keys, run_benchmark


def test_ingest_benchmark_on_two_images(model_cache):
    # In-process and one Ray actor: the two ingest paths (`refsight add` has tests of its own).
    figures = run_benchmark("ingest.py", "--n", "2", "--size", "64", "--model", "tiny-qwen2-vl", "--batch-size", "2",
                            "--runs", "ingest,ray1", timeout=900)
    assert_keys(figures, "wall_s", "images_per_s", "encode_s", "write_s", "ray1_over_ingest",
                "per_actor_images_per_s", "writer_images_per_s", "estimate_images_per_s_with_gpus")
    assert set(figures["wall_s"]) == {"ingest", "ray1"} and "ingest_over_add" not in figures
    assert figures["images"] == 2


def test_pipeline_benchmark_on_eight_references(model_cache):
    figures = run_benchmark("pipeline.py", "--n", "8", "--recall-k", "4", "--rerank", "2", "--top-k", "1",
                            "--judge-sample", "1", "--criteria", "1", "--evidence-max-chars", "4")
    assert_keys(figures, "ingest_s", "index_s", "stages", "stage_ms", "pipeline_ms", "judge_calls",
                "judge_per_reference_ms", "judge_all_ms_extrapolated", "speedup_vs_judge_all")
    assert figures["failed_ingests"] == 0 and figures["random_weights"] is True
    assert figures["stages"] == {"recalled": 4, "filtered": 0, "reranked": 2, "judged": 1}
