"""llama-server for the benchmarks: built once from the llama-cpp-python sdist, started and stopped on loopback.

The llama-cpp-python release refsight pins vendors llama.cpp's whole source
(``vendor/llama.cpp``, ``tools/server`` included), so the peer a llama.cpp user runs,
``llama-server``, is built from exactly the llama.cpp refsight's backend runs: CPU,
Release, the library's own defaults otherwise (``-march=native`` and OpenMP, as the
wheel is built), only the ``llama-server`` target, statically linked. A benchmark
helper, not a dependency of refsight.

The binary is cached in ``$REFSIGHT_LLAMA_SERVER_CACHE`` (default
``<user cache dir>/refsight/llama-server``) under a key of the sdist version, the
cmake flags and this CPU's instruction-set flags (a ``-march=native`` binary must not
run on another CPU), beside a ``build.json`` that records how long the build took.
The source is ``$REFSIGHT_LLAMA_CPP_SRC`` (an unpacked sdist, its ``vendor/llama.cpp``
or the sdist tarball, as for refsight's converter), else the sdist tarball in the
model cache (where refsight's GGUF converter fetched it), else a ``pip download`` of
it into the llama-server cache.

    python benchmarks/llama_server.py          # build (or find) it; print its path as JSON
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from refsight.support.environment import cache_path, model_cache_dir
from refsight.support.extras import LLAMA_CPP_PYTHON_VERSION

__all__ = ["CMAKE_FLAGS", "LlamaServer", "build_key", "ensure_llama_server", "find_llama_server", "server_cache_dir", "stop_process"]

#: Bump when the recipe below changes, so an old binary is not reused.
RECIPE_VERSION = 1
#: The configuration: CPU only, no web UI (its assets would be downloaded), no network libraries.
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DGGML_CUDA=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_TOOLS=ON",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_CURL=OFF",
)
TARGET = "llama-server"
SDIST = f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}.tar.gz"


def _log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def server_cache_dir() -> Path:
    """``$REFSIGHT_LLAMA_SERVER_CACHE`` or ``<user cache dir>/refsight/llama-server``."""
    return cache_path("REFSIGHT_LLAMA_SERVER_CACHE", "llama-server")


def _cpu_flags() -> str:
    """This CPU's instruction-set flags (``-march=native`` compiles for exactly them)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return " ".join(sorted(line.split(":", 1)[1].split()))
    except OSError:
        pass
    return platform.processor()


def build_key() -> str:
    """The cache key of a binary: sdist version, recipe, cmake flags, machine and CPU flags."""
    recipe = json.dumps(
        {"sdist": LLAMA_CPP_PYTHON_VERSION, "recipe": RECIPE_VERSION, "flags": CMAKE_FLAGS,
         "machine": platform.machine(), "cpu": _cpu_flags()},
        sort_keys=True,
    )
    return f"{LLAMA_CPP_PYTHON_VERSION}-{hashlib.sha256(recipe.encode()).hexdigest()[:12]}"


def find_llama_server() -> Path | None:
    """The cached ``llama-server`` of this key, or None when it has not been built."""
    entry = server_cache_dir() / build_key()
    binary = entry / TARGET
    return binary if (entry / "build.json").is_file() and binary.is_file() else None


def build_info() -> dict:
    """What ``build.json`` recorded about the cached binary (``build_s``, flags ...), or {}."""
    try:
        return json.loads((server_cache_dir() / build_key() / "build.json").read_text())
    except (OSError, ValueError):
        return {}


def ensure_llama_server(*, jobs: int | None = None, log: Callable[[str], None] = _log) -> Path:
    """Build ``llama-server`` unless this key's binary is cached; return its path.

    Built in a temporary directory beside the cache entry, under a file lock (two
    benchmark runs never build twice), and moved into place complete.
    """
    from filelock import FileLock

    found = find_llama_server()
    if found:
        return found
    root = server_cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    with FileLock(str(root / ".build.lock")):
        found = find_llama_server()
        if found:
            return found
        work = Path(tempfile.mkdtemp(prefix=".build-", dir=root))
        try:
            began = time.perf_counter()
            source = _source(work, log)
            binary = _cmake_build(source, work / "build", jobs or os.cpu_count() or 1, log)
            entry = work / "entry"
            entry.mkdir()
            shutil.copy2(binary, entry / TARGET)
            info = {"build_s": round(time.perf_counter() - began, 1), "sdist": LLAMA_CPP_PYTHON_VERSION,
                    "flags": list(CMAKE_FLAGS), "jobs": jobs or os.cpu_count()}
            (entry / "build.json").write_text(json.dumps(info))
            target = root / build_key()
            shutil.rmtree(target, ignore_errors=True)
            os.rename(entry, target)
            log(f"llama-server built in {info['build_s']} s: {target / TARGET}")
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return root / build_key() / TARGET


def _is_source(path: Path) -> bool:
    return (path / "CMakeLists.txt").is_file() and (path / "tools" / "server").is_dir()


def _source(work: Path, log: Callable[[str], None]) -> Path:
    """llama.cpp's source tree: given, or unpacked from the sdist tarball into ``work``."""
    env = os.environ.get("REFSIGHT_LLAMA_CPP_SRC")
    if env:
        given = Path(env).expanduser()
        for candidate in (given, given / "vendor" / "llama.cpp"):
            if _is_source(candidate):
                return candidate
        if not given.is_file():
            raise SystemExit(f"REFSIGHT_LLAMA_CPP_SRC={env}: neither llama.cpp's source, the sdist, nor its tarball")
        tarball = given
    else:
        tarball = _tarball(log)
    log(f"unpacking llama.cpp from {tarball}")
    with tarfile.open(tarball) as tar:
        members = [m for m in tar.getmembers() if "/vendor/llama.cpp/" in m.name]
        tar.extractall(work / "src", members=members, filter="data")
    (top,) = (work / "src").iterdir()
    source = top / "vendor" / "llama.cpp"
    if not _is_source(source):
        raise SystemExit(f"{tarball} holds no vendor/llama.cpp with tools/server")
    return source


