"""Load on the HTTP service: N concurrent clients, cached-reference compares and searches.

Starts the real app under uvicorn on 127.0.0.1 (a free port) in this process, adds
R reference photos over HTTP, then N client threads (httpx) send a fixed number of
requests: compares of C candidate photos against two cached references each, and
text searches. The backend's ``encode`` is wrapped to count every image it encodes,
across adds, references and candidates, so the run proves there was no duplicate
encoding under concurrency: ``encodes`` must equal ``distinct_images`` (R + C).

Prints one JSON line: ``{"requests", "errors", "rps", "p50_ms", "p99_ms", "encodes", ...}``.

    python benchmarks/serve_load.py [--model tiny-qwen2-vl] [--clients 16] [--requests 48]

``--sweep 1,2,4`` runs the load at each worker count twice, alternating: every core per worker (torch's
default, as before refsight's thread budget) and the budget (``max(1, cores // workers)`` threads each),
and prints one line with both throughputs and ``budget_vs_all_cores`` per worker count.

With ``--replicas N`` (N >= 2) it runs N ``refsight serve`` processes on one PostgreSQL catalog
and one blob directory instead (see ``benchmarks/serve_replicas.py``)::

    python benchmarks/serve_load.py --replicas 2 --references 200 [--catalog postgresql://...] [--cache auto]

``--cache URL`` (``auto``: a throwaway Redis from the distribution's binary) puts every replica's
Redis tier on that server; ``tier_share`` then shows ``redis`` between ``memory`` and ``disk``.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import socket
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

PHOTOS = ("chelsea", "coffee", "astronaut", "rocket", "horse", "china")
RUBRIC = "striped fur\npointed ears\nsame colour pattern"
QUERIES = ("a cat", "a cup of coffee", "a rocket", "a person")


def _photo_b64(name: str, size: int, flip: bool = False) -> str:
    from PIL import Image

    from refsight.samples import load_sample

    image = load_sample(name).resize((size, size))
    if flip:
        image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


class _Server:
    def __init__(self, app) -> None:
        import uvicorn

        self.sock = socket.socket()
        # As refsight serve's own sockets: without it every kept-alive request waits ~40 ms (Nagle, delayed ACK).
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> "_Server":
        self.thread.start()
        while not self.server.started:
            if not self.thread.is_alive():
                raise SystemExit("the server failed to start")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-qwen2-vl")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--requests", type=int, default=48, help="requests in the timed phase")
    parser.add_argument("--references", type=int, default=4)
    parser.add_argument("--candidates", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2, help="server threads running model work")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads per worker (default: refsight serve's budget, cores // workers; "
                             "0: torch's own default, every core per worker, as before the budget)")
    parser.add_argument("--sweep", default=None, metavar="W,W,...",
                        help="worker counts to run, each with every core per worker (torch's default, as before "
                             "the thread budget) and with the budget, alternating; one line of both rps and their ratio")
    parser.add_argument("--size", type=int, default=56, help="side of the square test photos in pixels")
    parser.add_argument("--search-every", type=int, default=4, help="every n-th request is a search (0: none)")
    parser.add_argument("--store", default=None, help="store directory (default: a fresh temporary one)")
    parser.add_argument("--replicas", type=int, default=1, help="refsight serve processes sharing one store (>= 2)")
    parser.add_argument("--catalog", default=None, help="with --replicas: the PostgreSQL URL (default: a throwaway server)")
    parser.add_argument("--cache", default=None, help="with --replicas: a Redis URL for every replica (auto: a throwaway one)")
    return parser


class _EncodeCounter:
    """Counts every image the backend's vision encoder is handed, by any path (adds, references, candidates)."""

    def __init__(self, backend) -> None:
        self.backend, self.encoded, self.lock = backend, [], threading.Lock()
        self.original = backend.encode

    def __enter__(self) -> "_EncodeCounter":
        def counting_encode(images):
            with self.lock:
                self.encoded.extend(image.sha256 for image in images)
            return self.original(images)

        self.backend.encode = counting_encode
        return self

    def __exit__(self, *exc: object) -> None:
        self.backend.encode = self.original


class _Clients:
    """One httpx connection pool per client thread, all closed at the end."""

    def __init__(self, url: str) -> None:
        self.url, self.local, self.lock, self.all = url, threading.local(), threading.Lock(), []

    def get(self):
        import httpx

        if not hasattr(self.local, "client"):
            self.local.client = httpx.Client(base_url=self.url, timeout=600)
            with self.lock:
                self.all.append(self.local.client)
        return self.local.client

    def close(self) -> None:
        for client in self.all:
            client.close()


def _post(clients: _Clients, path: str, body: dict) -> tuple[bool, float]:
    """One timed request: (200?, milliseconds); a failure is printed to stderr, never raised."""
    import httpx

    start = time.perf_counter()
    try:
        response = clients.get().post(path, json=body)
        ok = response.status_code == 200
        if not ok:
            print(f"error: {path} -> {response.status_code} {response.text[:200]}", file=sys.stderr)
    except httpx.HTTPError as e:
        ok = False
        print(f"error: {path} -> {e!r}", file=sys.stderr)
    return ok, (time.perf_counter() - start) * 1000


