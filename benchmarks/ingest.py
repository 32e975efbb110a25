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

    python benchmarks/ingest.py [--n 16] [--model shape-smolvlm-256m] [--size 512] [--split]

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


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its JSON line."""
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
    args = parser.parse_args(argv)

    env = {**os.environ, "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        paths = _images(root / "images", args.n, args.size)
        common = ["--model", args.model, "--batch-size", str(args.batch_size)]
        if not args.split and "smolvlm" in args.model:
            common += ["--processor-kwarg", "do_image_splitting=false"]
        print(f"ingest benchmark: {args.n} images of {args.size}² with {args.model}", file=sys.stderr)

        add_wall, _ = _run(["--store", str(root / "add"), "--json", "add", *map(str, paths), *common], env)
        index_wall, _ = _run(["--store", str(root / "add"), "--json", "index"], env)
        walls = {"add": add_wall + index_wall}
        reports = {}
        for name, extra in (("ingest", []), ("ray1", ["--ray", "local", "--actors", "1"]),
                            ("ray2", ["--ray", "local", "--actors", "2"])):
            wall, lines = _run(
                ["--store", str(root / name), "--json", "ingest", str(root / "images"), *common, *extra,
                 "--errors", str(root / f"{name}-errors.jsonl")], env,
            )
            walls[name] = wall
            reports[name] = json.loads(lines[-1])
            assert reports[name]["added"] == args.n and reports[name]["failed"] == 0, reports[name]

    rate = {name: round(args.n / wall, 3) for name, wall in walls.items()}
    one = reports["ray1"]
    # One actor's steady rate: the images it encoded over the time its stages took (the run's wall
    # minus process start, model loads and the hash pass, which a long ingest amortises away).
    stage_s = max(one["wall_s"] - one["hash_s"], 1e-9)
    per_actor = args.n / stage_s
    writer_cap = args.n / max(one["write_s"], 1e-9)
    print(json.dumps({
        "benchmark": "ingest", "model": args.model, "images": args.n, "size": args.size,
        "cpus": os.cpu_count(), "batch_size": args.batch_size, "image_splitting": args.split,
        "load_average_1m": round(os.getloadavg()[0], 2),
        "wall_s": {k: round(v, 2) for k, v in walls.items()},
        "images_per_s": rate,
        "encode_s": {k: r["encode_s"] for k, r in reports.items()},
        "write_s": {k: r["write_s"] for k, r in reports.items()},
        "ingest_over_add": round(rate["ingest"] / rate["add"], 3),
        "ray1_over_ingest": round(rate["ray1"] / rate["ingest"], 3),
        "ray2_over_ray1": round(rate["ray2"] / rate["ray1"], 3),
        "per_actor_images_per_s": round(per_actor, 3),
        "writer_images_per_s": round(writer_cap, 1),
        "estimate_images_per_s_with_gpus": {
            str(g): round(min(g * per_actor, writer_cap), 1) for g in (1, 2, 4, 8)
        },
        "estimate_note": "CPU per-actor rate; a GPU actor is faster by the GPU/CPU encode ratio, still capped by the writer",
    }), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
