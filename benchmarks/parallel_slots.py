"""Parallel slots: ``refsight serve -np C`` against the one-at-a-time server, C concurrent clients, one JSON line.

Both arms are ``refsight serve`` on loopback with the same GGUF, threads, store and
attention kernel (flash attention off, the slots' default: see
``refsight.backends.llamacpp.slots``), the references stored once over ``POST
/v1/references``, and get the same OpenAI chat requests from C client threads at once:
each client has its own R references (a reference prefix of its own) and sends
``--per-client`` requests in turn, each with a candidate never sent before. One arm has
one slot (requests wait for each other), the other C slots (requests decode together,
each its own sequence of one llama context). Before the timed requests each arm answers
one untimed request per client, so both start with their prefix states built.

``throughput_ratio`` is the one-slot arm's seconds over the C-slot arm's for the same
requests; ``answers_identical`` says every request got, from the C-slot server under
load, the very text the one-slot server gave it alone (``answers_identical_count`` how
many did).

What batching can win here is measured in the same run (``decode``): the model loaded
in-process with C sequences, one decode step timed alone and over all C sequences, in the
calls the slots make and in one call (as llama-server does; ``ms_per_token``);
``speedup_bound`` is alone over the slots' calls. A request's prompt (its candidate's
encode, its text) costs the same in both arms, so ``batching_bound`` is the ratio that
decode batching alone gives this workload (the one-slot arm's seconds with its decode
share, estimated from the alone figure, run at that speed-up); the C-slot server also
overlaps one request's work outside llama.cpp's kernels (HTTP, images, sampling) with
another's model work, which adds on top. ``cpu_busy`` is the share of the machine's
threads each server kept busy over its timed requests (its CPU seconds over seconds ×
threads; llama.cpp's threads count while they spin waiting for work).

With ``--peer``, llama-server itself (built from the same llama.cpp source, see
``llama_server.py``) answers the same timed requests from the same C clients, once with
``-np 1`` and once with ``-np C``, its prompt cache off (``--no-cache-prompt``) so that
neither arm keeps a client's references and the two differ in the slots alone, its
other settings its defaults: ``llama_server.throughput_ratio`` is what llama-server's
own slots win on this machine, ``llama_server.answers_identical`` whether its ``-np C``
answers equal its ``-np 1`` ones.

    python benchmarks/parallel_slots.py --model shape-qwen2-vl-2b-full-gguf-q4 --clients 8 --peer

Weights are random: the timings are real, the text is not.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from vs_llama_server import (  # noqa: E402
    Candidates, Peer, RefsightServer, Request, _log, data_url, model_files, run_concurrent, variant,
)

ARMS = ("one_slot", "slots")
PEER_ARMS = ("llama-server -np 1", "llama-server -np C")


def workload(args) -> tuple[list[Request], list[Request]]:
    """(one untimed request per client, the timed requests): client ``c`` owns reference set ``c``."""
    rng = random.Random(args.seed)
    working = list(range(args.working_set))
    sets = [rng.sample(working, args.refs) for _ in range(args.clients)]
    candidates = Candidates(args.size, args.working_set)
    warm = [Request(list(refs), candidates.next()) for refs in sets]
    # run_concurrent gives client c the requests c, c + C, c + 2C ...: all of them on set c.
    timed = [Request(list(sets[i % args.clients]), candidates.next()) for i in range(args.clients * args.per_client)]
    return warm, timed


def run_arm(server: RefsightServer, peer: Peer, warm: list[Request], timed: list[Request], args,
            threads: int) -> tuple[float, float]:
    """Start ``server``, answer the untimed requests one by one, then the timed ones from C clients.

    Returns the timed requests' seconds and the share of the machine's ``threads`` the
    server kept busy meanwhile (its CPU seconds over seconds × threads).
    """
    server.start()
    peer.url = server.url
    try:
        for i, request in enumerate(warm):
            seconds = peer.ask(request, args.max_tokens)
            _log(f"{peer.name}: untimed request {i + 1}/{len(warm)} in {seconds:.1f} s")
        cpu_before = cpu_seconds(server.process.pid)
        seconds = run_concurrent(peer, timed, args.clients, args.max_tokens)
        busy = (cpu_seconds(server.process.pid) - cpu_before) / (seconds * threads)
    finally:
        server.stop()
    _log(f"{peer.name}: {len(timed)} requests from {args.clients} clients in {seconds:.1f} s, {busy:.0%} of the CPUs busy")
    return seconds, busy


def cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system, all threads) process ``pid`` has used so far (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def main(argv: list[str] | None = None) -> dict:
    """Parse ``argv``, run both arms, print the JSON line and return it as a dict."""
    from refsight.samples import SAMPLE_NAMES

    args = _parser().parse_args(argv)
    threads = len(os.sched_getaffinity(0))
    references = [variant(SAMPLE_NAMES[i % len(SAMPLE_NAMES)], i // len(SAMPLE_NAMES), args.size)
                  for i in range(args.working_set)]
    warm, timed = workload(args)
    seconds: dict[str, float] = {}
    busy: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="parallel-slots-") as tmp:
        tmp = Path(tmp)
        began = time.perf_counter()
        loader = RefsightServer(args.model, args.mmproj, tmp / "store", tmp / "refsight.log").start()
        try:
            loader.add_references(references)
        finally:
            loader.stop()
        ingest_s = time.perf_counter() - began
        for arm, slots in zip(ARMS, (1, args.clients)):
            server = RefsightServer(args.model, args.mmproj, tmp / "store", tmp / f"{arm}.log", parallel=slots,
                                    flash_attn="off")
            peer = Peer(arm, args.model, lambda i: f"refsight://ref/ref-{i:02d}", restart=None)
            seconds[arm], busy[arm] = run_arm(server, peer, warm, timed, args, threads)
        llama_server = peer_arms(args, references, warm, timed, threads, tmp) if args.peer else None
    prompt_tokens = max(r.answers["slots"]["prompt_tokens"] for r in timed)
    decode = decode_probe(*model_files(args.model, args.mmproj), args.clients, prompt_tokens)
    decode_share_s = len(timed) * args.max_tokens * decode["ms_per_token"]["alone"] / 1000
    bounded = seconds["one_slot"] - decode_share_s * (1 - 1 / decode["speedup_bound"])
    line = {
        "benchmark": "parallel_slots", "model": args.model, "size": args.size, "references": args.refs,
        "clients": args.clients, "per_client": args.per_client, "max_tokens": args.max_tokens, "threads": threads,
        "requests": len(timed), "throughput_ratio": round(seconds["one_slot"] / seconds["slots"], 3),
        **agreement(timed + warm, *ARMS), "seconds": {k: round(v, 1) for k, v in seconds.items()},
        "requests_per_s": {k: round(len(timed) / v, 3) for k, v in seconds.items()},
        "cpu_busy": {k: round(v, 3) for k, v in busy.items()},
        "decode": decode, "batching_bound": round(seconds["one_slot"] / bounded, 3), "flash_attn": "off",
        "setup_s": round(ingest_s, 1), "random_weights": True,
    }
    if llama_server:
        line["llama_server"] = llama_server
    print(json.dumps(line))
    return line


def peer_arms(args, references: list[bytes], warm: list[Request], timed: list[Request], threads: int,
              tmp: Path) -> dict:
    """llama-server ``-np 1`` against ``-np C`` on the timed requests, prompt cache off: what its own slots win."""
    from llama_server import LlamaServer, ensure_llama_server

    binary = ensure_llama_server(log=_log)
    model_path, mmproj_path = model_files(args.model, args.mmproj)
    urls = [data_url(png) for png in references]
    seconds: dict[str, float] = {}
    busy: dict[str, float] = {}
    for arm, slots in zip(PEER_ARMS, (1, args.clients)):
        server = LlamaServer(binary, model_path, mmproj_path, threads=threads, parallel=slots, n_ctx=args.n_ctx,
                             log_path=tmp / f"llama-server-np{slots}.log", extra=("--no-cache-prompt",))
        # One untimed request first, as in refsight's arms (its first request sets up the compute graphs).
        peer = Peer(arm, "gguf", urls.__getitem__, restart=None)
        seconds[arm], busy[arm] = run_arm(server, peer, warm[:1], timed, args, threads)
    one, many = PEER_ARMS
    return {
        "throughput_ratio": round(seconds[one] / seconds[many], 3), **agreement(timed, one, many),
        "seconds": {"np_1": round(seconds[one], 1), "np_C": round(seconds[many], 1)},
        "cpu_busy": {"np_1": round(busy[one], 3), "np_C": round(busy[many], 3)},
        "flags": "--no-cache-prompt",
    }


def agreement(requests: list[Request], arm: str, other: str) -> dict:
    """``answers_identical`` (every request got the same text from both arms) and how many did."""
    same = [r.answers[arm]["text"] == r.answers[other]["text"] for r in requests]
    return {"answers_identical": all(same), "answers_identical_count": f"{sum(same)}/{len(same)}"}


def decode_probe(model: Path, mmproj: Path, clients: int, prompt_tokens: int, steps: int = 6) -> dict:
    """ms per decode token: one sequence alone, C sequences in the slots' calls, C in one call (llama-server's)."""
    import numpy as np

    from refsight.backends.llamacpp.native import LlamaRuntime, RuntimeSettings

    runtime = LlamaRuntime(model, mmproj, RuntimeSettings(n_ctx=prompt_tokens + steps * 3 + 64, n_seq=clients,
                                                          flash_attn="off"))
    try:
        prompt = [10 + i % (runtime.n_vocab - 20) for i in range(prompt_tokens)]  # as long as the requests'
        for seq in range(clients):
            runtime.decode_batch([(token, i, seq) for i, token in enumerate(prompt)])
        token = int(np.argmax(runtime.last_logits()))
        n_past = [prompt_tokens] * clients  # each sequence's next position

        def per_token(seqs: list[int], rows: int) -> float:
            began = time.perf_counter()
            for _ in range(steps):
                for first in range(0, len(seqs), rows):
                    runtime.decode_batch([(token, n_past[s], s) for s in seqs[first:first + rows]])
                for s in seqs:
                    n_past[s] += 1
            return (time.perf_counter() - began) * 1000 / (steps * len(seqs))

        everyone = list(range(clients))
        ms = {"alone": per_token([0], 1), "slots": per_token(everyone, runtime.invariant_step_rows),
              "one_call": per_token(everyone, clients)}
    finally:
        runtime.close()
    # four decimals: a tiny model's step takes well under 0.05 ms on a quiet machine, which one decimal rounds to 0
    return {"ms_per_token": {k: round(v, 4) for k, v in ms.items()}, "rows_per_call": runtime.invariant_step_rows,
            "speedup_bound": round(ms["alone"] / ms["slots"], 3), "prompt_tokens": prompt_tokens}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="shape-qwen2-vl-2b-gguf-q4", help="a built-in GGUF, or llamacpp:PATH")
    parser.add_argument("--mmproj", default=None, help="with llamacpp:PATH")
    parser.add_argument("--size", type=int, default=224, help="image side in pixels")
    parser.add_argument("--refs", type=int, default=2, help="R: references per request")
    parser.add_argument("--working-set", type=int, default=16, help="references the clients' sets are drawn from")
    parser.add_argument("--clients", type=int, default=8, help="C: concurrent clients, and the slots of the second arm")
    parser.add_argument("--per-client", type=int, default=2, help="timed requests per client")
    parser.add_argument("--max-tokens", type=int, default=64, help="answer length (greedy, fixed)")
    parser.add_argument("--peer", action="store_true", help="also run llama-server -np 1 and -np C (built if need be)")
    parser.add_argument("--n-ctx", type=int, default=2048, help="context per llama-server slot (with --peer)")
    parser.add_argument("--seed", type=int, default=0)
    return parser


if __name__ == "__main__":
    main()
