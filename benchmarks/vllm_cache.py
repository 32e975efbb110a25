"""refsight as vLLM's encoder cache, against vLLM alone: one JSON line, ratios within one run.

Starts its own vLLM servers (``refsight vllm-env`` must have been run) for MODEL, every one
with refsight's encoder-cache connector on one fresh store, so both arms meet the same
server flags; they differ only in the request:

- **vLLM alone** (the baseline): every image as pixels, no uuid: what a plain OpenAI client
  sends (vLLM's own caches key it by content; the connector keeps nothing without a refsight uuid);
- **refsight**: ``vllm:URL`` with the candidate as pixels and each reference by its uuid
  (``refsight-`` + package key), uuid-only where the server holds it.

Every request carries a new candidate (each is encoded in both arms, as in real use). Figures:

- (a) ``speedup_caches_off_r1`` / ``_r4``: a server with vLLM's caches off
  (``--no-enable-prefix-caching --mm-processor-cache-gb 0``), R = 1 and 4 references that
  the store already holds (the first pass, untimed, encodes them once); medians;
- (b) ``speedup_cycling``: a server with vLLM's default caches, a working set of
  ``--working-set`` references cycled through R = 4 requests (more than vLLM's encoder cache
  keeps), each pass one reference further on (shortlists vary), the second pass timed;
  ``speedup_after_restart``: that server restarted, its first ``--after-restart`` requests;
- (c) ``ratio_warm``: the default server holding every reference of the request in its own
  caches (the same 4 references again and again): refsight must cost no more than vLLM alone;
- ``tokens_equal``: every request gave the same greedy tokens in both arms.

``--images embeds`` runs refsight's arm in the other mode (references as their stored
embeddings, the candidate through refsight's own vision tower: what a server without a
vision encoder gets); ``--figures a`` measures (a) alone. In pixel mode on a caches-off
server the references' pixels still go through vLLM's processor (it keeps no uuid) and the
candidate through vLLM's encoder, so (a) is bounded near R + 1 (encodes over one); embeds mode
skips the references' processing too and moves the candidate's encode to refsight's tower.

Usage (the 2B-shaped tower at 448², as the issue's figures)::

    python benchmarks/vllm_cache.py --model shape-qwen2-vl-2b-vllm --size 448 --working-set 64
    python benchmarks/vllm_cache.py --model tiny-qwen2-vl-vllm --size 56 --working-set 8 --repeats 2   # smoke
    python benchmarks/vllm_cache.py --model shape-qwen2-vl-2b-8l-vllm --images embeds --figures a
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

PROMPT = " Does the candidate match the references?"
CACHES_OFF = ("--no-enable-prefix-caching", "--mm-processor-cache-gb", "0")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="tiny-qwen2-vl-vllm", help="a tiny-*-vllm name or a model folder")
    parser.add_argument("--size", type=int, default=448, help="image side in pixels (default 448)")
    parser.add_argument("--working-set", type=int, default=64, help="references cycled through in (b) (default 64)")
    parser.add_argument("--repeats", type=int, default=5, help="timed requests per figure of (a) and (c) (default 5)")
    parser.add_argument("--after-restart", type=int, default=4, help="requests timed after the restart (default 4)")
    parser.add_argument("--max-new-tokens", type=int, default=4)
    parser.add_argument("--images", choices=("pixels", "embeds"), default=None,
                        help="refsight's image mode (default: what the server supports, pixels here)")
    parser.add_argument("--figures", default="abc", help="which figures to measure: any of a, b, c (default abc)")
    return parser


def _images(count: int, size: int, seed: int) -> list:
    """``count`` distinct photos-like images (smooth gradients plus noise), ``size`` square."""
    import numpy as np
    from PIL import Image

    from refsight.inputs.images import load_image

    rng = np.random.default_rng(seed)
    axis = np.linspace(0, 1, size)
    out = []
    for i in range(count):
        base = np.outer(axis, axis[::-1]) * rng.uniform(80, 255) + rng.normal(0, 25, (size, size))
        rgb = np.stack([np.roll(base, 7 * c + i, axis=c % 2) for c in range(3)], axis=-1).clip(0, 255).astype("uint8")
        out.append(load_image(Image.fromarray(rgb), name=f"img-{seed}-{i}"))
    return out


class Arms:
    """Both request shapes against one server; every request's tokens kept for ``tokens_equal``."""

    def __init__(self, url: str, max_new_tokens: int, images: str | None = None) -> None:
        from refsight.backends.vllm.loading import load_vllm_backend

        self.url, self.max_new_tokens = url, max_new_tokens
        self.backend = load_vllm_backend(f"vllm:{url}", images=images)
        self.equal = True

    def baseline(self, references: list, candidate) -> tuple[float, list[int]]:
        """vLLM alone: every image a PNG on its grid, no uuid (no refsight request code).

        Symmetric with :meth:`refsight`: the references' PNGs are made before the clock (a client
        keeps them, as refsight's store keeps their packages), the candidate's inside it."""
        from refsight.backends.hf.grid import resize_to_grid

        def part(image):
            buffer = io.BytesIO()
            resize_to_grid(self.backend.encoder, image.image).save(buffer, format="PNG")
            return {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()}}

        kept = [part(r) for r in references]
        began = time.perf_counter()
        content = [*kept, {"type": "text", "text": "Compare the candidate"}, part(candidate), {"type": "text", "text": PROMPT}]
        body = {"model": self.backend.served_model, "messages": [{"role": "user", "content": content}],
                "max_tokens": self.max_new_tokens, "temperature": 0.0, "return_token_ids": True}
        request = urllib.request.Request(f"{self.url}/v1/chat/completions", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=3600) as response:
            tokens = json.loads(response.read())["choices"][0]["token_ids"]
        return (time.perf_counter() - began) * 1000, tokens

    def refsight(self, references: list, candidate) -> tuple[float, list[int]]:
        """refsight: the references' packages by uuid, the candidate as pixels (its package made in the timing).

        Symmetric with :meth:`baseline`: what a reference travels as when the server must see its
        pixels (its PNG data URL, kept by the backend's ``PixelUrls`` for as long as refsight runs)
        is made before the clock, as the baseline's client keeps its references' PNGs; the
        candidate's is made inside it in both arms."""
        from refsight.requests import GenerationRequest

        packages = self.backend.encode(references)  # as the store holds them (pixel packages: no vision tower)
        for package in packages if self.backend.encodes_images else ():
            self.backend.urls.get(package)
        began = time.perf_counter()
        (package,) = self.backend.encode([candidate])
        request = GenerationRequest([*packages, "Compare the candidate", package, PROMPT],
                                    max_new_tokens=self.max_new_tokens, prefix_segments=len(packages))
        tokens = self.backend.generate([request])[0].token_ids
        return (time.perf_counter() - began) * 1000, tokens

    def both(self, references: list, candidate) -> tuple[float, float]:
        """(baseline ms, refsight ms) of one request, tokens compared."""
        base_ms, base_tokens = self.baseline(references, candidate)
        ours_ms, ours_tokens = self.refsight(references, candidate)
        self.equal &= base_tokens == ours_tokens
        return base_ms, ours_ms

    def close(self) -> None:
        self.backend.close()


