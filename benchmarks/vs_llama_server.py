"""refsight against llama-server itself: the same GGUF + mmproj, the same threads, one JSON line.

The peer is ``llama-server`` built from the llama.cpp that refsight's backend runs
(:mod:`llama_server`), started as its users start it (``-m MODEL --mmproj MMPROJ``, its
defaults: slot reuse by longest common prefix, prompt cache in RAM), on loopback beside
``refsight serve --model MODEL`` (references stored once over ``POST /v1/references``,
named ``refsight://ref/<id>`` in the chat). Both get the same OpenAI chat requests
through ``/v1/chat/completions`` (greedy, ``max_tokens`` fixed), R references then a
candidate never sent before, in one run:

- (a) ``varied``: each request's shortlist is R of a working set of W references (as
  recall produces them), drawn at random (seeded);
- (b) ``after_restart``: both servers restarted, then the first requests, on shortlists
  seen before the restart (refsight's packages and prefix states are on disk;
  llama-server's slot and prompt cache were in memory);
- (c) ``concurrent``: C clients at once, each with its own R references (both servers with
  ``-np C``: C slots decoding together, each with its own prefix);
- (d) ``same_refs``: the same R references in the same order every time, each request with
  a new candidate under a new rubric, after one untimed request (llama-server's slot is
  warm: on a transformer it evaluates only what follows the references; a hybrid's
  recurrent state cannot be cut back to them unless a context checkpoint sits there).

Figures are llama-server's seconds over refsight's for the same requests
(``speedup_varied``, ``speedup_after_restart``, ``speedup_concurrent``,
``ratio_same_refs``). ``ceiling_varied`` is (a)'s bound, estimated from the same run:
llama-server's seconds over the same less every reference's encode (:func:`varied_ceiling`),
all that a cache can skip while the language model runs over a changed prefix. ``text_equal``: in the workloads both servers answer one request
at a time, (a), (b) and (d), with llama.cpp's default kernels, the greedy answers agree
wherever the two prompts are identical (same rendered prompt, checked with both servers'
``/apply-template``, and the same prompt token count per request), up to a last character
cut in half by ``max_tokens`` (refsight ends the text with U+FFFD, llama-server drops the
bytes). (c) is reported apart (``text_equal_concurrent``): there the servers' kernels
differ on purpose. refsight's slots run without flash attention and decode at most three
sequences a call, so that an answer never depends on the requests beside it;
llama-server's answers under ``-np`` do. The prompts are identical here because the
messages alternate text and image parts: llama-server joins two ADJACENT text parts with
a newline where refsight joins them with nothing, and names images with a random marker
(pinned here with ``LLAMA_MEDIA_MARKER`` to mtmd's default, which refsight uses).

    python benchmarks/vs_llama_server.py --model shape-qwen2-vl-2b-gguf-q4 --size 448 --refs 4

Weights are random: the timings are real, the text is not.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from llama_server import LlamaServer, build_info, ensure_llama_server, free_port, stop_process  # noqa: E402

MARKER = "<__media__>"  # mtmd's default media marker (llama-server's is random unless pinned)


def _log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


# ------------------------------------------------------------------ images


def variant(name: str, k: int, size: int) -> bytes:
    """A PNG of bundled photo ``name``: crop ``k`` of a fixed sequence (shifted, every other one mirrored)."""
    from PIL import Image

    from refsight.samples import load_sample

    photo = load_sample(name).convert("RGB")
    w, h = photo.size
    side = int(min(w, h) * 0.8)
    step = max(1, (min(w, h) - side) // 4)
    x, y = (k * step) % (w - side + 1), (k * 2 * step // 3) % (h - side + 1)
    image = photo.crop((x, y, x + side, y + side)).resize((size, size), Image.Resampling.BICUBIC)
    if k % 2:
        image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


class Candidates:
    """Fresh candidate images, never a reference and never sent twice."""

    def __init__(self, size: int, offset: int) -> None:
        from refsight.samples import SAMPLE_NAMES

        self.names, self.size, self.k = SAMPLE_NAMES, size, offset

    def next(self) -> bytes:
        """The next unused candidate (PNG)."""
        self.k += 1
        return variant(self.names[self.k % len(self.names)], 1000 + self.k, self.size)


def data_url(png: bytes) -> str:
    """A base64 ``data:`` URL of a PNG."""
    return "data:image/png;base64," + base64.b64encode(png).decode()


# ---------------------------------------------------------------- requests


@dataclass
class Request:
    """One comparison: the shortlist (reference indexes into the working set) and a fresh candidate."""

    refs: list[int]
    candidate: bytes
    rubric: str = "Does the candidate match the references? Answer yes or no, then why."
    answers: dict[str, dict] = field(default_factory=dict)


def messages(request: Request, ref_image) -> list[dict]:
    """The chat: text and images alternating (so both servers render the same prompt)."""
    parts: list[dict] = []
    for n, index in enumerate(request.refs):
        parts += [{"type": "text", "text": f"Reference {n + 1}:"}, {"type": "image_url", "image_url": {"url": ref_image(index)}}]
    parts += [
        {"type": "text", "text": "Candidate:"}, {"type": "image_url", "image_url": {"url": data_url(request.candidate)}},
        {"type": "text", "text": request.rubric},
    ]
    return [{"role": "user", "content": parts}]


class Peer:
    """One server under test: how it names references and how it is restarted."""

    def __init__(self, name: str, model: str, ref_image, restart) -> None:
        self.name, self.model, self.ref_image, self.restart = name, model, ref_image, restart
        self.url = ""

    def ask(self, request: Request, max_tokens: int) -> float:
        """Send ``request``; keep the answer; the seconds it took."""
        import httpx

        body = {"model": self.model, "messages": messages(request, self.ref_image), "max_tokens": max_tokens,
                "temperature": 0}
        began = time.perf_counter()
        response = httpx.post(f"{self.url}/v1/chat/completions", json=body, timeout=3600)
        seconds = time.perf_counter() - began
        if response.status_code != 200:
            raise RuntimeError(f"{self.name}: {response.status_code} {response.text[:500]}")
        data = response.json()
        request.answers[self.name] = {
            "text": data["choices"][0]["message"]["content"], "prompt_tokens": data["usage"]["prompt_tokens"],
            "seconds": seconds, "encode_s": data.get("refsight", {}).get("timings_ms", {}).get("encode", 0.0) / 1000,
        }
        return seconds


def run_sequential(peers: list[Peer], requests: list[Request], max_tokens: int, label: str) -> dict[str, float]:
    """Each request to every peer in turn (interleaved: both see the same machine load); seconds per peer."""
    totals = {p.name: 0.0 for p in peers}
    for i, request in enumerate(requests):
        for peer in peers:
            totals[peer.name] += peer.ask(request, max_tokens)
        _log(f"{label} {i + 1}/{len(requests)}: " + ", ".join(f"{n} {s:.1f} s" for n, s in totals.items()))
    return totals


def run_concurrent(peer: Peer, requests: list[Request], clients: int, max_tokens: int) -> float:
    """``clients`` threads, each sending its own requests in order; the wall-clock seconds of all of them."""
    per_client = [requests[c::clients] for c in range(clients)]
    began = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(lambda mine: [peer.ask(r, max_tokens) for r in mine], per_client))
    return time.perf_counter() - began


# ------------------------------------------------------------------ servers


class RefsightServer:
    """``refsight serve`` in its own process on loopback, with a store on disk that outlives restarts."""

    def __init__(self, model: str, mmproj: str | None, store: Path, log_path: Path, parallel: int = 1,
                 flash_attn: str | None = None) -> None:
        self.model, self.mmproj, self.store, self.log_path = model, mmproj, store, log_path
        self.parallel = parallel  # slots (-np): read at each start
        self.flash_attn = flash_attn  # -fa, when given
        self.process: subprocess.Popen | None = None
        self.url = ""

    def start(self, timeout: float = 900.0) -> RefsightServer:
        """Start and wait for ``/healthz`` (the model is loaded before it answers)."""
        import httpx

        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        cmd = [sys.executable, "-m", "refsight.cli", "serve", "--model", self.model, "--port", str(port),
               "--store", str(self.store), "--attributes", "none", "--workers", str(max(4, self.parallel)),
               "-np", str(self.parallel)]
        if self.mmproj:
            cmd += ["--mmproj", self.mmproj]
        if self.flash_attn:
            cmd += ["-fa", self.flash_attn]
        began = time.perf_counter()
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        while True:
            try:
                if httpx.get(f"{self.url}/healthz", timeout=5).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            if self.process.poll() is not None or time.perf_counter() - began > timeout:
                self.stop()
                raise RuntimeError("refsight serve did not start:\n" + self.log_path.read_text(errors="replace")[-3000:])
            time.sleep(0.5)

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after 60 s). Idempotent."""
        stop_process(self.process, timeout=60)
        self.process = None

    def add_references(self, images: list[bytes]) -> float:
        """Store the working set (each encoded once); the seconds it took."""
        import httpx

        began = time.perf_counter()
        for i, png in enumerate(images):
            body = {"image": base64.b64encode(png).decode(), "id": f"ref-{i:02d}"}
            response = httpx.post(f"{self.url}/v1/references", json=body, timeout=3600)
            if response.status_code != 201:
                raise RuntimeError(f"adding ref-{i:02d}: {response.status_code} {response.text[:500]}")
            _log(f"refsight: stored ref-{i:02d} ({i + 1}/{len(images)}, {time.perf_counter() - began:.1f} s)")
        return time.perf_counter() - began