def _tarball(log: Callable[[str], None]) -> Path:
    """The sdist: where refsight's converter left it, or fetched with pip (the index's own client)."""
    for directory in (model_cache_dir(), server_cache_dir()):
        if (directory / SDIST).is_file():
            return directory / SDIST
    log(f"fetching the llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION} sdist with pip")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
         f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}", "-d", str(server_cache_dir())],
        capture_output=True, text=True, check=False,
    )
    if not (server_cache_dir() / SDIST).is_file():
        raise SystemExit(f"cannot fetch the sdist (set REFSIGHT_LLAMA_CPP_SRC): {proc.stderr[-1000:]}")
    return server_cache_dir() / SDIST


def _cmake_build(source: Path, build: Path, jobs: int, log: Callable[[str], None]) -> Path:
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    _run(["cmake", "-S", str(source), "-B", str(build), *generator, *CMAKE_FLAGS], log, every=1)
    # Progress: one line in 25 of the build's "[k/N]" lines (a build of ~6 minutes on 2 cores).
    _run(["cmake", "--build", str(build), "--target", TARGET, "-j", str(jobs)], log, every=25)
    binary = build / "bin" / TARGET
    if not binary.is_file():
        raise SystemExit(f"the build finished without {binary}")
    return binary


def _run(cmd: Sequence[str], log: Callable[[str], None], every: int) -> None:
    log("+ " + " ".join(cmd))
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    tail: list[str] = []
    assert proc.stdout is not None
    for n, line in enumerate(proc.stdout):
        tail = (tail + [line.rstrip()])[-40:]
        if n % every == 0:
            log("  " + line.rstrip()[:160])
    if proc.wait() != 0:
        raise SystemExit(f"{cmd[0]} failed ({proc.returncode}):\n" + "\n".join(tail))


def free_port() -> int:
    """A free TCP port on loopback."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_process(process: subprocess.Popen | None, *, timeout: float) -> None:
    """SIGTERM ``process`` if it still runs, SIGKILL after ``timeout`` seconds (nothing when None or ended)."""
    if process is not None and process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


class LlamaServer:
    """``llama-server -m MODEL --mmproj MMPROJ`` on 127.0.0.1, as its users start it.

    ``threads`` (generation and batch), ``parallel`` slots (``-np``), each with
    ``n_ctx`` positions. The batch sizes equal refsight's llama.cpp context
    (``n_batch = n_ubatch = 2048``), so both split prompts alike; everything else
    (prompt cache in RAM, slot reuse by longest common prefix, flash attention auto) is
    llama-server's default, unless ``extra`` flags say otherwise. Where refsight keeps weights
    out of llama.cpp's repacked buffers (a build with AMX kernels, which crash:
    :func:`refsight.backends.llamacpp.logs.repack_weights`), so does the peer (``--no-repack``),
    as its users there must. The server's log goes to ``log_path``.
    """

    #: What the start-up error calls this server.
    name = "llama-server"

    def __init__(self, binary: Path, model: Path, mmproj: Path, *, threads: int, parallel: int = 1,
                 n_ctx: int = 4096, log_path: Path | None = None, extra: Sequence[str] = ()) -> None:
        self.binary, self.model, self.mmproj = Path(binary), Path(model), Path(mmproj)
        self.threads, self.parallel, self.n_ctx = threads, parallel, n_ctx
        self.extra = tuple(extra)
        self.log_path = log_path or Path(tempfile.mkstemp(prefix="llama-server-", suffix=".log")[1])
        self.process: subprocess.Popen | None = None
        self.url = ""

    def command(self, port: int) -> list[str]:
        """The command line of one start."""
        from refsight.backends.llamacpp.logs import repack_weights

        return [
            str(self.binary), "-m", str(self.model), "--mmproj", str(self.mmproj),
            "--host", "127.0.0.1", "--port", str(port), "-t", str(self.threads), "-tb", str(self.threads),
            "-np", str(self.parallel), "-c", str(self.n_ctx * self.parallel), "-b", "2048", "-ub", "2048",
            *(() if repack_weights() else ("--no-repack",)), *self.extra,
        ]

    def start(self, timeout: float = 600.0) -> LlamaServer:
        """Start and wait until ``/health`` answers 200."""
        import httpx

        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(self.command(port), stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while True:
            try:
                if httpx.get(f"{self.url}/health", timeout=5).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                tail = self.log_path.read_text(errors="replace")[-3000:]
                raise RuntimeError(f"{self.name} did not start ({self.command(port)}):\n{tail}")
            time.sleep(0.5)

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after 30 s). Idempotent."""
        stop_process(self.process, timeout=30)
        self.process = None

    def __enter__(self) -> LlamaServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> dict:
    """Build (or find) llama-server; print ``{"llama_server": path, "build_s": ..., "cached": ...}``."""
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=None, help="parallel compile jobs (default: every core)")
    args = parser.parse_args(argv)
    cached = find_llama_server() is not None
    binary = ensure_llama_server(jobs=args.jobs)
    line = {"llama_server": str(binary), "key": build_key(), "cached": cached, **build_info()}
    print(json.dumps(line))
    return line


if __name__ == "__main__":
    main()
