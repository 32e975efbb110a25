"""``refsight serve``: the HTTP API and the page, from the optional ``[server]`` extra."""

from __future__ import annotations

import argparse
import sys

from .arguments import EMBEDDER_HELP, Command, path_argument
from .context import backend_options, settings_of

__all__ = ["COMMANDS"]


def _serve_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1", help="address to bind (non-loopback needs API keys)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--workers", type=int, default=2, help="threads running model work")
    p.add_argument("--keys", metavar="FILE", type=path_argument, help="API keys, one KEY=NAMESPACE a line (default: $REFSIGHT_API_KEYS)")
    p.add_argument(
        "--share-encodes", action="store_true",
        help="share packages across tenants (fewer encodes, but timing reveals that some tenant holds an image)",
    )
    p.add_argument("--embedder", default=None, metavar="NAME", help=EMBEDDER_HELP)
    p.add_argument(
        "--max-prompt-tokens", type=int, default=8192, metavar="N",
        help="most text tokens a chat prompt may hold (default 8192); longer prompts get 400",
    )
    p.add_argument(
        "--attributes", choices=("imagenet", "vlm", "none"), default="imagenet",
        help="attribute record computed when a reference is added over HTTP (default: imagenet; none: skip)",
    )


def _server_extra_missing() -> str | None:
    """The module of the ``[server]`` extra that is not installed, or None."""
    try:
        import fastapi  # noqa: F401
        import multipart  # noqa: F401  (python-multipart)
        import prometheus_client  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        return exc.name or str(exc)
    return None


def cmd_serve(args: argparse.Namespace) -> int:
    """refsight serve [--host 127.0.0.1] [--port 8000] [--model NAME] [--workers N] [--keys FILE] [--max-prompt-tokens N]"""
    # Without the extra, say how to get it (exit 2, a usage-level error) instead of an ImportError traceback.
    missing = _server_extra_missing()
    if missing is not None:
        print(
            f"refsight: error: `refsight serve` needs the server extra ({missing} is not installed): "
            "pip install 'refsight[server]'",
            file=sys.stderr,
        )
        return 2
    from ..server import ServerConfig, serve

    serve(ServerConfig(
        store=args.store, catalog=args.catalog, local_dir=args.local_dir, model=args.model,
        backend_options=backend_options(args), settings=settings_of(args), config_file=args.config,
        host=args.host, port=args.port, workers=args.workers, keys_file=args.keys, share_encodes=args.share_encodes,
        embedder=args.embedder, max_prompt_tokens=args.max_prompt_tokens,
        ingest_attributes=() if args.attributes == "none" else (args.attributes,),
        cache=args.cache, max_package_bytes=args.max_package_bytes,
    ))
    return 0


COMMANDS = (Command("serve", "serve the HTTP API and the page (FastAPI on uvicorn)", cmd_serve, _serve_arguments, model=True),)