def model_files(model: str, mmproj: str | None) -> tuple[Path, Path]:
    """The GGUF and mmproj of a built-in (built on first use) or of ``llamacpp:PATH`` with ``--mmproj``."""
    if model.startswith("llamacpp:"):
        if not mmproj:
            raise SystemExit("--mmproj is needed with llamacpp:PATH")
        return Path(model[len("llamacpp:"):]), Path(mmproj)
    from refsight.builtin_models.gguf import GGUF_MODELS, ensure_gguf
    from refsight.builtin_models.gguf_quantized import QUANTIZED_GGUF_MODELS, ensure_quantized_gguf

    if model in QUANTIZED_GGUF_MODELS:
        return ensure_quantized_gguf(model)
    if model in GGUF_MODELS:
        return ensure_gguf(model)
    raise SystemExit(f"{model}: not a built-in GGUF model; use llamacpp:PATH --mmproj PATH")


def rendered_prompts_equal(llama_url: str, refsight_url: str, request: Request, ref_urls) -> bool:
    """llama-server's rendering of a chat equals refsight's: both servers' own ``/apply-template`` on the same
    messages (each renders the GGUF's template with its own BOS/EOS and architecture, whatever the family)."""
    import httpx

    body = {"messages": messages(request, ref_urls)}
    prompts = [httpx.post(f"{url}/apply-template", json=body, timeout=600) for url in (llama_url, refsight_url)]
    return all(r.status_code == 200 for r in prompts) and prompts[0].json().get("prompt") == prompts[1].json().get("prompt")


