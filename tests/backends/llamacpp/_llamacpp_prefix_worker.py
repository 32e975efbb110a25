"""Run in a NEW process by test_llamacpp_prefix_cache.py: judge prompts with the KV prefix cache on disk.

Reads a JSON spec (store directory, cases: model, reference package keys, candidate
image path, rubrics), loads the packages from ``refsight.store``, hands the store's
prefix-state cache (:class:`refsight.cache.prefix_states.PrefixStateCache`, memory tier empty in
this process: every state comes from disk) to each request, and writes per request the
greedy tokens, logits, the prefix outcome and what the language model evaluated
(tokens decoded, image chunks decoded, images encoded, states restored) to a
``torch.save`` file.
"""

from __future__ import annotations

import json
import sys


def judge_request(packages, candidate, rubric, cache):
    """The judge's layout: the reference prefix, then the candidate and the rubric."""
    from refsight.requests import GenerationRequest
    from refsight.judge.prompts import reference_prefix

    prefix = reference_prefix(packages)
    segments = [*prefix, "Candidate:", candidate, f"\nCriteria:\n1. {rubric}\nAnswer with JSON."]
    return GenerationRequest(segments, max_new_tokens=6, prefix_segments=len(prefix), prefix_cache=cache)


def run(backend, request):
    """Generate one request; the result and what the runtime did for it."""
    rt = backend.runtime
    before = (rt.decoded_tokens, rt.image_decodes, rt.encode_calls, rt.state_restores)
    g = backend.generate([request], return_logits=True)[0]
    after = (rt.decoded_tokens, rt.image_decodes, rt.encode_calls, rt.state_restores)
    decoded, image_decodes, encodes, restores = (a - b for a, b in zip(after, before))
    return {
        "tokens": g.token_ids, "logits": g.logits, "prompt_tokens": g.prompt_tokens, "cached_tokens": g.prefix_tokens_reused,
        "decoded": decoded, "image_decodes": image_decodes, "encodes": encodes, "restores": restores,
    }


def main(spec_path: str) -> None:
    import torch

    from refsight.backends.registry import get_backend
    from refsight.inputs.images import load_image
    from refsight.cache.prefix_states import PrefixStateCache
    from refsight.store import open_store

    with open(spec_path) as f:
        spec = json.load(f)
    out: dict[str, object] = {}
    with open_store(spec["store"]) as store:
        cache = PrefixStateCache(store)
        for case in spec["cases"]:
            backend = get_backend(case["model"])
            packages = [store.packages.get(k) for k in case["refs"]]
            candidate = load_image(case["candidate"])
            out[case["id"]] = [run(backend, judge_request(packages, candidate, r, cache)) for r in case["rubrics"]]
    torch.save(out, spec["out"])


if __name__ == "__main__":
    main(sys.argv[1])
