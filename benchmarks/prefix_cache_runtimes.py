"""KV prefix cache on llama.cpp and vLLM: R references, several rubrics × candidates, one JSON line.

The judge's layout (references first, then the candidate and the rubric), greedy, in one run:

- llama.cpp (a built-in ``*-gguf`` model, or ``llamacpp:M.gguf --mmproj P.gguf``):
  ``fresh_ms`` (every image from pixels, no caches), ``package_ms`` (reference packages,
  no prefix state), ``prefix_ms`` (packages + the reference prefix's sequence state in a
  store's prefix cache; the first request builds it), ``candidate_only_ms`` (inside the
  same prefix calls: everything but loading the state, i.e. the non-prefix prefill and
  decoding), their ratios, ``tokens_equal`` across the three paths and
  ``prefix_bytes_per_token`` (state bytes per prefix token). As in ``prefix_cache.py`` (the
  transformers figure) and as a compare runs its rubrics, each candidate is encoded once
  before the timed package and prefix requests, so those two paths differ in the prefix alone.
- vLLM (``vllm:URL``), every request through the backend's ``generate``: ``package_ms``
  (packages sent as embeddings, each request opening with a line of its own, so it shares no
  KV block with any other: vLLM hashes blocks as a chain from the prompt's start) against
  ``prefix_ms`` (the same requests opening with one fixed line: vLLM's automatic prefix
  caching serves the reference prefix), ``prefix_cache_hit_rate`` (vLLM's ``/metrics``
  counters over the prefix run, in tokens; whole KV blocks only, 128 tokens on a CPU) and
  ``tokens_equal`` (the prefix run repeated gives the same tokens, request by request: its
  first request computed the prefix, the repeat reads it from the cache).

    python benchmarks/prefix_cache_runtimes.py --model shape-qwen2-vl-2b-gguf --size 224
    python benchmarks/prefix_cache_runtimes.py --model vllm:http://127.0.0.1:8000 --encoder tiny-qwen2-vl-vllm

Weights are random: the timings are real, the text is not.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import uuid
from pathlib import Path


REFS = ("chelsea", "coffee", "astronaut", "horse", "flower", "china")
CANDIDATES = ("rocket", "chelsea")
RUBRICS = ("same colour", "a round shape", "short fur and pointed ears")


def _request(references, candidate, rubric, cache, opening: str | None = None):
    from refsight.requests import GenerationRequest
    from refsight.judge.prompts import reference_prefix

    prefix = [*([opening] if opening else []), *reference_prefix(references)]
    segments = [*prefix, "Candidate:", candidate, f"\nCriteria:\n1. {rubric}\nAnswer with JSON."]
    return GenerationRequest(segments, max_new_tokens=8, prefix_segments=len(prefix), prefix_cache=cache)


def _timed(fn):
    began = time.perf_counter()
    out = fn()
    return out, (time.perf_counter() - began) * 1000


def llamacpp(backend, refs, candidates, rubrics) -> dict:
    from refsight.cache.prefix_states import PrefixStateCache
    from refsight.store import open_store

    packages = backend.encode(refs)
    encoded = backend.encode(candidates)  # once each: every rubric of a compare reuses its candidate's package
    backend.generate([_request(packages, encoded[0], "warm-up", None)])  # first-call costs out of the figures

    def run(references, shown, cache):
        return [backend.generate([_request(references, c, r, cache)])[0] for c in shown for r in rubrics]

    fresh, fresh_ms = _timed(lambda: run(refs, candidates, None))
    plain, package_ms = _timed(lambda: run(packages, encoded, None))
    with tempfile.TemporaryDirectory() as tmp, open_store(Path(tmp) / "store") as store:
        cache = PrefixStateCache(store)
        cached, prefix_ms = _timed(lambda: run(packages, encoded, cache))
        bytes_on_disk = store.prefixes.stats()["bytes"]
    candidate_only_ms = sum(g.timings_ms["total"] - g.timings_ms.get("prefix_load", 0.0) for g in cached[1:])
    # The first prefix call builds the state; the rest reuse it: compare like with like.
    per_hit = (prefix_ms - cached[0].timings_ms["total"]) / max(1, len(cached) - 1)
    prefix_tokens = max(g.prefix_tokens_reused for g in cached)
    return {
        "fresh_ms": round(fresh_ms, 1),
        "package_ms": round(package_ms, 1),
        "prefix_ms": round(prefix_ms, 1),
        "prefix_hit_ms_each": round(per_hit, 1),
        "candidate_only_ms_each": round(candidate_only_ms / max(1, len(cached) - 1), 1),
        "package_over_prefix": round(package_ms / prefix_ms, 3),
        "fresh_over_prefix": round(fresh_ms / prefix_ms, 3),
        "prefix_hit_over_candidate_only": round(per_hit / (candidate_only_ms / max(1, len(cached) - 1)), 3),
        "prefix_hits": sum(g.prefix_tokens_reused > 0 for g in cached),
        "prefix_tokens": prefix_tokens,
        "prefix_bytes_per_token": round(bytes_on_disk / prefix_tokens, 1) if prefix_tokens else None,
        "tokens_equal": all(a.token_ids == b.token_ids == c.token_ids for a, b, c in zip(fresh, plain, cached)),
    }


def vllm(backend, refs, candidates, rubrics) -> dict:
    packages = backend.encode(refs)
    cands = backend.encode(candidates)
    work = [(c, r) for c in cands for r in rubrics]

    def run(opening):
        return [backend.generate([_request(packages, c, r, None, opening())])[0].token_ids for c, r in work]

    _, package_ms = _timed(lambda: run(lambda: f"Request {uuid.uuid4().hex}."))  # shares no KV block
    before = backend.prefix_cache_stats()
    cached, prefix_ms = _timed(lambda: run(lambda: "Request."))
    after = backend.prefix_cache_stats()
    again = run(lambda: "Request.")
    queries = after["queries"] - before["queries"]
    hits = after["hits"] - before["hits"]
    return {
        "package_ms": round(package_ms, 1),
        "prefix_ms": round(prefix_ms, 1),
        "package_over_prefix": round(package_ms / prefix_ms, 3),
        "prefix_cache_queries": queries,
        "prefix_cache_hits": hits,
        "prefix_cache_hit_rate": round(hits / queries, 3) if queries else 0.0,
        "server_hit_rate_total": round(after["hit_rate"], 3),
        "tokens_equal": cached == again,
    }


def main(argv: list[str] | None = None) -> dict:
    """Parse ``argv``, run, print the JSON line and return it as a dict."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-qwen2-vl-gguf")
    parser.add_argument("--mmproj", default=None)
    parser.add_argument("--encoder", default=None, help="vllm: the refsight model that encodes for the server")
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--refs", type=int, default=4)
    args = parser.parse_args(argv)

    from refsight.backends.registry import get_backend
    from refsight.inputs.images import load_image
    from refsight.samples import load_sample

    options = {k: v for k, v in (("mmproj", args.mmproj), ("encoder", args.encoder)) if v is not None}
    backend = get_backend(args.model, **options)
    size = (args.size, args.size)
    refs = [load_image(load_sample(n, size)) for n in REFS[: args.refs]]
    # Candidates at another size: never identical to a reference.
    candidates = [load_image(load_sample(n, (args.size, args.size - 28))) for n in CANDIDATES]
    runtime = "vllm" if args.model.startswith("vllm:") else "llamacpp"
    figures = (vllm if runtime == "vllm" else llamacpp)(backend, refs, candidates, RUBRICS)
    line = {
        "benchmark": "prefix_cache_runtimes", "runtime": runtime, "model": args.model, "size": args.size,
        "references": len(refs), "rubrics": len(RUBRICS), "candidates": len(candidates),
        "random_weights": bool(backend.random_weights), **figures,
    }
    print(json.dumps(line))
    return line


if __name__ == "__main__":
    main()