# ----------------------------------------------------------------- workloads


def workloads(args, candidates: Candidates) -> dict[str, list[Request]]:
    """The four request lists, with shortlists drawn from a seeded generator."""
    rng = random.Random(args.seed)
    working = list(range(args.working_set))
    varied = [Request(rng.sample(working, args.refs), candidates.next()) for _ in range(args.varied)]
    after = [Request(list(r.refs), candidates.next()) for r in varied[: args.after_restart]]
    sets = [rng.sample(working, args.refs) for _ in range(args.clients)]
    concurrent = [Request(list(sets[i % args.clients]), candidates.next()) for i in range(args.clients * args.per_client)]
    same = rng.sample(working, args.refs)
    # the first is untimed; each asks about other criteria (a user's new rubric over the same references)
    same_refs = [Request(list(same), candidates.next(), rubric=RUBRICS[i % len(RUBRICS)]) for i in range(args.same + 1)]
    return {"varied": varied, "after_restart": after, "concurrent": concurrent, "same_refs": same_refs}


#: (d)'s rubrics: the criteria change with every request, the references do not.
RUBRICS = (
    "Same animal as the references? Judge the fur length and the ear shape.",
    "Compare the forehead stripes and the eye colour with the references. Yes or no, then why.",
    "Is the candidate's coat pattern the references'? Answer in one line.",
    "Do the nose and whiskers match the references? Yes or no.",
    "Same pose and lighting as the references? Say which differ.",
)


