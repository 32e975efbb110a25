"""The compare pipeline at scale: recall → rerank → judge over N generated references, vs judging all N.

Ingests N generated images (distinct colour gradients with noise, 48×48) with a tiny model
(random weights: timings are real, verdicts are not), indexes them with the real default
embedder (ConSE), then runs ONE compare: recall ``--recall-k`` (100) by the candidate image
and the rubric, rerank the best ``--rerank`` (20) with the VLM yes/no scorer, judge
``--top-k`` (3). Judging all N is extrapolated from one compare over ``--judge-sample`` (100)
references named directly (no recall, no rerank, every criterion to the VLM, packages from the
store): the judge's per-reference cost does not depend on N.

Prints ONE JSON line: ingest and index times (one-off, per store), each stage's time, the
pipeline total, the judge-all estimate and their ratio.

    python benchmarks/pipeline.py [--n 10000] [--model tiny-qwen2-vl] [--criteria 3] [--evidence-max-chars N]
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import tempfile
import time

RUBRIC = "warm colours on the left\nsmooth gradient\nsimilar overall brightness"


def _image(seed: int) -> bytes:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    a, b = rng.integers(0, 256, size=(2, 3))
    ramp = np.linspace(0.0, 1.0, 48)[None, :, None]
    pixels = a * (1 - ramp) + b * ramp + rng.normal(0, 12, size=(48, 48, 3))
    buffer = io.BytesIO()
    Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10_000, help="references to ingest (generated)")
    parser.add_argument("--model", default="tiny-qwen2-vl")
    parser.add_argument("--embedder", default="conse")
    parser.add_argument("--recall-k", type=int, default=100)
    parser.add_argument("--rerank", type=int, default=20)
    parser.add_argument("--top-k", type=int, default=3)
    parser.add_argument("--judge-sample", type=int, default=100, help="judge calls measured for the judge-all estimate")
    parser.add_argument("--criteria", type=int, default=3, help="criteria of the rubric (1..3)")
    parser.add_argument("--evidence-max-chars", type=int, default=None, help="bound on each verdict's evidence")
    parser.add_argument("--store", default=None, help="store directory (default: a temporary one)")
    return parser


def _seconds(fn) -> tuple[object, float]:
    began = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - began


def _judge_per_reference_ms(engine, candidate: bytes, ids: list[str], **options) -> float:
    """Judging every reference, measured on ``ids``: one compare over exactly them (no recall, no rerank),
    every criterion put to the VLM, references from their cached packages."""
    _, seconds = _seconds(lambda: engine.compare(candidate, ref_ids=ids, attributes=[], force_vlm=True, **options))
    return seconds * 1000 / len(ids)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its JSON line."""
    parser = _parser()
    args = parser.parse_args(argv)
    if not 1 <= args.criteria <= len(RUBRIC.splitlines()):
        parser.error(f"--criteria 1..{len(RUBRIC.splitlines())}")
    from refsight import Engine

    judging = {"criteria": "\n".join(RUBRIC.splitlines()[: args.criteria]), "evidence_max_chars": args.evidence_max_chars}

    with tempfile.TemporaryDirectory() as tmp, Engine(
        args.store or tmp, model=args.model, embedder=args.embedder
    ) as engine:
        ids = [f"g{i}" for i in range(args.n)]
        added, ingest_s = _seconds(lambda: list(engine.add_many([_image(i) for i in range(args.n)], ids=ids)))
        failed = sum(hasattr(r, "error") for r in added)
        _, index_s = _seconds(engine.index)
        candidate = _image(args.n + 1)
        # Warm the models once (the first forward of a process pays lazy initialisation).
        engine.compare(candidate, top_k=1, rerank=2, recall_k=2, attributes=[], **judging)
        out = engine.compare(
            candidate, top_k=args.top_k, rerank=args.rerank, recall_k=args.recall_k, attributes=[], **judging
        )
        sample = ids[: min(args.judge_sample, args.n)]
        per_ref_ms = _judge_per_reference_ms(engine, candidate, sample, **judging)
    timings = out.timings_ms
    judge_all_ms = per_ref_ms * args.n
    line = {
        "benchmark": "pipeline", "n": args.n, "failed_ingests": failed, "model": out.model,
        "random_weights": out.random_weights, "embedder": args.embedder,
        "recall_k": args.recall_k, "rerank": args.rerank, "top_k": args.top_k, "criteria": args.criteria,
        "ingest_s": round(ingest_s, 1), "index_s": round(index_s, 1),
        "stages": out.stages,
        "stage_ms": {k: v for k, v in timings.items() if k != "total"},
        "pipeline_ms": timings["total"],
        "judge_calls": out.vlm_calls,
        "judge_per_reference_ms": round(per_ref_ms, 1),
        "judge_sample": len(sample),
        "judge_all_ms_extrapolated": round(judge_all_ms, 1),
        "speedup_vs_judge_all": round(judge_all_ms / timings["total"], 1),
    }
    print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
