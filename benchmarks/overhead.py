"""refsight's own cost per request on tiny models (where the runtime is fast): one JSON line.

For each path, the same request is timed end to end in refsight and, within it, the time spent
inside the runtime's own calls; refsight's own work is the difference (its checks, templates,
package handling, request bodies, threads, HTTP):

- ``transformers`` (``tiny-qwen2-vl``): ``backend.generate`` of cached references and a cached
  candidate, minus the time inside ``model.generate``;
- ``llamacpp`` (``tiny-qwen2-vl-gguf``): the same request, minus the time inside llama.cpp's calls
  (``LlamaRuntime``: evaluating chunks and images, decoding, logits, state);
- ``vllm`` (``tiny-qwen2-vl-vllm`` on a server at ``--vllm-url``, or one started here): the same
  request (references by uuid, candidate as pixels), minus the HTTP exchange with vLLM;
- ``http``: ``/v1/chat/completions`` on refsight's app under uvicorn in this process
  (``tiny-qwen2-vl``, a reference by ``refsight://ref/ID`` and a base64 candidate), sent by a client in
  a process of its own as real clients are (one kept connection), minus the in-process backend calls it
  makes (``encode``, ``generate`` or ``generate_stream``): the front door's own cost.

Figures per path: ``<path>_p50_ms`` and ``<path>_p95_ms`` (refsight's own work per request) and
``<path>_runtime_p50_ms`` (the runtime's own time), over ``--requests`` requests after 2 untimed ones.

    python benchmarks/overhead.py [--paths transformers,llamacpp,vllm,http] [--requests 30] [--vllm-url URL]
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

PATHS = ("transformers", "llamacpp", "vllm", "http")
PROMPT = "Same colour?"
#: llama.cpp's own calls (native.LlamaRuntime): everything that runs the model.
LLAMA_CALLS = ("eval_chunk", "decode_image", "decode_token", "decode_batch", "encode_chunk", "last_logits",
               "state_bytes", "restore_state", "tokenized", "tokenize", "piece", "is_eog", "chunk_info", "clear")


class Inside:
    """Sums the wall time spent inside some methods of an object (the real calls, timed; outermost only)."""

    def __init__(self, target: Any, names: tuple[str, ...]) -> None:
        self.ms, self._local = 0.0, threading.local()
        for name in names:
            if hasattr(target, name):
                setattr(target, name, self._timed(getattr(target, name)))

    def _timed(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            depth = getattr(self._local, "depth", 0)
            self._local.depth = depth + 1
            began = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self._local.depth = depth
                if depth == 0:
                    self.ms += (time.perf_counter() - began) * 1000
        return timed

    def take(self) -> float:
        """The time summed since the last take (ms)."""
        ms, self.ms = self.ms, 0.0
        return ms


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))], 3)


def _figures(path: str, pairs: list[tuple[float, float]]) -> dict[str, float]:
    """(wall ms, runtime ms) per request -> refsight's own p50/p95 and the runtime's p50."""
    own = [wall - inside for wall, inside in pairs]
    return {f"{path}_p50_ms": _percentile(own, 0.5), f"{path}_p95_ms": _percentile(own, 0.95),
            f"{path}_runtime_p50_ms": _percentile([inside for _, inside in pairs], 0.5)}


def _photos(size: int) -> list:
    from refsight.inputs.images import load_image
    from refsight.samples import load_sample

    return [load_image(load_sample(name).resize((size, size)), name=name) for name in ("chelsea", "coffee", "rocket")]


def _timed_requests(backend: Any, inside: Inside, photos: list, args: argparse.Namespace) -> list[tuple[float, float]]:
    """The request (two cached references, a cached candidate) ``2 + --requests`` times; the timed pairs."""
    from refsight.requests import GenerationRequest

    packages = backend.encode(photos)
    request = GenerationRequest([*packages[:2], "Compare the candidate", packages[2], PROMPT],
                                max_new_tokens=args.max_new_tokens, prefix_segments=2)
    pairs = []
    for i in range(args.requests + 2):
        inside.take()
        began = time.perf_counter()
        backend.generate([request])
        wall = (time.perf_counter() - began) * 1000
        if i >= 2:
            pairs.append((wall, inside.take()))
    return pairs


def _transformers(args: argparse.Namespace, photos: list) -> dict[str, float]:
    from refsight.backends.registry import get_backend

    backend = get_backend("tiny-qwen2-vl")
    return _figures("transformers", _timed_requests(backend, Inside(backend.model, ("generate",)), photos, args))


def _llamacpp(args: argparse.Namespace, photos: list) -> dict[str, float]:
    from refsight.backends.registry import get_backend

    backend = get_backend("tiny-qwen2-vl-gguf")
    return _figures("llamacpp", _timed_requests(backend, Inside(backend.runtime, LLAMA_CALLS), photos, args))


def _vllm(args: argparse.Namespace, photos: list) -> dict[str, float]:
    from refsight.backends.vllm.loading import load_vllm_backend

    server = None
    if args.vllm_url is None:
        from refsight.backends.vllm.serve import start_server

        server = start_server("tiny-qwen2-vl-vllm", log=sys.stderr)
    try:
        backend = load_vllm_backend(f"vllm:{args.vllm_url or server.url}")
        try:
            figures = _figures("vllm", _timed_requests(backend, Inside(backend.client, ("_exchange",)), photos, args))
            return {**figures, "vllm_mode": backend.runtime_info()}
        finally:
            backend.close()
    finally:
        if server is not None:
            server.stop()


#: The HTTP client, a process of its own as real clients are (in this process it would share the GIL with
#: the server's threads): one kept connection that sends head and body in one write (http.client; httpx
#: writes them apart, and Nagle's algorithm then waits on the server's delayed ACK, ~40 ms). One request per
#: "go" line on stdin, its wall-clock ms on stdout, so each is paired with the runtime's time in the server.
_CLIENT = """
import http.client, sys, time
port, body_path = int(sys.argv[1]), sys.argv[2]
payload = open(body_path, "rb").read()
connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
for line in sys.stdin:
    began = time.perf_counter()
    connection.request("POST", "/v1/chat/completions", body=payload, headers={"Content-Type": "application/json"})
    response = connection.getresponse()
    answer = response.read()
    if response.status != 200:
        sys.exit(f"chat failed: HTTP {response.status}: {answer[:300]!r}")
    print((time.perf_counter() - began) * 1000, flush=True)