def _ratio(pairs: list[tuple[float, float]]) -> float:
    return round(statistics.median(p[0] for p in pairs) / statistics.median(p[1] for p in pairs), 3)


def _caches_off(arms: Arms, refs: list, candidates, repeats: int) -> dict[str, float]:
    """(a): R = 1 and 4, the references already in the store (an untimed first pass encodes them once)."""
    out = {}
    for r in (1, 4):
        arms.refsight(refs[:r], next(candidates))  # vLLM encodes them once; the connector saves them
        out[f"speedup_caches_off_r{r}"] = _ratio([arms.both(refs[:r], next(candidates)) for _ in range(repeats)])
    return out


def _cycle(arms: Arms, working_set: list, candidates, passes: int) -> list[tuple[float, float]]:
    """R = 4 requests walking the working set ``passes`` times; the last pass's timings.

    Each pass starts one reference further on, so no shortlist comes back whole and none
    starts with a reference that started one before, as shortlists from recall do. (The same
    four in the same order again is (c): vLLM's prefix cache then holds the whole prefix,
    images included, and nothing is encoded in either arm.)"""
    pairs = []
    for offset in range(passes):
        order = working_set[offset:] + working_set[:offset]
        groups = [order[i:i + 4] for i in range(0, len(order) - 3, 4)]
        pairs = [arms.both(group, next(candidates)) for group in groups]
    return pairs