def _complete(text: str) -> str:
    """The text without a trailing incomplete character: an answer cut at max_tokens inside a multi-byte
    character ends in U+FFFD in refsight and without those bytes in llama-server."""
    return text.rstrip("\ufffd")


def text_equal(all_requests: list[Request], identical_render: bool) -> tuple[bool, int]:
    """(answers equal wherever the prompts are identical, how many requests had identical prompts)."""
    same_prompt = [r for r in all_requests if identical_render and
                   r.answers["llama-server"]["prompt_tokens"] == r.answers["refsight"]["prompt_tokens"]]
    equal = all(_complete(r.answers["llama-server"]["text"]) == _complete(r.answers["refsight"]["text"]) for r in same_prompt)
    return equal and bool(same_prompt), len(same_prompt)


def varied_ceiling(requests: list[Request], refs: int) -> float | None:
    """What any exact cache could gain in (a), estimated from the same run: llama-server's seconds over those seconds
    less the encodes of each request's ``refs`` references, each costing what refsight's encode of that request's new
    candidate cost (an image of the same size through the same tower). The language model still runs over every
    changed prefix (a state after other references in another order cannot stand for it): the references' encodes
    are all a cache can skip there. None when the estimate leaves llama-server no time."""
    llama = sum(r.answers["llama-server"]["seconds"] for r in requests)
    saved = sum(refs * r.answers["refsight"]["encode_s"] for r in requests)
    return round(llama / (llama - saved), 3) if saved < llama else None


def measure(args, servers: tuple[LlamaServer, RefsightServer], peers: list[Peer], work: dict) -> dict:
    """Run (a), (d), (b), (c) in that order; seconds per workload and peer."""
    seconds: dict[str, dict[str, float]] = {}
    seconds["varied"] = run_sequential(peers, work["varied"], args.max_tokens, "(a) varied")
    warm, *timed = work["same_refs"]
    run_sequential(peers, [warm], args.max_tokens, "(d) warm-up")
    seconds["same_refs"] = run_sequential(peers, timed, args.max_tokens, "(d) same refs")
    for peer in peers:
        peer.restart()
    seconds["after_restart"] = run_sequential(peers, work["after_restart"], args.max_tokens, "(b) after restart")
    for server in servers:  # llama-server's answer to concurrency, and refsight's: -np C slots
        server.parallel = args.clients
    for peer in peers:
        peer.restart()
    seconds["concurrent"] = {p.name: run_concurrent(p, work["concurrent"], args.clients, args.max_tokens) for p in peers}
    _log("(c) concurrent: " + ", ".join(f"{n} {s:.1f} s" for n, s in seconds["concurrent"].items()))
    return seconds


