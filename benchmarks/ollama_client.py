"""An unchanged Ollama client against ``refsight serve``: the same R references inline in every request, a new
candidate each time, and no refsight-specific call anywhere.

The scenario refsight exists for, as an Ollama user runs it: the ``ollama`` Python library sends the R = 3
reference photos (bytes, base64 on the wire) plus one new candidate photo in every ``chat`` request, to
``refsight serve`` processes on loopback (real ``refsight serve``, its own process, one store directory, its
default flags: ``--remember-images recurring``):

1. **first**: a fresh store; the first request encodes all R + 1 images (what Ollama pays after every
   restart: its image caches live in its process). Nothing of it is kept on disk: each image was sent once.
2. **cached**: the next ``--requests`` requests, each with a new candidate. The second request sends the
   references again, so the server remembers them (their packages, already in memory, go to the store, and
   the prompt's prefix state through them); only the candidate is encoded.
3. **after_restart**: the server is stopped and started again on the same store; the next request with the
   same references finds their packages and prefix state on disk (``restart_speedup`` = first /
   after_restart; the target is >= 3).
4. **no_cache**: the same requests on ``refsight serve --no-cache`` (every image encoded afresh, every prompt
   prefilled whole: Ollama's behaviour); ``cache_speedup`` = no_cache / cached, and ``tokens_equal``: every
   answer of 1-3 is the baseline's answer to the same request.

Prints ONE JSON line: ``{"model", "client", "references", "requests", "image_px", "first_s", "after_restart_s",
"restart_speedup", "cached_s", "no_cache_s", "cache_speedup", "answers_equal", "tokens_equal", ...}`` (request
times: medians, seconds). ``openai_client.py`` runs the same scenario with the OpenAI SDK.

    python benchmarks/ollama_client.py [--model shape-qwen2-vl-2b-gguf] [--size 224] [--requests 3]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

REFERENCES = ("chelsea", "coffee", "astronaut")
CANDIDATES = ("horse", "china", "rocket", "chelsea", "coffee", "astronaut")
QUESTION = "Does the last image show the same kind of thing as the first three?"

#: ``ask(url, references, candidate, tokens) -> (seconds, answer)``: one request as the client sends it.
Ask = Callable[[str, list[bytes], bytes, int], tuple[float, str]]


def photo(name: str, size: int, variant: int = 0) -> bytes:
    """A bundled photo at ``size`` px, PNG; ``variant`` > 0 crops and mirrors it (a new candidate, never a reference)."""
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


class Serve:
    """``refsight serve MODEL --store DIR`` in its own process, ready when ``/healthz`` answers."""

    def __init__(self, model: str, store: Path, *flags: str) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        command = [sys.executable, "-m", "refsight.cli", "serve", model, "--store", str(store), "--port", str(self.port),
                   "--attributes", "none", *flags]
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    def __enter__(self) -> "Serve":
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
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:  # a request still running holds uvicorn's graceful shutdown
            self.process.kill()
            self.process.wait()


def _ask_ollama(url: str, references: list[bytes], candidate: bytes, tokens: int) -> tuple[float, str]:
    """One Ollama chat request: the references, then the candidate, then the question; (seconds, answer)."""
    import ollama

    client = ollama.Client(host=url, timeout=1800)
    model = client.list().models[0].model  # what an Ollama user picks from `ollama list`
    began = time.perf_counter()
    reply = client.chat(
        model=model, options={"num_predict": tokens, "temperature": 0},
        messages=[{"role": "user", "content": QUESTION, "images": [*references, candidate]}],
    )
    return time.perf_counter() - began, reply.message.content


def parser(description: str) -> argparse.ArgumentParser:
    """The flags both unchanged-client benchmarks take."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--model", default="shape-qwen2-vl-2b-gguf")
    p.add_argument("--size", type=int, default=224, help="image side in pixels")
    p.add_argument("--requests", type=int, default=3, help="requests with new candidates after the first")
    p.add_argument("--max-new-tokens", type=int, default=4)
    return p


def run(args: argparse.Namespace, ask: Ask, client: str) -> dict:
    """The four paths with ``ask`` (see the module docstring); the figures of the one JSON line."""
    # A `timeout` or Ctrl-C on this script stops its servers too (the context managers exit).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    references = [photo(name, args.size) for name in REFERENCES]
    candidates = [photo(CANDIDATES[i % len(CANDIDATES)], args.size, i + 1) for i in range(args.requests + 2)]
    asks = lambda url, sent: [ask(url, references, c, args.max_new_tokens) for c in sent]  # noqa: E731
    with tempfile.TemporaryDirectory(prefix=f"refsight-{client}-bench-") as tmp:
        store = Path(tmp) / "store"
        with Serve(args.model, store) as server:
            [first] = asks(server.url, candidates[:1])
            cached = asks(server.url, candidates[1:-1])
        with Serve(args.model, store) as server:
            [after_restart] = asks(server.url, candidates[-1:])
        with Serve(args.model, Path(tmp) / "fresh", "--no-cache") as server:
            baseline = asks(server.url, candidates)  # the same requests, in the same order
    ours = [first, *cached, after_restart]
    cached_s = statistics.median(t for t, _ in cached)
    no_cache_s = statistics.median(t for t, _ in baseline[1:-1])
    equal = sum(a == b for (_, a), (_, b) in zip(ours, baseline))
    return {
        "model": args.model, "client": client, "references": len(references), "requests": args.requests,
        "image_px": args.size, "first_s": round(first[0], 3), "after_restart_s": round(after_restart[0], 3),
        "restart_speedup": round(first[0] / after_restart[0], 2), "cached_s": round(cached_s, 3),
        "no_cache_s": round(no_cache_s, 3), "cache_speedup": round(no_cache_s / cached_s, 2),
        "answers_equal": equal, "tokens_equal": equal == len(ours), "cpus": os.cpu_count(),
    }


def main(argv: list[str] | None = None) -> int:
    """Run the four paths with the ``ollama`` library; print the one JSON line."""
    args = parser(__doc__.split("\n\n")[0]).parse_args(argv)
    print(json.dumps(run(args, _ask_ollama, "ollama-python")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
