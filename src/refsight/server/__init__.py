"""refsight over HTTP: a thin FastAPI layer on :class:`refsight.Engine`.

::

    from refsight.server import ServerConfig, create_app, serve
    app = create_app(ServerConfig(store="refs", model="tiny-qwen2-vl"))   # for any ASGI server
    serve(ServerConfig(port=8000))                                       # or run uvicorn here

Endpoints (OpenAPI at ``/openapi.json``, docs at ``/docs``): references
(``/v1/references``), comparisons (``/v1/compare``), search (``/v1/search``), an
OpenAI-compatible ``/v1/chat/completions`` and ``/v1/completions``, llama-server's own
endpoints (``/health``, ``/props``, ``/tokenize``, ``/completion`` ...), ``/v1/stats``, ``/healthz``,
``/metrics`` and a page at ``/``. Importing this package needs FastAPI; importing
``refsight`` alone does not.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from ..settings import apply_threads, available_cores, thread_budget
from .app import create_app
from .config import ServerConfig

__all__ = ["create_app", "ServerConfig", "serve"]


def serve(config: ServerConfig) -> None:
    """Run the app under uvicorn until interrupted (checks the settings and loads the model before binding)."""
    from .edge.access_log import log_config
    from .edge.binding import run as run_bound
    from .connections import uvicorn_options

    # Before the model loads: workers x threads <= cores (refsight.support.threads), so workers do not fight.
    threads = apply_threads(thread_budget(config.workers, config.threads), asked=config.threads)
    config = dataclasses.replace(config, threads=threads)  # what /props reports
    app = create_app(config)  # raises for a non-loopback host without keys, before any socket opens
    # Load and check the model before binding: a bad model is an error here, not a server that
    # answers 5xx. (The app's lifespan then finds the service open.)
    app.state.service.open()
    _startup_line(app.state.service, config, threads)
    # The access log shows method, path and status only: never headers, and the query
    # string is redacted (a key sent as ?api_key=... must not reach the log either).
    # A request must arrive within its deadlines (connections.py): slow senders are closed.
    # Every address of --host (llama-server takes several, comma-separated) serves the same app.
    if config.verbose:  # --verbose: refsight's own loggers too, not only uvicorn's
        logging.getLogger("refsight").setLevel(logging.DEBUG)
    # SIGTERM stops the chat-template renders in progress at once (each in a worker process): shutting down
    # then waits on no template.
    run_bound(
        app, config.host, config.port, log_level="debug" if config.verbose else "info", server_header=False,
        log_config=log_config(), on_exit=app.state.service.stop_renders,
        **uvicorn_options(config),
    )


def _startup_line(service: Any, config: ServerConfig, threads: int) -> None:
    """One line on stderr saying how the model runs: the thread budget, and the runtime's own mode (vLLM's images)."""
    import sys

    info = service.facts.runtime_info  # taken at load, just now
    mode = "".join(f", {key} {value}" for key, value in info.items())
    print(f"refsight: serving {service.model}: {config.workers} workers x {threads} threads "
          f"({available_cores()} cores){mode}", file=sys.stderr, flush=True)