def _progress(figures: dict) -> None:
    """Each figure on stderr as soon as it is measured (long runs show progress)."""
    print(f"so far: {json.dumps(figures)}", file=sys.stderr, flush=True)


def _start(model: str, store: Path, log, extra: tuple[str, ...] = ()):
    from refsight.backends.vllm.serve import start_server

    print(f"starting vLLM for {model} {' '.join(extra)}", file=sys.stderr, flush=True)
    return start_server(model, encoder_cache=store, extra_args=extra, log=log)


def _runs(figures: str) -> list[tuple[tuple[str, ...], str]]:
    """The servers to start, in order, for the figures asked for: (extra flags, what runs on it)."""
    if not figures or set(figures) - set("abc"):
        raise SystemExit(f"--figures: letters of a, b, c, not {figures!r}")
    runs = [(CACHES_OFF, "caches_off")] if "a" in figures else []
    if "b" in figures or "c" in figures:
        runs.append(((), "default"))
    if "b" in figures:
        runs.append(((), "restart"))  # vLLM's own caches empty, the store not
    return runs


def main(argv: list[str] | None = None) -> dict:
    """Run the benchmark and print one JSON line; returns the figures."""
    args = _parser().parse_args(argv)
    runs = _runs(args.figures)
    refs = _images(max(args.working_set, 4), args.size, seed=1)
    candidates = iter(_images(4 * args.repeats + 4 * args.working_set + args.after_restart + 16, args.size, seed=2))
    figures: dict = {"model": args.model, "size": args.size, "working_set": len(refs), "repeats": args.repeats}
    with tempfile.TemporaryDirectory(prefix="refsight-vllm-cache-") as tmp, open(Path(tmp) / "vllm.log", "w") as log:
        store = Path(tmp) / "store"
        equal = True
        for extra, run in runs:
            server = _start(args.model, store, log, extra)
            arms = Arms(server.url, args.max_new_tokens, args.images)
            try:
                if run == "caches_off":
                    figures.update(_caches_off(arms, refs, candidates, args.repeats))
                elif run == "default":
                    if "b" in args.figures:
                        figures["speedup_cycling"] = _ratio(_cycle(arms, refs, candidates, passes=2))
                    if "c" in args.figures:
                        warm = [arms.both(refs[:4], next(candidates)) for _ in range(args.repeats + 1)][1:]
                        figures["ratio_warm"] = _ratio(warm)
                else:
                    groups = [refs[i:i + 4] for i in range(0, 4 * args.after_restart, 4)]
                    figures["speedup_after_restart"] = _ratio([arms.both(g, next(candidates)) for g in groups if len(g) == 4])
                figures["mode"] = arms.backend.runtime_info()  # the last server's (the restarted one's, in a full run)
                figures["uuid_stats"] = arms.backend.uuid_stats()
                figures["random_weights"] = arms.backend.random_weights
            finally:
                equal &= arms.equal
                arms.close()
                server.stop()
            _progress(figures)
        from refsight.vllm_connector.refsight_ec_store import read_counters

        figures["vllm_encoder_cache"] = read_counters(store)
    figures["tokens_equal"] = equal
    print(json.dumps(figures))
    return figures


if __name__ == "__main__":
    main(sys.argv[1:])
