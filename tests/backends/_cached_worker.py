"""Run in a NEW process by test_equivalence.py: the cached path from packages on disk.

Reads a JSON spec (store directory, cases of requests whose segments are text,
reference package keys or candidate image paths), loads every reference package
from ``refsight.store`` with ``.get(key)``, generates with ``return_logits=True``
and writes tokens, logits, the random-weights flag and how many times the vision
tower and the image processor ran to a ``torch.save`` file.
"""

from __future__ import annotations

import sys

from backend_models import vision_tower
from worker_spec import case_requests, open_spec


def main(spec_path: str) -> None:
    import torch

    from refsight.backends.registry import get_backend

    out: dict[str, object] = {}
    with open_spec(spec_path) as (spec, store):
        for case in spec["cases"]:
            backend = get_backend(case["model"])
            tower = vision_tower(backend)
            counts = {"vision": 0, "preprocess": 0}
            hook = tower.register_forward_hook(lambda *a: counts.__setitem__("vision", counts["vision"] + 1))
            # Every image the processor lays out goes through lay_out (a batch of them, or one).
            original = backend.lay_out

            def counted(images, _original=original):
                counts["preprocess"] += len(images)
                return _original(images)

            backend.lay_out = counted
            requests = case_requests(store, case)
            generations = backend.generate(requests, return_logits=True)
            hook.remove()
            backend.lay_out = original
            out[case["id"]] = {
                "rows": [
                    {"tokens": g.token_ids, "logits": g.logits, "random_weights": g.random_weights, "timings": g.timings_ms}
                    for g in generations
                ],
                "counts": counts,
            }
    torch.save(out, spec["out"])


if __name__ == "__main__":
    main(sys.argv[1])
