"""What one image costs at each preprocessing setting: the demo's one 512² tile against the model's default tiling.

For each model, at ``max_pixels`` = ``--demo-pixels`` (the demo's setting, 512·512) and at the model's default
(no option: SmolVLM resizes the longest edge to 2048 and cuts 512² tiles plus a global one; Qwen2-VL keeps up to
1,003,520 pixels), each bundled photo (``--photos``, at its own size) is:

- added as a reference: ``encode_ms`` (its vision encoder + projector run) and ``package_bytes`` (what the store keeps);
- asked about in a chat of its own, from its cached package, one token answered, no stored prefix state:
  ``chat_ms`` (the package loaded and its tokens prefilled) and ``image_tokens``.

``first_request_ms`` = ``encode_ms`` + ``chat_ms``: what a chat on a new image costs (a reference's first chat, an
inline image); later chats on a reference cost ``chat_ms`` (less with its prefix state, not measured here). Each
figure is the mean over the photos; ``default_over_demo`` holds the ratios of the two settings measured in the same
run. ``load_ms`` is the model's load (once per setting, before any image). Weights are random
(``random_weights: true``): the timings are real (the built-ins have the real models' shapes), the text is not.

Prints ONE JSON line::

    python benchmarks/image_cost.py                                    # shape-smolvlm-256m, shape-qwen2-vl-2b
    python benchmarks/image_cost.py --models shape-smolvlm-256m --photos chelsea,coffee,horse
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any

#: The demo's setting (refsight.demo.FALLBACK_MAX_PIXELS): one 512² tile an image for SmolVLM-256M.
DEMO_PIXELS = 512 * 512


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="shape-smolvlm-256m,shape-qwen2-vl-2b", help="comma-separated")
    parser.add_argument("--photos", default="chelsea,coffee", help="bundled photos, comma-separated")
    parser.add_argument("--demo-pixels", type=int, default=DEMO_PIXELS, help="the demo's max_pixels (default 512·512)")
    return parser.parse_args(argv)


def _photo_cost(engine: Any, name: str, path: str) -> dict[str, float]:
    """One photo added (its encode, its package) and then asked about from its package (prefill, one token)."""
    from refsight import ReferenceSegment

    added = engine.add(path, ref_id=name)
    began = time.perf_counter()
    chat = engine.chat([ReferenceSegment(name), "Describe the image."], max_new_tokens=1, prefix_states=False)
    chat_ms = (time.perf_counter() - began) * 1000
    assert chat.references_cached == [True], chat.references_cached
    return {"encode_ms": added.encode_ms, "package_bytes": added.bytes, "chat_ms": chat_ms,
            "image_tokens": chat.cached_tokens, "random_weights": chat.random_weights}


def _setting(model: str, max_pixels: int | None, photos: dict[str, str]) -> dict[str, Any]:
    """One model at one setting, in a store of its own (every photo a new encode)."""
    from refsight import Engine
    from refsight.settings import BackendOptions

    options = BackendOptions(max_pixels=max_pixels) if max_pixels else None
    with tempfile.TemporaryDirectory(prefix="image-cost-") as store, Engine(store, model=model, backend_options=options) as engine:
        began = time.perf_counter()
        engine.backend()
        load_ms = (time.perf_counter() - began) * 1000
        # An untimed text-only chat pays the language model's first-call costs, so every photo is timed alike.
        engine.chat(["Hello."], max_new_tokens=1, prefix_states=False)
        costs = []
        for name, path in photos.items():
            print(f"{model} max_pixels={max_pixels or 'default'}: {name} ...", file=sys.stderr, flush=True)
            costs.append(_photo_cost(engine, name, path))
    figures = {key: round(statistics.fmean(c[key] for c in costs), 1)
               for key in ("encode_ms", "chat_ms", "image_tokens", "package_bytes")}
    figures["first_request_ms"] = round(figures["encode_ms"] + figures["chat_ms"], 1)
    return {"max_pixels": max_pixels, "load_ms": round(load_ms, 1), **figures,
            "encode_ms_each": [round(c["encode_ms"], 1) for c in costs],
            "random_weights": all(c["random_weights"] for c in costs)}


def main(argv: list[str] | None = None) -> None:
    args = _arguments(argv)
    import torch  # noqa: F401  (imported before any timing: the first load_ms is the model's load, not imports)
    import transformers  # noqa: F401

    from refsight.samples import sample_paths

    bundled = sample_paths()
    photos = {name: str(bundled[name]) for name in args.photos.split(",")}
    models: dict[str, Any] = {}
    for model in args.models.split(","):
        demo, default = _setting(model, args.demo_pixels, photos), _setting(model, None, photos)
        ratios = {key: round(default[key] / max(demo[key], 1e-9), 2)
                  for key in ("encode_ms", "image_tokens", "package_bytes", "first_request_ms")}
        models[model] = {"demo": demo, "default": default, "default_over_demo": ratios}
    print(json.dumps({
        "photos": list(photos), "demo_pixels": args.demo_pixels, "cores": len(os.sched_getaffinity(0)),
        "models": models, "random_weights": all(m[s]["random_weights"] for m in models.values() for s in ("demo", "default")),
    }), flush=True)


if __name__ == "__main__":
    main()
