"""Image embeddings and rerank through ``refsight serve``, as a vector-database user's client calls them.

**Embeddings** (the retrieval embedder, ``conse`` unless ``--embedder``): N photos (the bundled ones, cropped and
mirrored into N distinct images of ``--size`` px), sent by the unchanged OpenAI SDK as ``embeddings.create`` calls of
``--batch`` images each (data URLs in ``{"content": [image_url]}`` inputs), to a real ``refsight serve`` process on a
fresh store:

1. **first**: every image is new: decoded, embedded, its vector kept (``first_images_per_s``);
2. **repeated**: the same calls again, as a vector database re-indexing the same photos: every vector comes from the
   store, no encoder runs (``repeat_images_per_s``; ``repeat_from_store``: every image flagged so by the reply);
3. **baseline**: the same embedder's vectors computed in plain Python in this process (``get_embedder(...)``,
   ``load_image`` then ``embed_images`` in the same batches; no server, no store), with the torch threads one
   worker of ``refsight serve`` gets (its thread budget: the cores shared out among its 2 workers; ``threads``), so
   the ratios compare the same compute: ``plain_images_per_s``; ``first_vs_plain`` and ``repeat_vs_plain`` are the
   ratios to it (above 1: faster than plain Python), ``vectors_equal`` whether the server's vectors are the plain
   ones (to 1e-5). (torch's default, every core, is slower on a loaded machine: threads fight.)

**Rerank** (``--model``'s P("yes"), the VLM reranker): a new photo of the cat and the question against D stored
references (``refsight://ref/<id>``, each D of ``--documents``), on the same server (the references' packages stored
at add: ``rerank_cached_ms``) and on ``refsight serve --no-cache`` over the same store (every image of every pair
encoded afresh: ``rerank_no_cache_ms``); medians of ``--repeats`` calls, ``rerank_speedup`` per D their ratio.

Prints ONE JSON line.

    python benchmarks/embeddings.py [--images 64] [--batch 16] [--size 224] [--documents 10,100] [--model tiny-qwen2-vl]
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from ollama_client import Serve, photo

QUESTION = "Is the document the same cat as the query photo?"


def _images(count: int, size: int) -> list[bytes]:
    """``count`` distinct photos: the bundled ones, each variant cropped and mirrored a little more."""
    from refsight.samples import SAMPLE_NAMES

    return [photo(SAMPLE_NAMES[i % len(SAMPLE_NAMES)], size, i // len(SAMPLE_NAMES)) for i in range(count)]


def _input(png: bytes) -> dict:
    return {"content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(png).decode()}}]}


def _embed_over_http(url: str, images: list[bytes], batch: int, embedder: str) -> tuple[float, np.ndarray, bool]:
    """The images through the OpenAI SDK in batches: (seconds, the vectors, whether every one came from the store)."""
    from openai import OpenAI

    client = OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=1800, max_retries=0)
    vectors, from_store = [], True
    began = time.perf_counter()
    for start in range(0, len(images), batch):
        reply = client.embeddings.create(model=embedder, input=[_input(png) for png in images[start:start + batch]])
        vectors += [item.embedding for item in reply.data]
        from_store &= all(reply.model_extra["refsight"]["images_cached"])
    return time.perf_counter() - began, np.array(vectors, np.float32), from_store


def _embed_in_python(images: list[bytes], batch: int, embedder: str, threads: int) -> tuple[float, np.ndarray]:
    """The same embedder called directly (its model loaded first, as the server's is), on ``threads`` torch threads:
    (seconds, the vectors)."""
    from refsight.embedders import get_embedder
    from refsight.inputs.images import load_image
    from refsight.support.threads import apply_threads

    model = get_embedder(embedder)
    apply_threads(threads)
    model.embed_images([load_image(images[0])])  # the load and the first call's warm-up are not the steady rate
    began = time.perf_counter()
    vectors = [model.embed_images([load_image(png) for png in images[start:start + batch]])
               for start in range(0, len(images), batch)]
    return time.perf_counter() - began, np.concatenate(vectors)


def _rerank_ms(url: str, query: bytes, documents: list[str], repeats: int) -> float:
    """Median milliseconds of a rerank call (Jina's shape, as its clients post it) of the query photo against them."""
    import httpx

    body = {"query": {"content": [{"type": "text", "text": QUESTION}, *_input(query)["content"]]},
            "documents": [{"content": [{"type": "image_url", "image_url": {"url": f"refsight://ref/{d}"}}]}
                          for d in documents], "return_documents": False}
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        reply = httpx.post(f"{url}/v1/rerank", json=body, timeout=1800)
        reply.raise_for_status()
        times.append((time.perf_counter() - began) * 1000)
    return statistics.median(times)


def _rerank(args: argparse.Namespace, store: Path, server: Serve, counts: list[int]) -> dict[str, float]:
    """Rerank latencies with the references' packages stored, then on ``--no-cache`` over the same store."""
    import httpx

    references = _images(max(counts), args.size)
    for i, png in enumerate(references):
        reply = httpx.post(f"{server.url}/v1/references", timeout=1800,
                           json={"image": base64.b64encode(png).decode(), "id": f"r{i}"})
        reply.raise_for_status()
    query = photo("chelsea", args.size, 40)
    figures = {f"rerank_cached_ms_{n}": round(_rerank_ms(server.url, query, [f"r{i}" for i in range(n)], args.repeats), 1)
               for n in counts}
    with Serve(args.model, store, "--no-cache", "--embedder", args.embedder) as baseline:
        for n in counts:
            figures[f"rerank_no_cache_ms_{n}"] = round(
                _rerank_ms(baseline.url, query, [f"r{i}" for i in range(n)], args.repeats), 1)
    for n in counts:
        figures[f"rerank_speedup_{n}"] = round(figures[f"rerank_no_cache_ms_{n}"] / figures[f"rerank_cached_ms_{n}"], 2)
    return figures


def run(args: argparse.Namespace) -> dict:
    """Both scenarios (see the module docstring); the figures of the one JSON line."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a timeout stops the servers too
    counts = [int(n) for n in args.documents.split(",")]
    from refsight.support.threads import thread_budget

    images = _images(args.images, args.size)
    threads = thread_budget(workers=2)  # what each of refsight serve's 2 workers gets by default
    plain_s, plain = _embed_in_python(images, args.batch, args.embedder, threads)
    with tempfile.TemporaryDirectory(prefix="refsight-embeddings-bench-") as tmp:
        store = Path(tmp) / "store"
        with Serve(args.model, store, "--embedder", args.embedder) as server:
            first_s, first, _ = _embed_over_http(server.url, images, args.batch, args.embedder)
            repeat_s, repeat, from_store = _embed_over_http(server.url, images, args.batch, args.embedder)
            rerank = _rerank(args, store, server, counts)
    rate = lambda seconds: round(len(images) / seconds, 2)  # noqa: E731
    return {
        "embedder": args.embedder, "model": args.model, "images": len(images), "batch": args.batch,
        "image_px": args.size, "first_images_per_s": rate(first_s), "repeat_images_per_s": rate(repeat_s),
        "plain_images_per_s": rate(plain_s), "first_vs_plain": round(plain_s / first_s, 2),
        "repeat_vs_plain": round(plain_s / repeat_s, 2), "repeat_vs_first": round(first_s / repeat_s, 2),
        "repeat_from_store": from_store,
        "vectors_equal": bool(np.allclose(first, plain, atol=1e-5) and np.array_equal(first, repeat)),
        **rerank, "documents": counts, "threads": threads, "cpus": os.cpu_count(),
    }


def main(argv: list[str] | None = None) -> int:
    """Parse the flags, run, print the one JSON line."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--images", type=int, default=64, help="distinct photos to embed")
    p.add_argument("--batch", type=int, default=16, help="images per embeddings call")
    p.add_argument("--size", type=int, default=224, help="image side in pixels")
    p.add_argument("--embedder", default="conse")
    p.add_argument("--model", default="tiny-qwen2-vl", help="the served model, whose P(yes) reranks")
    p.add_argument("--documents", default="10,100", help="documents per rerank call, comma-separated")
    p.add_argument("--repeats", type=int, default=3, help="rerank calls per figure (the median)")
    print(json.dumps(run(p.parse_args(argv))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
