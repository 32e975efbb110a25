"""An Ollama client against ``refsight serve``: R references sent as images in every request, fresh candidates.

The scenario refsight exists for, as an Ollama user runs it: the ``ollama`` Python library sends the R = 4
reference photos (bytes, base64 on the wire) plus one new candidate photo in every ``chat`` request, to
``refsight serve`` processes on loopback (real ``refsight serve``, its own process, one store directory):

1. **first**: a fresh store; the first request encodes all R + 1 images (what Ollama pays after every
   restart: its image caches live in its process). Then the R photos become stored references
   (``POST /v1/references`` with the same bytes: their packages, already in memory, are written to disk).
2. **cached**: the next ``--requests`` requests, each with a new candidate: the references' packages are
   found by their pixels; only the candidate is encoded.
3. **after_restart**: the server is stopped and started again on the same store; the next request with the
   same references is served from disk (``restart_speedup`` = first / after_restart; the target is >= 3).
4. **no_cache**: the same requests as 2 on ``refsight serve --no-cache`` (every image encoded afresh,
   every prompt prefilled whole: Ollama's behaviour); ``cache_speedup`` = no_cache / cached.

Prints ONE JSON line: ``{"model", "references", "requests", "image_px", "first_s", "after_restart_s",
"restart_speedup", "cached_s", "no_cache_s", "cache_speedup", ...}`` (request times: medians, seconds).

    python benchmarks/ollama_client.py [--model shape-qwen2-vl-2b-gguf] [--size 224] [--requests 3]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REFERENCES = ("chelsea", "coffee", "astronaut", "rocket")
CANDIDATES = ("horse", "china", "chelsea", "coffee", "astronaut", "rocket")


def _photo(name: str, size: int, variant: int = 0) -> bytes:
    """A bundled photo at ``size`` px; ``variant`` > 0 crops it a little (a new candidate, never a reference)."""
    from PIL import Image

    from refsight.samples import load_sample

    image = load_sample(name)
    if variant:
        width, height = image.size
        image = image.crop((variant * 3, variant * 2, width - variant, height - variant * 2))
        image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    buffer = io.BytesIO()
    image.resize((size, size)).save(buffer, format="PNG")
    return buffer.getvalue()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class _Serve:
    """``refsight serve MODEL --store DIR`` in its own process, ready when ``/healthz`` answers."""

    def __init__(self, model: str, store: Path, *flags: str) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        command = [sys.executable, "-m", "refsight.cli", "serve", model, "--store", str(store), "--port", str(self.port),
                   "--attributes", "none", *flags]
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    def __enter__(self) -> "_Serve":
        import httpx

        deadline = time.monotonic() + 900
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise SystemExit(f"refsight serve exited {self.process.returncode}: {self.process.stderr.read()[-2000:]}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                time.sleep(0.3)
        raise SystemExit("refsight serve did not start in 900 s")

    def __exit__(self, *exc: object) -> None:
        self.process.terminate()
        self.process.wait(timeout=60)


def _ask(url: str, references: list[bytes], candidate: bytes, tokens: int) -> tuple[float, str]:
    """One Ollama chat request: the references, then the candidate, then the question; (seconds, answer)."""
    import ollama

    began = time.perf_counter()
    reply = ollama.Client(host=url, timeout=1800).chat(
        model=_model_name(url), options={"num_predict": tokens, "temperature": 0},
        messages=[{"role": "user", "content": "Do the last image and the first four show the same kind of thing?",
                   "images": [*references, candidate]}],
    )
    return time.perf_counter() - began, reply.message.content


def _model_name(url: str) -> str:
    import httpx

    return httpx.get(f"{url}/api/tags", timeout=30).json()["models"][0]["name"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="shape-qwen2-vl-2b-gguf")
    parser.add_argument("--size", type=int, default=224, help="image side in pixels")
    parser.add_argument("--requests", type=int, default=3, help="requests with new candidates per path")
    parser.add_argument("--max-new-tokens", type=int, default=4)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the four paths; print the one JSON line."""
    args = _parser().parse_args(argv)
    references = [_photo(name, args.size) for name in REFERENCES]
    candidates = [_photo(CANDIDATES[i % len(CANDIDATES)], args.size, i + 1) for i in range(args.requests + 2)]
    with tempfile.TemporaryDirectory(prefix="refsight-ollama-bench-") as tmp:
        store = Path(tmp) / "store"
        with _Serve(args.model, store) as server:
            first, _ = _ask(server.url, references, candidates[0], args.max_new_tokens)
            _store_references(server.url, references)
            cached = [_ask(server.url, references, c, args.max_new_tokens) for c in candidates[1:-1]]
        with _Serve(args.model, store) as server:
            after_restart, _ = _ask(server.url, references, candidates[-1], args.max_new_tokens)
        with _Serve(args.model, Path(tmp) / "fresh", "--no-cache") as server:
            _ask(server.url, references, candidates[0], args.max_new_tokens)  # the same first request, as warm-up
            no_cache = [_ask(server.url, references, c, args.max_new_tokens) for c in candidates[1:-1]]
    cached_s, no_cache_s = statistics.median(t for t, _ in cached), statistics.median(t for t, _ in no_cache)
    print(json.dumps({
        "model": args.model, "client": "ollama-python", "references": len(references), "requests": args.requests,
        "image_px": args.size, "first_s": round(first, 3), "after_restart_s": round(after_restart, 3),
        "restart_speedup": round(first / after_restart, 2), "cached_s": round(cached_s, 3),
        "no_cache_s": round(no_cache_s, 3), "cache_speedup": round(no_cache_s / cached_s, 2),
        "answers_equal": sum(a == b for (_, a), (_, b) in zip(cached, no_cache)), "cpus": os.cpu_count(),
    }))
    return 0


def _store_references(url: str, references: list[bytes]) -> None:
    """The R photos as stored references (the same bytes the client sent: their packages are kept, not re-encoded)."""
    import base64

    import httpx

    for i, data in enumerate(references):
        response = httpx.post(f"{url}/v1/references", timeout=600,
                              json={"image": base64.b64encode(data).decode(), "id": f"ref-{i}"})
        response.raise_for_status()


if __name__ == "__main__":
    raise SystemExit(main())
