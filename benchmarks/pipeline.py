"""The compare pipeline at scale: recall → rerank → judge over N generated references, vs judging all N.

Ingests N generated images (distinct colour gradients with noise, 48×48) with a tiny model
(random weights: timings are real, verdicts are not), indexes them with the real default
embedder (ConSE), then runs ONE compare: recall ``--recall-k`` (100) by the candidate image
and the rubric, rerank the best ``--rerank`` (20) with the VLM yes/no scorer, judge
``--top-k`` (3). Judging all N is extrapolated from ``--judge-sample`` (100) measured judge
calls over cached packages (the judge's per-reference cost does not depend on N).

Prints ONE JSON line: ingest and index times (one-off, per store), each stage's time, the
pipeline total, the judge-all estimate and their ratio.

    python benchmarks/pipeline.py [--n 10000] [--model tiny-qwen2-vl]
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


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10_000, help="references to ingest (generated)")
    parser.add_argument("--model", default="tiny-qwen2-vl")
    parser.add_argument("--embedder", default="conse")
    parser.add_argument("--recall-k", type=int, default=100)
    parser.add_argument("--rerank", type=int, default=20)
    parser.add_argument("--top-k", type=int, default=3)
    parser.add_argument("--judge-sample", type=int, default=100, help="judge calls measured for the judge-all estimate")
    parser.add_argument("--store", default=None, help="store directory (default: a temporary one)")
    args = parser.parse_args(argv)

    from refsight import Engine
    from refsight.judge import Judge, parse_rubric

    with tempfile.TemporaryDirectory() as tmp, Engine(
        args.store or tmp, model=args.model, embedder=args.embedder
    ) as engine:
        began = time.perf_counter()
        images = (_image(i) for i in range(args.n))
        failed = sum(hasattr(r, "error") for r in engine.add_many(list(images), ids=[f"g{i}" for i in range(args.n)]))
        ingest_s = time.perf_counter() - began
        began = time.perf_counter()
        engine.index()
        index_s = time.perf_counter() - began

        candidate = _image(args.n + 1)
        # Warm the models once (the first forward of a process pays lazy initialisation).
        engine.compare(candidate, criteria=RUBRIC, top_k=1, rerank=2, recall_k=2, attributes=[])
        out = engine.compare(
            candidate, criteria=RUBRIC, top_k=args.top_k, rerank=args.rerank, recall_k=args.recall_k, attributes=[]
        )

        # Judging every reference: measure judge calls over cached packages, extrapolate to N.
        backend = engine.backend()
        refs = [engine.reference(f"g{i}") for i in range(min(args.judge_sample, args.n))]
        packages = [engine.packages.model_image(engine.context(), ref).item for ref in refs]
        cand = engine.packages.model_image(engine.context(), engine_image(candidate)).item
        judge = Judge(backend, force_vlm=True)
        began = time.perf_counter()
        judge.judge([(r.ref_id, p, None) for r, p in zip(refs, packages)], cand, parse_rubric(RUBRIC))
        per_ref_ms = (time.perf_counter() - began) * 1000 / len(refs)

    timings = out.timings_ms
    judge_all_ms = per_ref_ms * args.n
    line = {
        "benchmark": "pipeline",
        "n": args.n,
        "failed_ingests": failed,
        "model": out.model,
        "random_weights": out.random_weights,
        "embedder": args.embedder,
        "recall_k": args.recall_k,
        "rerank": args.rerank,
        "top_k": args.top_k,
        "ingest_s": round(ingest_s, 1),
        "index_s": round(index_s, 1),
        "stages": out.stages,
        "stage_ms": {k: v for k, v in timings.items() if k != "total"},
        "pipeline_ms": timings["total"],
        "judge_calls": out.vlm_calls,
        "judge_per_reference_ms": round(per_ref_ms, 1),
        "judge_sample": len(refs),
        "judge_all_ms_extrapolated": round(judge_all_ms, 1),
        "speedup_vs_judge_all": round(judge_all_ms / timings["total"], 1),
    }
    print(json.dumps(line), flush=True)
    return 0


def engine_image(data: bytes):
    """The candidate bytes as an ImageInput (the judge-all baseline uses the same candidate package)."""
    from refsight.images import load_image

    return load_image(data)


if __name__ == "__main__":
    sys.exit(main())