def main(argv: list[str] | None = None) -> dict:
    """Parse ``argv``, run, print the JSON line and return it as a dict."""
    args = _parser().parse_args(argv)
    binary = ensure_llama_server(log=_log)
    model_path, mmproj_path = model_files(args.model, args.mmproj)
    threads = len(os.sched_getaffinity(0))
    references = [variant(_names()[i % len(_names())], i // len(_names()), args.size) for i in range(args.working_set)]
    ref_urls = [data_url(png) for png in references]
    work = workloads(args, Candidates(args.size, args.working_set))
    with tempfile.TemporaryDirectory(prefix="vs-llama-server-") as tmp:
        tmp = Path(tmp)
        llama = LlamaServer(binary, model_path, mmproj_path, threads=threads, parallel=1, n_ctx=args.n_ctx,
                            log_path=tmp / "llama-server.log")
        refsight = RefsightServer(args.model, args.mmproj, tmp / "store", tmp / "refsight.log")
        os.environ["LLAMA_MEDIA_MARKER"] = MARKER  # inherited by llama-server
        try:
            return _run(args, llama, refsight, ref_urls, references, work, threads)
        finally:
            llama.stop()
            refsight.stop()


def _run(args, llama, refsight, ref_urls, references, work, threads) -> dict:
    starts: dict[str, list[float]] = {"llama-server": [], "refsight": []}

    def restarter(server, name: str):
        def restart() -> None:
            server.stop()
            began = time.perf_counter()
            server.start()
            starts[name].append(round(time.perf_counter() - began, 1))
            peers[name].url = server.url
        return restart

    peers = {
        "llama-server": Peer("llama-server", "gguf", lambda i: ref_urls[i], restarter(llama, "llama-server")),
        "refsight": Peer("refsight", args.model, lambda i: f"refsight://ref/ref-{i:02d}", restarter(refsight, "refsight")),
    }
    for peer in peers.values():
        peer.restart()
    ingest_s = refsight.add_references(references)
    identical = rendered_prompts_equal(llama.url, refsight.url, work["varied"][0], lambda i: ref_urls[i])
    seconds = measure(args, (llama, refsight), list(peers.values()), work)
    one_at_a_time = [r for kind in ("varied", "after_restart", "same_refs") for r in work[kind]]
    equal, n_identical = text_equal(one_at_a_time, identical)
    equal_concurrent, _ = text_equal(work["concurrent"], identical)
    ratio = {k: round(v["llama-server"] / v["refsight"], 3) for k, v in seconds.items()}
    line = {
        "benchmark": "vs_llama_server", "model": args.model, "size": args.size, "references": args.refs,
        "working_set": args.working_set, "threads": threads, "clients": args.clients,
        "requests": {k: len(v) - (k == "same_refs") for k, v in work.items()},
        "speedup_varied": ratio["varied"], "speedup_after_restart": ratio["after_restart"],
        "speedup_concurrent": ratio["concurrent"], "ratio_same_refs": ratio["same_refs"],
        "ceiling_varied": varied_ceiling(work["varied"], args.refs),
        "text_equal": equal, "identical_prompts": n_identical, "requests_total": len(one_at_a_time),
        "text_equal_concurrent": equal_concurrent,
        "rendered_prompt_equal": identical,
        "seconds": {k: {n: round(s, 1) for n, s in v.items()} for k, v in seconds.items()},
        "refsight_ingest_s": round(ingest_s, 1), "start_s": starts,
        "llama_server_build_s": build_info().get("build_s"), "random_weights": True,
    }
    if args.answers:
        Path(args.answers).write_text(json.dumps(
            {k: [{"refs": r.refs, **{n: a for n, a in r.answers.items()}} for r in v] for k, v in work.items()}, indent=1))
    print(json.dumps(line))
    return line


def _names() -> tuple[str, ...]:
    from refsight.samples import SAMPLE_NAMES

    return SAMPLE_NAMES


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="shape-qwen2-vl-2b-gguf-q4", help="a built-in GGUF, or llamacpp:PATH")
    parser.add_argument("--mmproj", default=None, help="with llamacpp:PATH")
    parser.add_argument("--size", type=int, default=448, help="image side in pixels")
    parser.add_argument("--refs", type=int, default=4, help="R: references per request")
    parser.add_argument("--working-set", type=int, default=16, help="W: references shortlists are drawn from")
    parser.add_argument("--varied", type=int, default=6, help="(a) requests")
    parser.add_argument("--after-restart", type=int, default=2, help="(b) requests")
    parser.add_argument("--clients", type=int, default=4, help="(c) concurrent clients (llama-server -np)")
    parser.add_argument("--per-client", type=int, default=2, help="(c) requests per client")
    parser.add_argument("--same", type=int, default=4, help="(d) timed requests")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--n-ctx", type=int, default=4096, help="context per llama-server slot")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--answers", default=None, metavar="JSON", help="also write every request's answers here")
    return parser


if __name__ == "__main__":
    main()
