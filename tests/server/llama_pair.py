"""llama-server and ``refsight serve`` side by side (imported by name: unique on purpose).

Both are started as their users start them, from the command line, on the same GGUF and projector
with the same flags (``-np``, ``-c``, ``--host``, ``--api-key`` ...), so a difference in what they
answer is a difference between the two servers, not between two set-ups. The llama-server binary is
the one ``benchmarks/llama_server.py`` builds from the vendored llama.cpp source and caches.
"""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
from pathlib import Path
from typing import Sequence

import httpx

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
import llama_server  # noqa: E402  (benchmarks/ is not a package: its directory goes on the path first)

GGUF = "tiny-qwen2-vl-gguf"
MARKER = "<__media__>"  # mtmd's default, refsight's marker; llama-server's is random unless pinned


class RefsightServe(llama_server.LlamaServer):
    """``python -m refsight.cli serve -m MODEL --mmproj MMPROJ ...`` on a free loopback port, started, awaited and
    stopped as :class:`llama_server.LlamaServer` is."""

    name = "refsight serve"

    def __init__(self, model: Path, mmproj: Path, store: Path, *, parallel: int, n_ctx: int, extra: Sequence[str] = ()):
        super().__init__(Path(sys.executable), model, mmproj, threads=1, parallel=parallel, n_ctx=n_ctx, extra=extra,
                         log_path=Path(tempfile.mkstemp(prefix="refsight-serve-", suffix=".log")[1]))
        self.store = store

    def command(self, port: int) -> list[str]:
        """The command line: the flags of :class:`llama_server.LlamaServer`'s, one thread, ``-c`` shared by the slots."""
        return [str(self.binary), "-m", "refsight.cli", "serve", "-m", str(self.model), "--mmproj", str(self.mmproj),
                "--store", str(self.store), "--host", "127.0.0.1", "--port", str(port), "-t", str(self.threads),
                "-np", str(self.parallel), "-c", str(self.n_ctx * self.parallel), *self.extra]


def start_pair(store: Path, *, parallel: int, n_ctx: int, extra: Sequence[str] = ()):
    """(llama-server, refsight serve) started with the same flags; ``n_ctx`` per slot, ``-c`` = ``n_ctx * parallel``."""
    from refsight.builtin_models.gguf import ensure_gguf

    model, mmproj = ensure_gguf(GGUF)
    binary = llama_server.ensure_llama_server()
    previous = os.environ.get("LLAMA_MEDIA_MARKER")
    os.environ["LLAMA_MEDIA_MARKER"] = MARKER  # LlamaServer's Popen inherits the environment
    try:
        theirs = llama_server.LlamaServer(binary, model, mmproj, threads=1, parallel=parallel, n_ctx=n_ctx,
                                          extra=extra).start()
    finally:
        if previous is None:
            del os.environ["LLAMA_MEDIA_MARKER"]
        else:
            os.environ["LLAMA_MEDIA_MARKER"] = previous
    try:
        ours = RefsightServe(model, mmproj, store, parallel=parallel, n_ctx=n_ctx, extra=extra).start()
    except BaseException:
        theirs.stop()
        raise
    return theirs, ours


def both(urls: Sequence[str], method: str, path: str, **kwargs) -> list[httpx.Response]:
    """The same request to llama-server and to refsight: [theirs, ours]."""
    return [httpx.request(method, f"{url}{path}", timeout=300, **kwargs) for url in urls]


def events(response: httpx.Response) -> list[dict]:
    """The JSON events of an SSE answer (``[DONE]`` left out)."""
    lines = [line[len("data: "):] for line in response.text.splitlines() if line.startswith("data: ")]
    return [json.loads(line) for line in lines if line != "[DONE]"]


def finite(timings: dict) -> bool:
    """Whether every value of a ``timings`` object is a finite, non-negative number."""
    return all(isinstance(v, (int, float)) and math.isfinite(v) and v >= 0 for v in timings.values())
