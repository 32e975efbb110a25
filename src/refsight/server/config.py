"""Server settings in one object: where the store is, which model, who may call, and the limits."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..settings import BackendOptions, Settings
from ..errors import InvalidInputError
from ..requests import check_template_variables
from ..support.environment import default_api_key
from .edge.binding import split_hosts
from .intake.generation_body import DEFAULT_MAX_TOKENS
from .edge.tenants import is_loopback, load_keys, with_api_key

__all__ = ["ServerConfig"]

MiB = 1024 * 1024

#: The ``pooling`` values taken (llama-server's ``--pooling``; ``none``, a vector per token, is not served).
POOLINGS = (None, "last", "mean", "cls", "rank")


@dataclass
class ServerConfig:
    """Everything :func:`refsight.server.create_app` needs.

    ``keys`` maps API key → namespace; ``None`` reads them from ``keys_file`` or
    ``$REFSIGHT_API_KEYS`` (see :mod:`refsight.server.edge.tenants`); ``api_key`` (or
    ``$REFSIGHT_API_KEY``) adds one key for the default namespace. With no keys the
    server refuses any ``host`` that is not loopback.
    """

    store: str | os.PathLike | None = None
    #: ``postgresql://...``: the catalog in PostgreSQL, shared by replicas; ``store`` is then the
    #: shared blob directory and ``local_dir`` this replica's derived data (see ``open_store``).
    catalog: str | None = None
    local_dir: str | os.PathLike | None = None
    model: str | None = None
    #: The names clients send as ``model`` and see in replies (``--served-model-name``, ``--alias``);
    #: the first is shown. Empty: the model's own name.
    served_model_names: tuple[str, ...] = ()
    #: False (the default, as llama-server ignores ``model``): a request naming another model is served by
    #: the one served model and the reply's ``model`` says which; True (``--strict-model-name``): 404 ``model_not_found``.
    strict_model_names: bool = False
    #: llama-server's ``--tags``: informational tags listed in ``/v1/models`` (never used to route).
    model_tags: tuple[str, ...] = ()
    #: llama-server's ``--sleep-idle-seconds``: after this many seconds without a request the model is
    #: unloaded, and the next request that needs it loads it again (:mod:`~refsight.server.edge.sleep`); None: never.
    sleep_idle_seconds: float | None = None
    #: How the model is loaded (device, dtype, processor settings ...): the options set explicitly
    #: (the CLI's flags). The config file's ``[backend]`` and ``[models."NAME"]`` go under them.
    backend_options: BackendOptions = field(default_factory=BackendOptions)
    #: The config file, already read (the CLI reads it once); None: read ``config_file`` at startup.
    settings: Settings | None = None
    #: A config file (``refsight.toml``) to read instead of the one in the store directory.
    config_file: str | os.PathLike | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    #: Threads that run model work (encode, generate, search) off the event loop.
    workers: int = 2
    #: torch's threads per worker and llama.cpp's threads (``--threads``); None: torch gets the cores shared out
    #: among the workers, llama.cpp every core (it runs one thread team at a time: :mod:`refsight.support.threads`).
    threads: int | None = None
    #: Requests that may wait for a worker; one more gets 429.
    queue: int = 32
    keys: dict[str, str] | None = None
    keys_file: str | os.PathLike | None = None
    #: One key for the default namespace (``--api-key``); None: ``$REFSIGHT_API_KEY`` unless ``keys`` is given.
    api_key: str | None = None
    max_body_bytes: int = 32 * MiB
    max_image_pixels: int = 40_000_000
    #: Images one request may name (sent, looked up by uuid, or stored references); one more is a 400.
    max_images_per_request: int = 16
    #: Decoded pixels of the images sent in one request, in total (checked from the headers; the decoded pixels
    #: are held one image at a time, but a request's work grows with them).
    max_request_pixels: int = 80_000_000
    #: Largest ``max_tokens`` a chat request may ask for.
    max_new_tokens: int = 1024
    #: The answer's bound when a request names none (``--n-predict``; -1: ``max_new_tokens``), shown by /props and /slots.
    n_predict: int = DEFAULT_MAX_TOKENS
    #: Sampling fields a request that leaves them unset gets (``--temp``, ``--seed``: ``temperature``, ``seed``).
    sampling_defaults: dict[str, Any] = field(default_factory=dict)
    #: The chat template's variables every request gets unless it sets them itself (llama-server's ``--reasoning``:
    #: ``enable_thinking``; ``--chat-template-kwargs``), handed where the template reads them.
    template_variables: dict[str, Any] = field(default_factory=dict)
    #: Vertex AI's prediction route (llama-server's ``AIP_MODE=PREDICTION``: ``AIP_PREDICT_ROUTE``, default
    #: ``/predict``; :mod:`~refsight.server.routes.vertex`), and ``AIP_HEALTH_ROUTE``; None: not served.
    vertex_predict_route: str | None = None
    vertex_health_route: str | None = None
    #: Domain names whose ``http(s)`` image URLs are fetched (``--allowed-media-domains``; empty: none, the default).
    allowed_media_domains: tuple[str, ...] = ()
    #: The directory ``file://`` image URLs may read from (``--media-path``; None: none, the default).
    media_path: str | os.PathLike | None = None
    #: Largest image fetched by URL, in bytes (on the wire and decoded alike).
    max_media_bytes: int = 20 * MiB
    #: Seconds for all the fetches by URL of one request together: DNS, connect, headers and body.
    media_timeout_s: float = 10.0
    #: Serve refsight's page at ``/`` (``--no-webui``: False, the API only).
    webui: bool = True
    #: Serve ``GET /slots`` (``--no-slots``: False, a 501 there, as llama-server answers it).
    slots_endpoint: bool = True
    #: Log at debug level (``--verbose``/``-v``, as llama-server's): uvicorn's and refsight's loggers.
    verbose: bool = False
    #: Share packages across tenants: saves encodes, but reveals by timing that SOME tenant
    #: holds an image. Off by default: each tenant's namespace salts its package keys.
    share_packages: bool = False
    #: Most tokens a chat prompt may hold: its text (the backend's tokenizer, before any model work), then text
    #: and images together (each image's tokens, before any prefill: 400 ``exceed_context_size_error``).
    max_prompt_tokens: int = 8192
    #: Memory tier budget of the package store (None: the store's default).
    memory_bytes: int | None = None
    #: The Redis tier between memory and disk (``redis://HOST:PORT/DB``; None: the config file's, or none).
    redis: str | None = None
    #: False (``refsight serve --no-cache``): chat routes encode every image afresh and prefill every prompt whole.
    use_cache: bool = True
    #: Byte quota on packages, least recently used evicted (``20GiB``; None: the config file's, or none).
    max_package_bytes: int | str | None = None
    #: A bucket store's local disk cache, in ``local_dir`` (``50GiB``; None: the config file's, or the default).
    local_cache_bytes: int | str | None = None
    #: What the store keeps of images sent inline (``--remember-images``): ``off``, ``recurring`` (an image a tenant
    #: sends in a second request) or ``all``; None: ``$REFSIGHT_REMEMBER_IMAGES``, the config file's, else recurring.
    remember_images: str | None = None
    thumbnail_px: int = 256
    #: Memory for images clients sent under a vLLM ``uuid`` (decoded pixels + sent bytes, all tenants; LRU).
    media_uuid_bytes: int = 256 * MiB
    #: Entries of that memory, whatever their size (each costs its key, object and index beyond its pixels).
    media_uuid_entries: int = 4096
    #: Without keys, the ``Host`` names accepted beside loopback and ``host`` (``--allowed-hosts``).
    allowed_hosts: tuple[str, ...] = ()
    #: Origins allowed cross-origin (``--cors-origins``; ``*`` any; ``localhost`` every loopback origin, as
    #: llama-server's ``localhost`` mode); None, the default: ``*`` with API keys (llama-server's default), ``localhost``
    #: without: CORS headers and preflights (:mod:`~refsight.server.edge.origins`).
    cors_origins: tuple[str, ...] | None = None
    #: Seconds a request's head (request line and headers) may take to arrive (see :mod:`~refsight.server.connections`).
    header_timeout_s: float = 10.0
    #: Seconds a whole request, body included, may take to arrive (a 32 MiB upload at 1 MB/s takes 32 s).
    request_timeout_s: float = 60.0
    #: Connections that may be in the middle of sending a request at once; one more closes the oldest.
    max_incomplete_requests: int = 256
    #: The retrieval embedder by name (``conse``, ``clip:PATH``, ``vlm:MODEL``; None: the default).
    embedder: str | None = None
    #: llama-server's ``--pooling``: ``last``: the served model embeds what an embedding request naming no model
    #: sends (the VLM2Vec / Qwen3-VL-Embedding recipe: its last token's final hidden state; checked at start);
    #: None, ``mean``, ``cls``, ``rank``: the retrieval ``embedder`` does, by its own recipe (a GGUF embedding model's
    #: pooling is not what refsight serves); ``none`` (a vector per token) is not served. (``--embedding`` and
    #: ``--reranking`` need no field: the embedding and rerank routes are always served.)
    pooling: str | None = None
    #: Attribute records computed when a reference is added (``imagenet``, ``vlm``), so the first
    #: comparison against it does no reference work; ``()`` defers them to the first comparison.
    ingest_attributes: tuple[str, ...] = ("imagenet",)
    def resolved_keys(self) -> dict[str, str]:
        """The configured keys (explicit, file, or environment), with the single ``api_key`` for the default namespace."""
        if self.keys is not None:
            return with_api_key(dict(self.keys), self.api_key, "api_key")
        if self.api_key is not None:
            return with_api_key(load_keys(self.keys_file), self.api_key, "api_key")
        return with_api_key(load_keys(self.keys_file), default_api_key(), "$REFSIGHT_API_KEY")

    def validate(self, keys: dict[str, str]) -> None:
        """Raise InvalidInputError for settings that cannot work, naming the setting."""
        for name in ("workers", "max_body_bytes", "max_image_pixels", "max_new_tokens", "max_prompt_tokens", "thumbnail_px",
                     "media_uuid_bytes", "max_images_per_request", "max_request_pixels", "media_uuid_entries",
                     "max_media_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise InvalidInputError(name, f"must be a positive integer, got {value!r}")
        for name in ("header_timeout_s", "request_timeout_s", "media_timeout_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
                raise InvalidInputError(name, f"must be a positive number of seconds, got {value!r}")
        sleep = self.sleep_idle_seconds
        if sleep is not None and (isinstance(sleep, bool) or not isinstance(sleep, (int, float)) or not 0 < sleep < 1e9):
            raise InvalidInputError("sleep_idle_seconds", f"must be a positive number of seconds, got {sleep!r}")
        if self.pooling not in POOLINGS:
            raise InvalidInputError("pooling", f"{self.pooling!r} is not served (a vector per token): refsight's "
                                    "embeddings are pooled (last: the served model's last token; else the embedder's)")
        check_template_variables(self.template_variables)
        if self.request_timeout_s < self.header_timeout_s:
            raise InvalidInputError("request_timeout_s", "bounds the whole request, head included: not below header_timeout_s")
        if not isinstance(self.max_incomplete_requests, int) or self.max_incomplete_requests < 1:
            raise InvalidInputError("max_incomplete_requests", f"must be a positive integer, got {self.max_incomplete_requests!r}")
        if isinstance(self.n_predict, bool) or not isinstance(self.n_predict, int) or not (
            self.n_predict == -1 or self.n_predict >= 1
        ):
            raise InvalidInputError("n_predict", f"must be -1 or a positive integer, got {self.n_predict!r}")
        if not isinstance(self.queue, int) or self.queue < 0:
            raise InvalidInputError("queue", f"must be a non-negative integer, got {self.queue!r}")
        if not keys and not all(is_loopback(host) for host in split_hosts(self.host)):
            # Neutral words (not CLI flags): this is raised to library callers too.
            raise InvalidInputError(
                f"host {self.host}",
                "no API keys are configured, so refsight serves on loopback only "
                "(127.0.0.1 / ::1); configure API keys (a keys file or $REFSIGHT_API_KEYS) to bind elsewhere",
            )

    @property
    def store_dir(self) -> Path | str | None:
        """The store directory or ``s3://`` bucket, if one was given (else the library default)."""
        if isinstance(self.store, str) and self.store.startswith("s3://"):
            return self.store
        return Path(self.store) if self.store is not None else None