"""


def _http(args: argparse.Namespace, photos: list) -> dict[str, float]:
    import subprocess

    import httpx
    from serve_load import _Server

    from refsight.server import ServerConfig, create_app

    buffer = io.BytesIO()
    photos[2].image.save(buffer, format="PNG")
    candidate = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
    with tempfile.TemporaryDirectory(prefix="refsight-overhead-") as tmp:
        config = ServerConfig(store=Path(tmp) / "store", model="tiny-qwen2-vl", keys={}, workers=1)
        app = create_app(config)
        app.state.service.open()  # as refsight serve does: the model loaded before the port is bound
        # On the class: the app may call the backend through another instance of the same weights (its context).
        inside = Inside(type(app.state.service.engine.backend()), ("encode", "generate", "generate_stream"))
        with _Server(app) as server, httpx.Client(base_url=server.url, timeout=120) as client:
            buffer = io.BytesIO()
            photos[0].image.save(buffer, format="PNG")
            reference = base64.b64encode(buffer.getvalue()).decode()
            client.post("/v1/references", json={"image": reference, "id": "ref"}).raise_for_status()
            body = {"model": "tiny-qwen2-vl", "max_tokens": args.max_new_tokens, "temperature": 0,
                    "messages": [{"role": "user", "content": [
                        {"type": "image_url", "image_url": {"url": "refsight://ref/ref"}},
                        {"type": "text", "text": "Compare the candidate"},
                        {"type": "image_url", "image_url": {"url": candidate}},
                        {"type": "text", "text": PROMPT}]}]}
            body_path = Path(tmp) / "body.json"
            body_path.write_text(json.dumps(body))
            port = server.url.rsplit(":", 1)[1]
            pairs = []
            with subprocess.Popen([sys.executable, "-c", _CLIENT, port, str(body_path)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True) as clientproc:
                for i in range(args.requests + 2):
                    inside.take()
                    clientproc.stdin.write("go\n")
                    clientproc.stdin.flush()
                    line = clientproc.stdout.readline()
                    if not line:
                        raise SystemExit("the HTTP client failed (its error is above)")
                    if i >= 2:
                        pairs.append((float(line), inside.take()))
                clientproc.stdin.close()
    return _figures("http", pairs)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--paths", default=",".join(PATHS), help=f"comma-separated, of {', '.join(PATHS)}")
    parser.add_argument("--requests", type=int, default=30, help="timed requests per path (default 30)")
    parser.add_argument("--size", type=int, default=56, help="photo side in pixels (default 56)")
    parser.add_argument("--max-new-tokens", type=int, default=2)
    parser.add_argument("--vllm-url", default=None, help="a running vLLM server of tiny-qwen2-vl-vllm (default: start one)")
    return parser


def main(argv: list[str] | None = None) -> dict:
    """Run the chosen paths and print one JSON line; returns the figures."""
    args = _parser().parse_args(argv)
    paths = [p.strip() for p in args.paths.split(",") if p.strip()]
    unknown = sorted(set(paths) - set(PATHS))
    if unknown:
        raise SystemExit(f"unknown path(s) {unknown}; choose from {', '.join(PATHS)}")
    photos = _photos(args.size)
    runs = {"transformers": _transformers, "llamacpp": _llamacpp, "vllm": _vllm, "http": _http}
    figures: dict[str, Any] = {"requests": args.requests, "size": args.size, "max_new_tokens": args.max_new_tokens}
    for path in paths:
        figures.update(runs[path](args, photos))
        print(f"so far: {json.dumps(figures)}", file=sys.stderr, flush=True)
    print(json.dumps(figures))
    return figures


if __name__ == "__main__":
    main(sys.argv[1:])
