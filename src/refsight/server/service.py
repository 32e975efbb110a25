"""The blocking work behind every endpoint, over ONE :class:`refsight.Engine` and one open store.

:class:`Service` calls only the engine's public API, naming the caller's namespace on
every call; its methods take their arguments as the engine's do (the input first, the
``namespace`` a keyword); it reads no store tier itself. Its methods are plain synchronous calls that
the routes run in the :class:`~refsight.server.edge.limits.WorkPool`, so model work never
blocks the event loop: every method that decodes an image, tokenizes or runs the model is
:func:`~refsight.server.edge.limits.model_work`, which runs only inside a work pool job (anywhere else it
raises), so the pool's bound holds on every route that reaches the model (a chat template renders under
bounds of its own, in a worker process: :meth:`Service.render_chat`). They return JSON-ready
dicts (the edge of the library; a generation stays a typed :class:`~refsight.results.GenerateResult` for the
text routes to format), every string printable (:func:`~refsight.server.edge.responses.printable_data`: a
stored value that is not valid Unicode shows as U+FFFD instead of failing the reply).

**Tenants learn nothing about each other.** With API keys, each tenant's namespace salts
its package keys (``Engine(share_packages=False)``): an image another tenant stored is,
for this tenant, an image never seen — encoded afresh, with real timings — so no field,
value or timing of a reply depends on another tenant's data. ``share_packages=True`` in
:class:`~refsight.server.config.ServerConfig` (``refsight serve --share-packages``) shares
packages across tenants to save encodes, at the price of revealing, by timing, that some
tenant holds an image. Under a byte quota (``--max-package-bytes``) isolated tenants each hold an equal
share, and only a tenant's own writes evict its packages (:mod:`refsight.store.lifecycle`), so which of
them stay cached depends on nothing another tenant sends. Without keys there is a single tenant, and
packages are shared with the CLI's (same keys). The thumbnail cache (:mod:`~refsight.server.replies.thumbnails`) is
scoped the same way; what isolation leaves is listed in ``docs/architecture/policies.md`` (policy 4).
"""

from __future__ import annotations

import ctypes
import gc
import io
import time
from dataclasses import fields as dataclass_fields
from dataclasses import replace
from typing import Any, Callable, Mapping, Sequence

from PIL import Image

from .. import AddFailure, Engine, ImageInput, InvalidInputError, ReferenceSegment
from ..ranking import EmbedRequest, EmbedResult, RerankRequest, RerankResult
from ..embedders.registry import DEFAULT_EMBEDDER
from ..inputs.images import IntakeLimits, load_image
from ..support.environment import default_store_dir
from ..requests import AddRequest, GenerationRequest, CompareRequest, SearchRequest
from ..results import GenerateResult
from ..settings import Settings, load_settings
from .config import ServerConfig
from .edge.limits import model_work
from .edge.llama_metrics import GenerationCounters
from .model_facts import GenerationSupport, ModelDetails, ModelFacts
from .edge.responses import printable_data
from .replies.thumbnails import ThumbnailCache, render_thumbnail, snap_size

__all__ = ["Service", "ReferenceSegment"]


def _format_of(data: bytes) -> str | None:
    """The container format of image bytes from their header alone (no pixel decoded)."""
    try:
        with Image.open(io.BytesIO(data)) as img:
            return img.format
    except Exception:  # noqa: BLE001 -- kept bytes were valid when stored; unknown is served as octet-stream
        return None


