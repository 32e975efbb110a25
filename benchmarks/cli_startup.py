"""How long do the commands that need no model take, against Python itself and a command that loads one?

Makes a store of ``--refs`` references (the toy encoder, no model weights), then times, as a user
runs them (a fresh ``python -m refsight.cli`` process each, medians over ``--repeats``):

- ``baseline_ms``: ``python -c pass`` (the interpreter's own start-up);
- ``commands_ms``: ``list``, ``show``, ``stats``, ``models``, ``prune --dry-run``, ``gc`` (no model:
  no torch, no transformers);
- ``text_search_ms``: ``search TEXT`` (torch and all-MiniLM-L6-v2 in plain torch: no VLM, no
  transformers, no image model); ``text_search_vs_target``: it / 2,500 ms (issue 40's target);
- ``cached_add_ms``: ``add`` of an image whose package ``--model`` (default ``tiny-qwen2-vl``) already
  stored; ``cached_add_vs_target``: it / 1,500 ms. It loads no VLM: the package key's fingerprint is
  the one recorded when the model last loaded (:mod:`refsight.backends.fingerprint_record`);
- ``model_loading_ms``: ``add`` of an image whose package is not stored yet (the VLM loads and encodes it);
- ``ratio_vs_python``: the slowest model-free command / ``baseline_ms``;
- ``ratio_vs_model_loading``: the slowest model-free command / ``model_loading_ms`` (well below 1:
  a cheap command does not pay for the model stack).

Prints ONE JSON line. Usage: ``python benchmarks/cli_startup.py [--refs N] [--repeats N] [--model NAME]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from PIL import Image

#: The model-free commands and their arguments (``{ref}``: a reference id in the store).
COMMANDS = {
    "list": ["list"], "show": ["show", "{ref}"], "stats": ["stats"], "models": ["models"],
    "prune_dry_run": ["prune", "--dry-run"], "gc": ["gc"],
}


def timed(argv: list[str], env: dict[str, str]) -> float:
    """Milliseconds one process takes, start to exit (it must succeed)."""
    started = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    return (time.perf_counter() - started) * 1000


def median_ms(argv: list[str], env: dict[str, str], repeats: int) -> float:
    """The median of ``repeats`` runs of ``argv``, rounded to 0.1 ms."""
    return round(statistics.median(timed(argv, env) for _ in range(repeats)), 1)


def make_store(root: Path, refs: int, env: dict[str, str]) -> list[str]:
    """A store of ``refs`` small images added with the toy encoder; their ids."""
    paths = []
    for i in range(refs):
        path = root / f"ref{i}.png"
        Image.new("RGB", (32, 32), (i * 37 % 256, i * 91 % 256, 128)).save(path)
        paths.append(str(path))
    cli = [sys.executable, "-m", "refsight.cli", "--store", str(root / "store")]
    subprocess.run([*cli, "add", *paths, "--model", "toy", "--attributes", "none"], check=True,
                   stdout=subprocess.DEVNULL, env=env)
    return [Path(p).stem for p in paths]


#: Issue 40's targets for a newcomer's machine (ms, end to end).
TARGETS_MS = {"text_search": 2500.0, "cached_add": 1500.0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--refs", type=int, default=20, help="references in the store")
    parser.add_argument("--repeats", type=int, default=5, help="runs per command (the median is kept)")
    parser.add_argument("--model", default="tiny-qwen2-vl", help="the VLM of the cached add")
    args = parser.parse_args()
    if args.refs < 2 or args.repeats < 1:
        parser.error("--refs must be at least 2 (one cached add, one that loads the model) and --repeats at least 1")
    env = {**os.environ, "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    with tempfile.TemporaryDirectory(prefix="refsight-cli-startup-") as tmp:
        root = Path(tmp)
        ids = make_store(root, args.refs, env)
        cli = [sys.executable, "-m", "refsight.cli", "--store", str(root / "store")]
        baseline = median_ms([sys.executable, "-c", "pass"], env, args.repeats)
        commands = {
            name: median_ms([*cli, *(a.format(ref=ids[0]) for a in argv)], env, args.repeats)
            for name, argv in COMMANDS.items()
        }
        subprocess.run([*cli, "index"], check=True, stdout=subprocess.DEVNULL, env=env)  # vectors: once, ever
        text_search = median_ms([*cli, "search", "a photo"], env, max(1, args.repeats // 2))
        add = [*cli, "add", str(root / "ref0.png"), "--id", ids[0], "--model", args.model, "--attributes", "none"]
        subprocess.run(add, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)  # encodes it
        cached_add = median_ms(add, env, max(1, args.repeats // 2))
        # Each of the other references once: its package is not stored for this model, so the VLM loads.
        loads = [[*cli, "add", str(root / f"{ref}.png"), "--id", ref, "--model", args.model, "--attributes", "none"]
                 for ref in ids[1:1 + max(1, args.repeats // 2)]]
        model_loading = round(statistics.median(timed(argv, env) for argv in loads), 1)
    slowest = max(commands.values())
    print(json.dumps({
        "refs": args.refs, "repeats": args.repeats, "model": args.model, "baseline_ms": baseline,
        "commands_ms": commands, "slowest_ms": slowest, "text_search_ms": text_search, "cached_add_ms": cached_add,
        "model_loading_ms": model_loading, "text_search_vs_target": round(text_search / TARGETS_MS["text_search"], 3),
        "cached_add_vs_target": round(cached_add / TARGETS_MS["cached_add"], 3),
        "ratio_vs_python": round(slowest / baseline, 2), "ratio_vs_model_loading": round(slowest / model_loading, 3),
        "cpu_count": os.cpu_count(),
    }))


if __name__ == "__main__":
    main()
