"""Run in a NEW process by test_llamacpp_equivalence.py: the cached path from packages on disk.

Reads a JSON spec (store directory, cases of requests whose segments are text,
reference package keys or candidate image paths), loads every reference package
from ``refsight.store`` with ``.get(key)``, generates through the registry's
llama.cpp backend with ``return_logits=True`` and writes tokens, logits and how
many image chunks went through the vision encoder to a ``torch.save`` file.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/backends: the shared spec reader
from worker_spec import case_requests, open_spec  # noqa: E402


def main(spec_path: str) -> None:
    import torch

    from refsight.backends.registry import get_backend

    out: dict[str, object] = {}
    with open_spec(spec_path) as (spec, store):
        for case in spec["cases"]:
            backend = get_backend(case["model"])
            requests = case_requests(store, case)
            before = backend.encode_calls
            generations = backend.generate(requests, return_logits=True)
            out[case["id"]] = {
                "rows": [
                    {"tokens": g.token_ids, "logits": g.logits, "random_weights": g.random_weights, "timings": g.timings_ms}
                    for g in generations
                ],
                "encode_calls": backend.encode_calls - before,
            }
    torch.save(out, spec["out"])


if __name__ == "__main__":
    main(sys.argv[1])