class Service:
    """One engine for every tenant; every method is blocking and names the tenant's namespace."""

    def __init__(self, config: ServerConfig, *, share_packages: bool, tenants: Sequence[str] = ()) -> None:
        self.config = config
        self.limits = IntakeLimits(max_pixels=config.max_image_pixels, max_bytes=config.max_body_bytes)
        self.share_packages = share_packages
        #: The tenants' namespaces: with packages isolated, each holds an equal share of the byte quota.
        self.tenants = tuple(tenants)
        self.engine: Engine | None = None
        #: The served model's facts, taken when it loads (:meth:`open`); what it honours and its files, likewise.
        self.facts: ModelFacts | None = None
        self._support: GenerationSupport | None = None
        self._details: ModelDetails | None = None
        #: JPEG thumbnails, per tenant unless packages are shared (see :mod:`~refsight.server.replies.thumbnails`).
        self.thumbnails = ThumbnailCache()
        #: Every generation's tokens and times (llama-server's ``llamacpp:*`` metrics).
        self.generations = GenerationCounters()

    # -- lifecycle -------------------------------------------------------------------
    def open(self) -> None:
        """Open the store and load the model once, so the first request pays no load time (again: nothing)."""
        if self.engine is not None:
            return
        options = {} if self.config.memory_bytes is None else {"memory_bytes": self.config.memory_bytes}
        self.engine = Engine(
            self.config.store_dir,
            catalog=self.config.catalog,
            local_dir=self.config.local_dir,
            model=self.config.model,
            limits=self.limits,
            backend_options=self.config.backend_options,
            settings=self._settings(),
            share_packages=self.share_packages,
            embedder=self.config.embedder,
            redis=self.config.redis,
            max_package_bytes=self.config.max_package_bytes,
            local_cache_bytes=self.config.local_cache_bytes,
            remember_images=self.config.remember_images, quota_shares=self.tenants,
            **options,
        )
        backend = self.engine.backend()
        backend.fingerprint()
        self.facts = ModelFacts.of(backend)
        self._support, self._details = GenerationSupport.of(backend), ModelDetails.of(backend)
        if self.config.pooling == "last":  # llama-server's --pooling last: the served model embeds; here, at start
            try:
                self.engine.embed(EmbedRequest(["pooling"], embedder="vlm:" + self.engine.model))
            except InvalidInputError as exc:
                raise InvalidInputError("pooling", f"last: {exc.reason}") from None

    # -- sleep (llama-server's --sleep-idle-seconds; server/edge/sleep.py decides when) ---------------------
    @property
    def is_sleeping(self) -> bool:
        """Whether the model is unloaded (asleep): the next request that needs it loads it again."""
        return self.engine is not None and not self.engine.models.is_loaded()

    def sleep(self) -> bool:
        """Unload the model, so its memory is freed (the store stays open; stored packages and prefix
        states stay); False when it was not loaded. The caller makes sure no request is using it."""
        if self.engine is None or not self.engine.models.unload():
            return False
        gc.collect()  # the model's tensors are freed now, not at some later collection
        _return_freed_heap()
        return True

    def wake(self) -> None:
        """Load the model again after :meth:`sleep` (the same options, so the same fingerprint)."""
        if self.engine is not None:
            self.engine.backend()

    def _settings(self) -> Settings:
        if self.config.settings is not None:
            return self.config.settings
        return load_settings(self.config.store_dir or default_store_dir(), self.config.config_file)

    def stop_renders(self) -> None:
        """Stop the chat-template renders in progress (they fail at once) and refuse more: the server is shutting
        down (its SIGTERM), and waits on no template."""
        if self.engine is not None:
            self.engine.stop_renders()

    def close(self) -> None:
        """Close the engine (and with it the store)."""
        if self.engine is not None:
            self.engine.close()
            self.engine = None

    @property
    def model(self) -> str:
        """Name of the served model."""
        return self.facts.name

    @property
    def served_model(self) -> str:
        """The model's name to clients: the first ``served_model_names`` (``--served-model-name``/``--alias``), else its own."""
        return self.config.served_model_names[0] if self.config.served_model_names else self.model

    @property
    def model_names(self) -> frozenset[str]:
        """Every name a client may send as ``model``: the served names and the model's own."""
        return frozenset({*self.config.served_model_names, self.model})

    @property
    def context_size(self) -> int | None:
        """The model's context in tokens, where its runtime has a limit (llama.cpp's ``n_ctx``), else None."""
        return self.facts.context_size

    @property
    def sampling_defaults(self) -> dict[str, Any]:
        """Sampling fields for requests that leave them unset: the served model's runtime's (llama-server's
        sampler chain on llama.cpp; an ``ollama:`` model's params over Ollama's), under the server's own
        (``--temp``, ``--top-k`` ...: the operator's word is the last). From the facts taken at load: reading
        them never wakes a sleeping model."""
        return {**self.facts.sampling_defaults, **self.config.sampling_defaults}

    @property
    def random_weights(self) -> bool:
        """Whether the served model has random weights (its text is meaningless)."""
        return self.facts.random_weights

    # -- the served model's text and facts: the routes' one way to the model (they never hold the backend) --------
    @property
    def is_ready(self) -> bool:
        """Whether the engine is open (:meth:`open` ran and :meth:`close` did not): llama-server's ``/health``."""
        return self.engine is not None

    @property
    def media_marker(self) -> str:
        """The text that stands for an image in a raw prompt (where its tokens go), from the facts taken at load."""
        return self.facts.media_marker

    @model_work
    def tokenize(self, text: str, *, add_special: bool = False, parse_special: bool = True) -> list[int]:
        """The served model's token ids of ``text`` (``add_special``: a BOS where the vocabulary wants one;
        ``parse_special``: special tokens written out in the text are read as themselves)."""
        return self.engine.backend().tokenize(text, add_special=add_special, parse_special=parse_special)

    @model_work
    def detokenize(self, tokens: Sequence[int]) -> str:
        """The text of ``tokens`` in the served model's vocabulary."""
        return self.engine.backend().detokenize(tokens)

    @model_work
    def token_piece(self, token: int) -> bytes:
        """One token's bytes (special tokens written out); InvalidInputError for an id outside the vocabulary."""
        return self.engine.backend().token_piece(token)

    @model_work
    def count_text_tokens(self, text: str) -> int:
        """How many tokens ``text`` becomes in a prompt, images not counted (the prompt limit's count)."""
        return self.engine.backend().count_text_tokens(text)

    @model_work
    def image_token_count(self, image: Any, *, namespace: str) -> int | None:
        """Prompt tokens an image segment takes, or None where the served runtime cannot tell before running the
        model. A stored reference counts by its package's layout (encoded now when missing, as a chat would)."""
        if isinstance(image, ReferenceSegment):
            image = self.engine.reference_package(self.engine.reference(image.ref_id, namespace=namespace)).package
        return self.engine.backend().image_token_count(image)

    def render_chat(self, texts: list[str], turns: list[tuple[str, int]], ending: str, tools: Any = None,
                    variables: Mapping[str, Any] | None = None) -> str:
        """The chat template's text of ``texts`` in ``turns``, ended as ``ending`` says (``continue``: the earlier
        turns with the answer's opening, then the final message's text, as a chat renders it), given ``tools`` (a
        :class:`~refsight.tools.ChatTools`, as a chat renders them) and the template's ``variables``; rendered under
        the renders' own bounds (a worker process, its deadline, its memory: ``backends/templates``), so it takes no
        model worker, and refused (400) when it is nothing to generate from, as a chat would be."""
        backend = self.engine.backend()
        if tools is not None and not backend.supports_tools:
            raise InvalidInputError("tools", f"{backend.name} cannot offer tools to its model")
        return backend.chat_text(texts, turns, ending, tools, variables)

    def template_reads(self, variable: str) -> bool:
        """Whether the served chat template could read ``variable`` (a template variable a request sets): a search of
        the template's text, no model work, so a route asks it on the event loop."""
        return self.engine.backend().chat_template_reads(variable)

    @model_work
    def end_tokens(self) -> tuple[int, ...]:
        """The tokens that end a generation, where the backend honours ``ignore_eos`` (llama.cpp: what it bans);
        else none. Asked only for a request that sets ``ignore_eos``: the first ask walks the vocabulary."""
        return tuple(getattr(self.engine.backend(), "end_tokens", tuple)())

    def generation_support(self) -> GenerationSupport:
        """What the served backend honours in a generation request (sampling fields, prompt ends, progress), as
        read at load: asking never wakes a sleeping model (a reload serves the same model with the same options)."""
        return self._support

    def model_details(self) -> ModelDetails:
        """The served model's origin and files (Ollama's model endpoints describe it by them), as read at load."""
        return self._details

    # -- helpers -----------------------------------------------------------------------
    @model_work
    def decode(self, data: bytes, label: str) -> ImageInput:
        """Decode an uploaded image under the server's limits; ImageError names ``label``."""
        return load_image(data, limits=self.limits, name=label)

    def _reference_view(self, ref) -> dict[str, Any]:
        state = self.engine.package_state(ref)
        return printable_data({**ref.to_dict(), "cached": state.cached, "in_memory": state.in_memory})

    # -- references ----------------------------------------------------------------------
    @model_work
    def add(self, request: AddRequest) -> dict[str, Any]:
        """Add the request's reference (the request names the tenant's namespace); the same fields as
        ``refsight add --json``."""
        if request.namespace is None:  # a tenant's add never falls back to the engine's namespace
            raise ValueError("a server's AddRequest names the tenant's namespace")
        # add_many, not add: a failure names the given id (the field the client sent), not the image's label.
        result = next(iter(self.engine.add_many(
            [request.source], ids=[request.ref_id], metadata=dict(request.metadata or {}), model=request.model,
            namespace=request.namespace, attributes=request.attributes,
        )))
        if isinstance(result, AddFailure):
            raise InvalidInputError(request.ref_id or result.input, result.error)
        return printable_data(result.to_dict())

    def references(self, *, namespace: str) -> list[dict[str, Any]]:
        """Every reference of the tenant, with its cache state under the served model."""
        return [self._reference_view(ref) for ref in self.engine.references(namespace=namespace)]

    def reference_count(self, *, namespace: str | None = None) -> int:
        """How many references the tenant's ``namespace`` holds; every namespace's together when None."""
        if namespace is None:
            return self.engine.stats(all_namespaces=True).references
        return len(self.engine.references(namespace=namespace))

    def reference(self, ref_id: str, *, namespace: str) -> dict[str, Any]:
        """One reference; ReferenceNotFoundError when the tenant has none by that id."""
        return self._reference_view(self.engine.reference(ref_id, namespace=namespace))

    def remove(self, ref_id: str, *, namespace: str) -> dict[str, Any]:
        """Remove the tenant's reference (packages still used by anyone else stay)."""
        return printable_data({"removed": self.engine.remove(ref_id, namespace=namespace).ref_id})

    def remembered(self, *, namespace: str) -> list[dict[str, Any]]:
        """The tenant's remembered images (images it sent inline and the store kept), most recently used first."""
        return [image.to_dict() for image in self.engine.remembered(namespace=namespace)]

    def forget_remembered(self, *, namespace: str) -> dict[str, Any]:
        """Forget the tenant's remembered images (packages a reference or another tenant still holds stay)."""
        return self.engine.forget_remembered(namespace=namespace).to_dict()

    def thumbnail(self, ref_id: str, size: int, *, namespace: str) -> bytes:
        """A JPEG thumbnail (longest side ``size``) of the tenant's reference image."""
        ref = self.engine.reference(ref_id, namespace=namespace)  # the namespace check comes before any cache
        # Scoped like the package keys (the request context's one namespace -> scope rule): isolated
        # tenants never see each other's cache hits (timing).
        scope = self.engine.context(namespace).scope
        size = snap_size(size)  # a few sizes per image, whatever the query asks
        return self.thumbnails.get(scope, ref.image_sha256, size, lambda: render_thumbnail(
            self.engine.reference_image_bytes(ref), size, self.limits, f"reference {ref.ref_id}"))

    def reference_image(self, ref_id: str, *, namespace: str) -> tuple[bytes, str]:
        """The tenant's reference image as it was added: its kept bytes and their media type (nothing decoded)."""
        data = self.engine.reference_image_bytes(self.engine.reference(ref_id, namespace=namespace))
        kind = (_format_of(data) or "").lower()
        return data, f"image/{kind}" if kind else "application/octet-stream"

    # -- model work --------------------------------------------------------------------------
    @model_work
    def compare(self, request: CompareRequest, *, on_stage: Callable[[str], None] | None = None) -> dict[str, Any]:
        """``engine.compare`` of the request (which names the tenant's namespace) → the JSON of ``refsight compare --json``."""
        if request.namespace is None:  # a tenant's compare never falls back to the engine's namespace
            raise ValueError("a server's CompareRequest names the tenant's namespace")
        return printable_data(self.engine.compare(request, on_stage=on_stage).to_dict())

    @model_work
    def search(self, request: SearchRequest) -> dict[str, Any]:
        """``engine.search`` of the request (which names the tenant's namespace) → the JSON of ``refsight search --json``."""
        if request.namespace is None:  # a tenant's search never falls back to the engine's namespace
            raise ValueError("a server's SearchRequest names the tenant's namespace")
        return printable_data(self.engine.search(request).to_dict())

    @property
    def embedder_name(self) -> str:
        """The configured embedder's registry name (``--embedder``, else ``conse``): what an embedding request naming no
        model gets (unless the served model embeds: ``ServerConfig.pooling`` ``last``)."""
        return self.config.embedder or DEFAULT_EMBEDDER

    @model_work
    def embed(self, request: EmbedRequest) -> EmbedResult:
        """``engine.embed`` of the request (which names the tenant's namespace), under the server's cache policy."""
        if request.namespace is None:  # a tenant's request never falls back to the engine's namespace
            raise ValueError("a server's EmbedRequest names the tenant's namespace")
        return self.engine.embed(request if self.config.use_cache else replace(request, use_cache=False))

    @model_work
    def rerank(self, request: RerankRequest) -> RerankResult:
        """``engine.rerank`` of the request (which names the tenant's namespace), under the server's cache policy."""
        if request.namespace is None:
            raise ValueError("a server's RerankRequest names the tenant's namespace")
        return self.engine.rerank(request if self.config.use_cache else replace(request, use_cache=False))

    @model_work
    def chat(
        self, segments: Sequence[Any], *, namespace: str, on_text: Callable[[str], None] | None = None,
        stop_event: Any = None, on_prompt: Callable[[int, int, int], None] | None = None,
        on_tool_call: Callable[[Any], None] | None = None, **fields: Any,
    ) -> GenerateResult:
        """A route's generation: ONE :class:`~refsight.requests.GenerationRequest` of its ``fields`` with the server's
        policy merged in (built here, once), taken whole by ``engine.chat`` → the generation, typed, its strings
        printable (the routes format it by attribute). ``on_prompt``: the prompt's progress, ``on_tool_call``: each
        tool call as it is read (``engine.chat``'s)."""
        # The prompt limit counts every image's tokens too, checked in the engine before any prefill.
        policy: dict[str, Any] = {"max_prompt_tokens": self.config.max_prompt_tokens}
        if not self.config.use_cache:  # ``--no-cache``: every image through the runtime's fresh path (a benchmark's baseline)
            policy.update(use_cache=False, prefix_states=False)
        request = GenerationRequest(list(segments), namespace=namespace, **policy, **fields)
        began, first = time.perf_counter(), None

        def noting(piece: str) -> None:  # the first piece splits the prompt's time from the answer's
            nonlocal first
            if first is None:
                first = time.perf_counter()
            on_text(piece)

        result = self.engine.chat(request, on_text=None if on_text is None else noting, stop_event=stop_event,
                                  on_prompt=on_prompt, on_tool_call=on_tool_call)
        self.generations.add(result, began, first, time.perf_counter())
        # Strings made printable; the log probabilities and tool calls stay typed (each dialect formats them).
        typed = ("logprobs", "tool_calls")
        plain = {f.name: getattr(result, f.name) for f in dataclass_fields(result) if f.name not in typed}
        return GenerateResult(**printable_data(plain), logprobs=result.logprobs, tool_calls=result.tool_calls)

    # -- stats -----------------------------------------------------------------------------
    def stats(self, *, namespace: str, tenants: bool) -> dict[str, Any]:
        """Cache statistics. Alone (no keys) the store's own; with tenants only what is the tenant's."""
        return self.engine.stats(namespace=namespace, tenant_view=tenants).to_dict()

    def global_stats(self) -> dict[str, Any]:
        """The store-wide counters and sizes (for ``/metrics``), references across all namespaces."""
        return self.engine.stats(all_namespaces=True).to_dict()


def _return_freed_heap() -> None:
    """Hand the C heap's freed pages back to the system (glibc keeps them for reuse otherwise, so a slept
    model would still count in the process's memory); nothing where the C library is not glibc."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
