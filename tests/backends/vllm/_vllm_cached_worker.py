"""Run in a NEW process by test_vllm_equivalence.py: the cached path from packages on disk.

Reads a JSON spec (store directory, the ``vllm:`` model name, rows of segments that
are text, reference package keys or candidate image paths), loads every reference
package from ``refsight.store`` with ``.get(key)``, generates through the vllm
backend and writes, as JSON, the tokens per row and how many images refsight's own
encoder preprocessed (only the candidates may be).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/backends: the shared spec reader
from worker_spec import case_requests, open_spec  # noqa: E402


def main(spec_path: str) -> None:
    from refsight.backends.registry import get_backend

    with open(spec_path) as f:
        backend = get_backend(json.load(f)["model"])
    counts = {"preprocess": 0}
    original = backend.encoder.lay_out

    def counted(images, _original=original):
        counts["preprocess"] += len(images)
        return _original(images)

    backend.encoder.lay_out = counted
    out = {}
    with open_spec(spec_path) as (spec, store):
        for case in spec["cases"]:
            requests = case_requests(store, case)
            before = counts["preprocess"]
            generations = backend.generate(requests)
            out[case["id"]] = {
                "tokens": [g.token_ids for g in generations],
                "random_weights": [g.random_weights for g in generations],
                "preprocessed": counts["preprocess"] - before,
            }
    with open(spec["out"], "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main(sys.argv[1])
