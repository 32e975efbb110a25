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

from .app import create_app
from .config import ServerConfig

__all__ = ["create_app", "ServerConfig", "serve"]


def serve(config: ServerConfig) -> None:
    """Run the app under uvicorn until interrupted (checks the settings and loads the model before binding)."""
    import uvicorn

    from .access_log import log_config
    from .connections import uvicorn_options

    app = create_app(config)  # raises for a non-loopback host without keys, before any socket opens
    # Load and check the model before binding: a bad model is an error here, not a server that
    # answers 5xx. (The app's lifespan then finds the service open.)
    app.state.service.open()
    # The access log shows method, path and status only: never headers, and the query
    # string is redacted (a key sent as ?api_key=... must not reach the log either).
    # A request must arrive within its deadlines (connections.py): slow senders are closed.
    uvicorn.run(
        app, host=config.host, port=config.port, log_level="info", server_header=False, log_config=log_config(),
        **uvicorn_options(config),
    )