def _add_references(url: str, references: list[str], ref_ids: list[str], clients: int) -> None:
    """Every reference added concurrently, twice: each must still be encoded once."""
    import httpx

    def add(i: int) -> int:
        body = {"image": references[i % len(references)], "id": ref_ids[i % len(references)]}
        return httpx.post(f"{url}/v1/references", json=body, timeout=600).status_code

    with ThreadPoolExecutor(clients) as pool:
        statuses = list(pool.map(add, range(2 * len(references))))
    if any(status != 201 for status in statuses):
        raise SystemExit(f"adding references failed: {statuses}")


def _request(args, i: int, ref_ids: list[str], candidates: list[str]) -> tuple[str, dict]:
    """The i-th request of the timed phase: a search every ``--search-every``, else a compare against two references."""
    if args.search_every and i % args.search_every == args.search_every - 1:
        return "/v1/search", {"text": QUERIES[i % len(QUERIES)], "k": 2}
    pair = [ref_ids[i % len(ref_ids)], ref_ids[(i + 1) % len(ref_ids)]]
    return "/v1/compare", {"candidate": candidates[i % len(candidates)], "criteria": RUBRIC, "ref_ids": pair}


def _load(url: str, args, ref_ids: list[str], candidates: list[str]) -> tuple[list[tuple[bool, float]], float]:
    """The timed phase: ``--requests`` requests from ``--clients`` threads; (outcomes, seconds)."""
    clients = _Clients(url)
    try:
        started = time.perf_counter()
        with ThreadPoolExecutor(args.clients) as pool:
            outcomes = list(pool.map(lambda i: _post(clients, *_request(args, i, ref_ids, candidates)),
                                     range(args.requests)))
        return outcomes, time.perf_counter() - started
    finally:
        clients.close()


def run_single(args) -> dict:
    """One in-process server: add the references, run the timed phase; the figures."""
    from refsight.backends.registry import get_backend
    from refsight.server import ServerConfig, create_app

    names = [(PHOTOS[i % len(PHOTOS)], i >= len(PHOTOS)) for i in range(args.references + args.candidates)]
    images = [_photo_b64(name, args.size, flip) for name, flip in names]
    references, candidates = images[: args.references], images[args.references :]
    ref_ids = [f"ref{i}" for i in range(args.references)]
    store = args.store or tempfile.mkdtemp(prefix="refsight-serve-load-")
    config = ServerConfig(store=store, model=args.model, keys={}, workers=args.workers, queue=4 * args.clients)
    from refsight.settings import apply_threads, available_cores, thread_budget

    if args.threads == 0:  # every core per worker: torch's own default (set again: a sweep ran budgets before)
        threads = apply_threads(available_cores())
    else:  # as refsight serve applies it (this server runs in-process, not through serve())
        threads = apply_threads(thread_budget(args.workers, args.threads))
    # The registry hands the server the same backend instance: its encodes are counted here.
    with _EncodeCounter(get_backend(args.model)) as counter, _Server(create_app(config)) as server:
        _add_references(server.url, references, ref_ids, args.clients)
        outcomes, elapsed = _load(server.url, args, ref_ids, candidates)
    latencies = [ms for _, ms in outcomes]
    return {
        "requests": len(outcomes),
        "workers": args.workers,
        "threads": threads,
        "errors": sum(not ok for ok, _ in outcomes),
        "rps": round(len(outcomes) / elapsed, 3),
        "p50_ms": round(statistics.median(latencies), 1),
        "p99_ms": round(_percentile(latencies, 0.99), 1),
        "encodes": len(counter.encoded),
        "distinct_encoded": len(set(counter.encoded)),
        "distinct_images": len(set(images)),
        "clients": args.clients,
        "model": args.model,
    }


def run_sweep(args) -> dict:
    """``--sweep``: at each worker count, every core per worker and the budget (alternating); rps and ratio each."""
    rows = []
    for workers in [int(w) for w in args.sweep.split(",") if w.strip()]:
        row: dict = {"workers": workers}
        for label, threads in (("all_cores", 0), ("budget", None)):
            figures = run_single(argparse.Namespace(**{**vars(args), "workers": workers, "threads": threads, "store": None}))
            row[f"{label}_threads"], row[f"{label}_rps"] = figures["threads"], figures["rps"]
            row[f"{label}_errors"] = figures["errors"]
            print(f"so far: {json.dumps(row)}", file=sys.stderr, flush=True)
        row["budget_vs_all_cores"] = round(row["budget_rps"] / row["all_cores_rps"], 3)
        rows.append(row)
    from refsight.settings import available_cores

    return {"sweep": rows, "cores": available_cores(), "clients": args.clients, "requests": args.requests,
            "model": args.model, "errors": sum(r["all_cores_errors"] + r["budget_errors"] for r in rows)}


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark, print its JSON line; exit 1 on errors or a duplicate encode."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.replicas > 1:
        from serve_replicas import run

        return run(args)
    if args.references + args.candidates > len(PHOTOS) * 2:
        parser.error(f"at most {len(PHOTOS) * 2} distinct images")
    if args.sweep:
        figures = run_sweep(args)
        print(json.dumps(figures), flush=True)
        return 0 if figures["errors"] == 0 else 1
    figures = run_single(args)
    print(json.dumps(figures), flush=True)
    return 0 if figures["errors"] == 0 and figures["encodes"] == figures["distinct_images"] else 1


if __name__ == "__main__":
    sys.exit(main())
