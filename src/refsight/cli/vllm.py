"""``refsight vllm-env`` and ``refsight vllm-serve``: build the vLLM venv, run a server.

Hooked into :func:`refsight.cli.build_parser` by :func:`register_commands`; the
heavy work is imported only when a command runs, so ``refsight --help`` stays fast.
"""

from __future__ import annotations

import argparse
import json
import shlex
import signal
import sys
import threading
from typing import Callable

from .arguments import UsageError

__all__ = ["register_commands", "cmd_vllm_env", "cmd_vllm_serve"]


def cmd_vllm_env(args: argparse.Namespace) -> int:
    """refsight vllm-env [DIR]: build (or reuse) the vLLM venv; print its python."""
    from ..backends.vllm.env import ensure_vllm_env

    python = ensure_vllm_env(args.dir)
    print(json.dumps({"python": str(python)}) if args.json else str(python), flush=True)
    return 0


def cmd_vllm_serve(args: argparse.Namespace) -> int:
    """refsight vllm-serve MODEL: start vLLM on loopback, print its URL, stop it on SIGTERM."""
    from ..backends.vllm.serve import start_server

    stop = threading.Event()
    # Signals only set a flag: the server is stopped below, on this thread, exactly once.
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: stop.set())
    store, quota, bucket = _encoder_cache(args)
    server = start_server(
        args.model_name,
        port=args.port,
        image_limit=args.image_limit,
        env_dir=args.env,
        extra_args=shlex.split(args.vllm_args or ""),
        cancel=stop.is_set,
        encoder_cache=store,
        encoder_cache_bytes=quota,
        encoder_cache_bucket=bucket,
    )
    if server is None:  # stopped before it answered
        return 0
    try:
        info = {"url": server.url, "pid": server.pid, "model_dir": str(server.model_dir), "image_limit": args.image_limit,
                "encoder_cache": None if store is None else str(store)}
        if args.json:
            print(json.dumps(info), flush=True)
        else:
            print(f"vLLM serving {info['model_dir']} at {info['url']} (pid {info['pid']}); "
                  f"use --model vllm:{info['url']}; Ctrl-C stops it", flush=True)
        while not stop.wait(1.0):
            if server.process.poll() is not None:
                print(f"refsight: error: the vLLM server exited with code {server.process.returncode}", file=sys.stderr)
                return 1
        return 0
    finally:
        server.stop()


def _encoder_cache(args: argparse.Namespace) -> tuple[str | None, int, str | None]:
    """(folder, byte quota, bucket) of the encoder-cache connector; (None, 0, None) without ``--store`` or with
    ``--no-encoder-cache``. With an ``s3://`` store the folder is ``--local-dir`` and the bucket is shared.

    The quota is the store's: ``--max-package-bytes``, else ``max_package_bytes`` in its ``refsight.toml``."""
    store = getattr(args, "store", None)
    if store is None or args.no_encoder_cache or args.image_limit == 0:
        return None, 0, None
    from ..settings import is_bucket_url, load_settings, parse_bytes

    bucket = str(store) if is_bucket_url(store) else None
    if bucket is not None:
        if not getattr(args, "local_dir", None):
            raise UsageError(f"--store {bucket}: give --local-dir, the folder this server keeps its encoder outputs in")
        store = args.local_dir
    if getattr(args, "max_package_bytes", None) is not None:
        return str(store), parse_bytes(args.max_package_bytes, name="--max-package-bytes"), bucket
    # A bucket has no refsight.toml of its own: its settings are --config's.
    settings = load_settings(None, getattr(args, "config", None)) if bucket else load_settings(store)
    return str(store), int(settings.store.max_package_bytes or 0), bucket


def register_commands(add: Callable[..., argparse.ArgumentParser]) -> None:
    """Add ``vllm-env`` and ``vllm-serve`` through ``build_parser``'s ``add(name, func, help)``."""
    p = add("vllm-env", cmd_vllm_env, "build (or reuse) the separate vLLM environment; print its python")
    p.add_argument("dir", nargs="?", default=None, metavar="DIR", help="where (default: <user cache>/refsight/vllm-env)")
    p = add("vllm-serve", cmd_vllm_serve, "start a vLLM server on loopback for MODEL (a folder or tiny-*-vllm)")
    p.add_argument("model_name", metavar="MODEL", help="a local model folder or a built-in tiny-*-vllm name")
    p.add_argument("--port", type=int, default=None, help="port (default: a free one)")
    p.add_argument("--image-limit", type=int, default=8, metavar="N",
                   help="images per prompt as pixels; 0 = embeddings only, vision encoder not loaded")
    p.add_argument("--env", default=None, metavar="DIR", help="the vLLM environment (default: as vllm-env)")
    p.add_argument("--vllm-args", default=None, metavar="ARGS", help="extra vLLM server flags, one quoted string")
    # --store (the shared option): vLLM keeps its encoder outputs of references there (refsight's connector).
    p.add_argument("--no-encoder-cache", action="store_true", help="with --store: do not start the encoder-cache connector")

