"""KV prefix cache: R references, several rubrics × candidates, three paths in one run.

Every request is ``Engine.generate(rubric, ref_ids=R references, candidate=image)`` (the
references first, so the prompt opens with a reference prefix), greedy, the same requests
on each path, interleaved per request so machine load hits every path alike:

- ``fresh_ms``: no caches (``use_cache=False``): every reference re-encoded from its image and
  prefilled, every request;
- ``package_ms``: the encoder cache only (``use_kv_cache=False``): reference packages from the
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
    from refsight.images import load_image
    from refsight.samples import load_sample

    return load_image(load_sample(name, (size, size)), name=f"{name}-{size}")


def _log(message: str) -> None:
    print(f"[prefix_cache] {message}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> dict:
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
            began = time.perf_counter()
            backend = engine.backend()
            _log(f"loaded {args.model} ({backend.dtype_name} on {backend.device}) in {time.perf_counter() - began:.1f} s")
            ids = [f"ref-{i}" for i in range(len(refs))]
            for result in engine.add_many(refs, ids=ids):
                _log(f"added {result.ref_id}")
            # Build the prefix state once, as the first request over these references does, and encode
            # each candidate once into the memory tier: the package and prefix paths then start alike.
            build_ms = 0.0
            for candidate in candidates:
                warm = engine.generate("Warm-up.", ref_ids=ids, candidate=candidate, max_new_tokens=1)
                build_ms += warm.timings_ms.get("prefix_build", 0.0)
            _log(f"prefix state built in {build_ms:.0f} ms")
            totals = {"fresh": 0.0, "package": 0.0, "prefix": 0.0}
            candidate_only = load_ms = 0.0
            tokens: dict[str, list] = {k: [] for k in totals}
            paths = {"fresh": (False, False), "package": (True, False), "prefix": (True, True)}
            for c, candidate in enumerate(candidates):
                for r, rubric in enumerate(rubrics):
                    for path, (use_cache, use_kv) in paths.items():
                        began = time.perf_counter()
                        out = engine.generate(
                            rubric, ref_ids=ids, candidate=candidate, use_cache=use_cache, use_kv_cache=use_kv,
                            max_new_tokens=args.max_new_tokens,
                        )
                        ms = (time.perf_counter() - began) * 1000
                        totals[path] += ms
                        tokens[path].append(out.tokens)
                        if path == "prefix":
                            t = out.timings_ms
                            candidate_only += t["encode"] + t["generate"] - t.get("prefix_build", 0.0) - t.get("prefix_load", 0.0)
                            load_ms += t.get("prefix_load", 0.0)
                            if not out.prefix_tokens_reused:
                                raise SystemExit("the prefix path did not reuse the prefix state")
                        _log(f"candidate {c} rubric {r} {path}: {ms:.0f} ms")
            # One more request whose state comes from disk (a new process would see this).
            engine.store.prefixes.clear_memory()
            began = time.perf_counter()
            disk = engine.generate(rubrics[0], ref_ids=ids, candidate=candidates[0], max_new_tokens=args.max_new_tokens)
            disk_ms = (time.perf_counter() - began) * 1000
            files = list((engine.store.root / "prefixes").glob("*/*.safetensors"))
            stored = engine.store.prefixes.get(files[0].name.removesuffix(".safetensors")) if len(files) == 1 else None
            stats = engine.stats()
    n = len(candidates) * len(rubrics)
    figures = {
        "model": args.model, "dtype": backend.dtype_name, "device": backend.device, "threads": torch.get_num_threads(),
        "size": args.size, "refs": args.refs, "rubrics": len(rubrics), "candidates": len(candidates), "requests": n,
        "max_new_tokens": args.max_new_tokens,
        "fresh_ms": round(totals["fresh"], 1), "package_ms": round(totals["package"], 1),
        "prefix_ms": round(totals["prefix"], 1), "candidate_only_ms": round(candidate_only, 1),
        "prefix_load_ms": round(load_ms, 1),
        "package_over_prefix": round(totals["package"] / totals["prefix"], 3),
        "prefix_over_candidate_only": round(totals["prefix"] / candidate_only, 3),
        "fresh_over_prefix": round(totals["fresh"] / totals["prefix"], 3),
        "prefix_build_ms": round(build_ms, 1),
        "prefix_from_disk_ms": round(disk_ms, 1), "prefix_from_disk_tokens_reused": disk.prefix_tokens_reused,
        "prefix_tokens": stored.tokens if stored else None,
        "prompt_tokens": disk.prompt_tokens,
        "prefix_state_bytes": stored.nbytes if stored else None,
        "prefix_bytes_per_token": round(stored.nbytes / stored.tokens, 1) if stored else None,
        "prefix_hits": stats.prefix_hits, "prefix_misses": stats.prefix_misses,
        "tokens_identical": {
            "package_vs_fresh": tokens["package"] == tokens["fresh"],
            "prefix_vs_package": tokens["prefix"] == tokens["package"],
        },
        "targets_met": {
            "prefix_le_1.2x_candidate_only": totals["prefix"] <= 1.2 * candidate_only,
            "package_over_prefix_ge_2": totals["package"] / totals["prefix"] >= 2,
        },
        "random_weights": bool(backend.random_weights),
    }
    print(json.dumps(figures))
    return figures


if __name__ == "__main__":
    main()
