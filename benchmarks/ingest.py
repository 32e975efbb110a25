"""Bulk ingest throughput: ``refsight add`` vs ``refsight ingest`` in-process vs ``ingest --ray`` with 1 and 2 actors.

Generates N distinct 512×512 JPEGs (colour gradients with noise), then runs, each as the real
command in its own process on a fresh store, in ONE run so the ratios share the machine's load:

- ``add``: ``refsight add`` over the files (one process; it stores the package and the ImageNet
  record), then ``refsight index`` (the retrieval vectors), so it ends where an ingest ends;
- ``ingest``: ``refsight ingest DIR`` in-process (the same stage code, no Ray);
- ``ray1`` / ``ray2``: ``refsight ingest DIR --ray local --actors 1|2`` (a local Ray instance).

Prints ONE JSON line: wall seconds and images/s of each (process start and model loads
included: what a user waits for), the ingest reports' encode and write seconds, the ratios, and a
scaling estimate for N GPU actors from the per-actor figures: each actor's steady rate is
``images / (encode_s + other stage work)``, bounded by the one writer's rate ``images / write_s``.

    python benchmarks/ingest.py [--n 16] [--model shape-smolvlm-256m] [--size 512] [--split] [--runs add,ingest,ray1,ray2]

Each ratio (``ingest_over_add``, ``ray1_over_ingest``, ``ray2_over_ray1``) is reported when both its
runs ran, the per-actor estimates when ``ray1`` ran.

The default 16 images take about 13 minutes on 2 busy cores (load average ~12).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _images(directory: Path, n: int, size: int) -> list[Path]:
    import numpy as np
    from PIL import Image

    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    ramp = np.linspace(0.0, 1.0, size)[None, :, None]
    paths = []
    for i in range(n):
        a, b = rng.integers(0, 256, size=(2, 3))
        pixels = a * (1 - ramp) + b * ramp + rng.normal(0, 12, size=(size, size, 3))
        path = directory / f"ref{i:05d}.jpg"
        Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(path, quality=90)
        paths.append(path)
    return paths


def _run(args: list[str], env: dict[str, str]) -> tuple[float, list[str]]:
    """Wall seconds of one ``refsight`` command and its stdout lines (stderr passes through)."""
    clock = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "refsight.cli", *args], env=env, stdout=subprocess.PIPE, text=True)
    wall = time.perf_counter() - clock
    if done.returncode != 0:
        raise SystemExit(f"refsight {' '.join(args[:3])} … exited with {done.returncode}")
    return wall, done.stdout.splitlines()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=16, help="images to ingest (generated)")
    parser.add_argument("--size", type=int, default=512, help="image side in pixels")
    parser.add_argument("--model", default="shape-smolvlm-256m")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument(
        "--split", action="store_true",
        help="keep SmolVLM's image splitting: a 512² image is upscaled to 2048 and encoded as 16 tiles plus a "
        "global one (about 17x the encode work of the default here, one 512² tile per image)",
    )
    parser.add_argument("--runs", default=",".join(RUNS), help=f"comma-separated, of {', '.join(RUNS)} (default: all)")
    return parser


#: The ingest runs, each on a fresh store: in-process, then on a local Ray instance with 1 and 2 actors.
INGESTS = {"ingest": [], "ray1": ["--ray", "local", "--actors", "1"], "ray2": ["--ray", "local", "--actors", "2"]}
#: Every run: ``add`` (then ``index``) and the ingests.
RUNS = ("add", *INGESTS)
#: The ratios reported, each when both its runs ran: (key, faster run, baseline run).
RATIOS = (("ingest_over_add", "ingest", "add"), ("ray1_over_ingest", "ray1", "ingest"), ("ray2_over_ray1", "ray2", "ray1"))


def _run_all(root: Path, args, env: dict[str, str]) -> tuple[dict[str, float], dict[str, dict]]:
    """``refsight add`` + ``index``, then every ingest run: (wall seconds, ingest reports) by run name."""
    _images(root / "images", args.n, args.size)
    paths = sorted(str(p) for p in (root / "images").iterdir())
    common = ["--model", args.model, "--batch-size", str(args.batch_size)]
    if not args.split and "smolvlm" in args.model:
        common += ["--processor-kwarg", "do_image_splitting=false"]
    print(f"ingest benchmark: {args.n} images of {args.size}² with {args.model}", file=sys.stderr)
    walls, reports = {}, {}
    if "add" in args.runs:
        add_wall, _ = _run(["--store", str(root / "add"), "--json", "add", *paths, *common], env)
        index_wall, _ = _run(["--store", str(root / "add"), "--json", "index"], env)
        walls["add"] = add_wall + index_wall
    for name in (run for run in args.runs if run in INGESTS):
        walls[name], lines = _run(
            ["--store", str(root / name), "--json", "ingest", str(root / "images"), *common, *INGESTS[name],
             "--errors", str(root / f"{name}-errors.jsonl")], env,
        )
        reports[name] = json.loads(lines[-1])
        assert reports[name]["added"] == args.n and reports[name]["failed"] == 0, reports[name]
    return walls, reports


def _actor_estimates(n: int, one: dict) -> dict:
    """The scaling estimate from the one-actor run: each actor's steady rate, capped by the one writer."""
    # One actor's steady rate: the images it encoded over the time its stages took (the run's wall
    # minus process start, model loads and the hash pass, which a long ingest amortises away).
    per_actor = n / max(one["wall_s"] - one["hash_s"], 1e-9)
    writer_cap = n / max(one["write_s"], 1e-9)
    return {
        "per_actor_images_per_s": round(per_actor, 3),
        "writer_images_per_s": round(writer_cap, 1),
        "estimate_images_per_s_with_gpus": {str(g): round(min(g * per_actor, writer_cap), 1) for g in (1, 2, 4, 8)},
        "estimate_note": "CPU per-actor rate; a GPU actor is faster by the GPU/CPU encode ratio, still capped by the writer",
    }


def _figures(args, walls: dict[str, float], reports: dict[str, dict]) -> dict:
    rate = {name: round(args.n / wall, 3) for name, wall in walls.items()}
    return {
        "benchmark": "ingest", "model": args.model, "images": args.n, "size": args.size,
        "cpus": os.cpu_count(), "batch_size": args.batch_size, "image_splitting": args.split,
        "load_average_1m": round(os.getloadavg()[0], 2),
        "wall_s": {k: round(v, 2) for k, v in walls.items()},
        "images_per_s": rate,
        "encode_s": {k: r["encode_s"] for k, r in reports.items()},
        "write_s": {k: r["write_s"] for k, r in reports.items()},
        **{key: round(rate[a] / rate[b], 3) for key, a, b in RATIOS if a in rate and b in rate},
        **(_actor_estimates(args.n, reports["ray1"]) if "ray1" in reports else {}),
    }


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its JSON line."""
    parser = _parser()
    args = parser.parse_args(argv)
    args.runs = [run for run in args.runs.split(",") if run]
    if not args.runs or any(run not in RUNS for run in args.runs):
        parser.error(f"--runs takes names of {', '.join(RUNS)}")
    env = {**os.environ, "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    with tempfile.TemporaryDirectory() as tmp:
        walls, reports = _run_all(Path(tmp), args, env)
    print(json.dumps(_figures(args, walls, reports)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
