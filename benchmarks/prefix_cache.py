"""KV prefix cache: R references, several rubrics × candidates, three paths in one run.

Every request is ``Engine.generate(rubric, ref_ids=R references, candidate=image)`` (the
references first, so the prompt opens with a reference prefix), greedy, the same requests
on each path, interleaved per request so machine load hits every path alike:

- ``fresh_ms``: no caches (``use_cache=False``): every reference re-encoded from its image and
  prefilled, every request;
- ``package_ms``: the encoder cache only (``prefix_states=False``): reference packages from the
  store, the language model still prefills every reference token;
- ``prefix_ms``: encoder + KV prefix cache: the references' prefix state (built once, before
  the timed requests; its cost is ``prefix_build_ms``) is copied in and only the candidate and
  rubric are prefilled. Each candidate is encoded once before the timed requests (memory
  tier), so the package and prefix paths differ in the prefix alone;
- ``candidate_only_ms``: inside the same prefix calls, the candidate's encode plus the
  language model's own work (suffix prefill and decode), i.e. the prefix path less the package
  and state loading and the copy (``prefix_load_ms``).

Targets: ``prefix_over_candidate_only`` ≤ 1.2 and ``package_over_prefix`` ≥ 2. Also reported:
bytes of prefix state per prefix token, whether the three paths' greedy tokens agree, and the
time of one request whose state comes from disk (memory tier dropped). Weights are random.

    python benchmarks/prefix_cache.py                       # shape-qwen2-vl-2b-full, 448², R=4, 3×2
    python benchmarks/prefix_cache.py --dtype bfloat16 --rubrics 1 --candidates 1
    python benchmarks/prefix_cache.py --model tiny-qwen2-vl --size 64 --max-new-tokens 4

Prints ONE JSON line; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time

RUBRICS = (
    "Criteria: 1. the same colour. 2. the same shape. Answer match, mismatch or uncertain for each.",
    "Does the candidate show the same kind of object as the references? Answer yes or no, then why.",
    "List the visible differences between the candidate and the references.",
)
REFERENCES = ("chelsea", "coffee", "astronaut", "rocket", "flower", "horse")
CANDIDATES = ("china", "horse", "flower")


def _photo(name: str, size: int):
    from refsight.inputs.images import load_image
    from refsight.samples import load_sample

    return load_image(load_sample(name, (size, size)), name=f"{name}-{size}")


def _log(message: str) -> None:
    print(f"[prefix_cache] {message}", file=sys.stderr, flush=True)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="shape-qwen2-vl-2b-full")
    parser.add_argument("--size", type=int, default=448, help="edge of every (square) image")
    parser.add_argument("--refs", type=int, default=4)
    parser.add_argument("--rubrics", type=int, default=3)
    parser.add_argument("--candidates", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=8)
    parser.add_argument("--dtype", default=None, help="model dtype (default: the backend's: float32 on the CPU)")
    parser.add_argument("--device", default=None)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    return parser


#: The three paths: (use_cache, prefix_states).
PATHS = {"fresh": (False, False), "package": (True, False), "prefix": (True, True)}


class _Paths:
    """Totals of the three paths over the same requests, and what the prefix calls report inside."""

    def __init__(self) -> None:
        self.totals = {path: 0.0 for path in PATHS}
        self.tokens: dict[str, list] = {path: [] for path in PATHS}
        self.candidate_only = self.load_ms = 0.0
        self.prefix_tokens = 0

    def add(self, path: str, ms: float, out) -> None:
        self.totals[path] += ms
        self.tokens[path].append(out.tokens)
        if path != "prefix":
            return
        if not out.prefix_tokens_reused:
            raise SystemExit("the prefix path did not reuse the prefix state")
        t = out.timings_ms
        self.candidate_only += t["encode"] + t["generate"] - t.get("prefix_build", 0.0) - t.get("prefix_load", 0.0)
        self.load_ms += t.get("prefix_load", 0.0)
        self.prefix_tokens = max(self.prefix_tokens, out.prefix_tokens_reused)


def _timed(engine, rubric: str, ids: list[str], candidate, **options):
    began = time.perf_counter()
    out = engine.generate(rubric, ref_ids=ids, candidate=candidate, **options)
    return out, (time.perf_counter() - began) * 1000


def _build_states(engine, ids: list[str], candidates: list) -> float:
    """Build the prefix state once (as the first request over these references does) and put each
    candidate in the memory tier, so the package and prefix paths then start alike; the build ms."""
    build_ms = 0.0
    for candidate in candidates:
        warm = engine.generate("Warm-up.", ref_ids=ids, candidate=candidate, max_new_tokens=1)
        build_ms += warm.timings_ms.get("prefix_build", 0.0)
    _log(f"prefix state built in {build_ms:.0f} ms")
    return build_ms


def _measure(engine, ids: list[str], candidates: list, rubrics: list[str], max_new_tokens: int) -> _Paths:
    """Every (candidate, rubric) request on each path in turn, so machine load hits every path alike."""
    paths = _Paths()
    for c, candidate in enumerate(candidates):
        for r, rubric in enumerate(rubrics):
            for path, (use_cache, use_kv) in PATHS.items():
                out, ms = _timed(engine, rubric, ids, candidate, use_cache=use_cache, prefix_states=use_kv,
                                 max_new_tokens=max_new_tokens)
                paths.add(path, ms, out)
                _log(f"candidate {c} rubric {r} {path}: {ms:.0f} ms")
    return paths


def _figures(paths: _Paths, build_ms: float, disk, disk_ms: float, state_bytes: int | None, stats) -> dict:
    totals, candidate_only = paths.totals, paths.candidate_only
    per_token = round(state_bytes / paths.prefix_tokens, 1) if state_bytes and paths.prefix_tokens else None
    return {
        "fresh_ms": round(totals["fresh"], 1), "package_ms": round(totals["package"], 1),
        "prefix_ms": round(totals["prefix"], 1), "candidate_only_ms": round(candidate_only, 1),
        "prefix_load_ms": round(paths.load_ms, 1),
        "package_over_prefix": round(totals["package"] / totals["prefix"], 3),
        "prefix_over_candidate_only": round(totals["prefix"] / candidate_only, 3),
        "fresh_over_prefix": round(totals["fresh"] / totals["prefix"], 3),
        "prefix_build_ms": round(build_ms, 1),
        "prefix_from_disk_ms": round(disk_ms, 1), "prefix_from_disk_tokens_reused": disk.prefix_tokens_reused,
        "prefix_tokens": paths.prefix_tokens or None,
        "prompt_tokens": disk.prompt_tokens,
        "prefix_state_bytes": state_bytes,
        "prefix_bytes_per_token": per_token,
        "prefix_hits": stats.prefix_hits, "prefix_misses": stats.prefix_misses,
        "tokens_identical": {
            "package_vs_fresh": paths.tokens["package"] == paths.tokens["fresh"],
            "prefix_vs_package": paths.tokens["prefix"] == paths.tokens["package"],
        },
        "targets_met": {
            "prefix_le_1.2x_candidate_only": totals["prefix"] <= 1.2 * candidate_only,
            "package_over_prefix_ge_2": totals["package"] / totals["prefix"] >= 2,
        },
    }


def main(argv: list[str] | None = None) -> dict:
    """Run the benchmark, print its JSON line and return it."""
    parser = _parser()
    args = parser.parse_args(argv)
    if not 1 <= args.refs <= 4 or not 1 <= args.rubrics <= len(RUBRICS) or not 1 <= args.candidates <= 2:
        parser.error("--refs 1..4, --rubrics 1..3, --candidates 1..2")
    import torch

    from refsight import Engine
    from refsight.backends.options import BackendOptions

    if args.threads:
        torch.set_num_threads(args.threads)
    refs = [_photo(n, args.size) for n in REFERENCES[: args.refs]]
    candidates = [_photo(n, args.size) for n in CANDIDATES[: args.candidates]]
    rubrics = list(RUBRICS[: args.rubrics])
    with tempfile.TemporaryDirectory(prefix="refsight-prefix-bench-") as root:
        options = BackendOptions(dtype=args.dtype, device=args.device)
        with Engine(root, model=args.model, backend_options=options) as engine:
            backend = engine.backend()
            dtype, device = backend.fingerprint().dtype, getattr(backend, "device", None)
            _log(f"loaded {args.model} ({dtype} on {device})")
            ids = [f"ref-{i}" for i in range(len(refs))]
            for result in engine.add_many(refs, ids=ids):
                _log(f"added {result.ref_id}")
            build_ms = _build_states(engine, ids, candidates)
            paths = _measure(engine, ids, candidates, rubrics, args.max_new_tokens)
            # The one state's tensor bytes (the memory tier holds exactly it), then a request whose
            # state comes from disk, as a new process would see it.
            one_state = engine.store.prefixes.stats()["prefixes"] == 1
            state_bytes = engine.store.prefixes.memory_used if one_state else None
            engine.store.prefixes.clear_memory()
            disk, disk_ms = _timed(engine, rubrics[0], ids, candidates[0], max_new_tokens=args.max_new_tokens)
            stats = engine.stats()
    figures = {
        "model": args.model, "dtype": dtype, "device": None if device is None else str(device),
        "threads": torch.get_num_threads(), "size": args.size, "refs": args.refs, "rubrics": len(rubrics),
        "candidates": len(candidates), "requests": len(candidates) * len(rubrics), "max_new_tokens": args.max_new_tokens,
        **_figures(paths, build_ms, disk, disk_ms, state_bytes, stats),
        "random_weights": bool(backend.random_weights),
    }
    print(json.dumps(figures))
    return figures


if __name__ == "__main__":
    main()
