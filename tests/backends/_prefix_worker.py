"""Run in a NEW process by test_prefix_cache.py: judge-layout requests whose reference prefix
state is read back from the store's disk tier (the memory tier of this process starts empty).

Reads a JSON spec (store directory, cases of requests: prefix package keys, candidate package
key, rubric texts), generates with ``return_logits=True`` through the engine's
:class:`~refsight.cache.prefix_states.PrefixStateCache` and writes tokens, logits, ``prefix_tokens_reused``, the
prefix counters and the language-model token count of the widest forward to a ``torch.save`` file.
"""

from __future__ import annotations

import sys

from worker_spec import open_spec


def main(spec_path: str) -> None:
    import torch

    from refsight.requests import GenerationRequest
    from refsight.backends.registry import get_backend
    from refsight.judge.prompts import reference_prefix
    from refsight.cache.prefix_states import PrefixStateCache

    out: dict[str, object] = {}
    with open_spec(spec_path) as (spec, store):
        cache = PrefixStateCache(store)
        before = store.catalog.counters()
        for case in spec["cases"]:
            backend = get_backend(case["model"])
            refs = [store.packages.get(key) for key in case["refs"]]
            candidate = store.packages.get(case["candidate"])
            prefix = reference_prefix(refs)
            requests = [
                GenerationRequest(
                    [*prefix, "Candidate:", candidate, "\n", rubric], max_new_tokens=case["max_new_tokens"],
                    prefix_segments=len(prefix), prefix_cache=cache,
                )
                for rubric in case["rubrics"]
            ]
            seen: list[int] = []
            lm = backend.model.model.language_model if hasattr(backend.model.model, "language_model") else backend.model.model.text_model
            hook = lm.register_forward_pre_hook(lambda m, a, kw: seen.append(int(kw["inputs_embeds"].shape[1])), with_kwargs=True)
            try:
                generations = backend.generate(requests, return_logits=True)
            finally:
                hook.remove()
            out[case["id"]] = {
                "rows": [{"tokens": g.token_ids, "logits": g.logits, "cached": g.prefix_tokens_reused, "prompt": g.prompt_tokens}
                         for g in generations],
                # The widest forward: the (padded) suffixes of a part; decoding steps take one token per row.
                "widest_forward_tokens": max(seen),
            }
        store.counters.flush()
        out["counters"] = {k: v - before.get(k, 0) for k, v in store.catalog.counters().items()}
    torch.save(out, spec["out"])


if __name__ == "__main__":
    main(sys.argv[1])
