"""The :class:`Engine`, refsight's public front: builds the parts (one concern a module), runs the pipelines.

- :class:`~refsight.cache.packages.PackageCache`: the one get-or-encode (cache policy, counters);
- :class:`~refsight.references.ReferenceBook`: ingest and reference CRUD;
- :class:`~refsight.retrieval.store_index.StoreIndex`: recall, kept in sync with the catalog;
- :class:`~refsight.maintenance.Maintenance`: verify, repair, re-encode, stats, gc; the judge and the model backends;
- :class:`~refsight.ranking.Ranking`: the retrieval stage on its own (vectors of inputs, documents scored).

The engine runs its pipelines over them: ``compare`` (recall → attribute prefilter → rerank → judge, in
:mod:`refsight.compare`), ``chat`` / ``generate``, ``search``, and ``embed`` / ``rerank`` (:mod:`refsight.ranking`).
Every method takes a ``namespace`` (default: the engine's), so one engine serves every tenant of a server; with
``share_packages=False`` the namespace also salts every package key, so tenants never share (or observe) encodes.

Each public method is a front door: it resolves its keywords ONCE into a :class:`~refsight.context.RequestContext`
(namespace → scope, model → backend and merged options, the cache switches) and hands that one value down.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .backends.base import Backend
from .backends.options import BackendOptions
from .compare import ComparePipeline
from .support.environment import default_model
from .context import Models, RequestContext
from .maintenance.drift import DriftReport
from .errors import InvalidInputError
from .inputs.images import ImageInput, ImageSource, IntakeLimits, load_image
from .judge.attribute_records import AttributeRecords
from .judge.attribute_schema import AttributeSchema, load_attribute_schema
from .maintenance import Maintenance
from .cache.packages import CachedPackage, PackageCache, holding_packages
from .cache.prefix_states import PrefixStateCache
from .settings.remembering import remember_images_setting
from .requests import AddRequest, CompareRequest, GenerationRequest, SearchRequest, check_sources
from .references import ReferenceBook, ReferenceSegment, load_kept_image
from .results import (
    AddFailure, AddResult, CompareResult, ForgetReport, GenerateResult, IndexReport, PackageState, PruneReport, SearchResult,
    StoreStats, VerifyReport,
)
from .embedders.base import Embedder
from .ranking import EmbedRequest, EmbedResult, Ranking, RerankRequest, RerankResult
from .retrieval.store_index import StoreIndex
from .settings import Settings, load_settings, open_configured_store
from .store import DEFAULT_NAMESPACE, Reference, RememberedImage, Store
from .inputs.text import check_text
from .tools import ToolCall, ToolReader
from .support.timing import elapsed_ms, progress_bar

if TYPE_CHECKING:  # pragma: no cover
    from .ingest import IngestReport

__all__ = ["Engine", "PackageState", "ReferenceSegment"]


_DEFAULT_LIMITS = IntakeLimits()


class Engine:
    """Store + backend + retrieval + judge behind one object.

    ``store`` is a directory (default: ``$REFSIGHT_STORE`` or the user cache dir) or an open
    :class:`~refsight.store.Store` (then the caller closes it); with ``catalog`` (``postgresql://...``) the directory
    is a blob directory shared by replicas, the catalog in PostgreSQL, derived data in ``local_dir``;
    ``"s3://BUCKET/PREFIX"`` with ``catalog`` is a bucket shared by replicas, each with a disk cache of
    ``local_cache_bytes`` in ``local_dir``; ``redis``, ``max_package_bytes``: see :func:`~refsight.store.open_store`;
    ``model`` a registered model name (default: ``$REFSIGHT_MODEL`` or ``tiny-qwen2-vl``), loaded on first use with
    ``backend_options`` over the config file's (``settings``); ``embedder`` the retrieval embedder, an
    :class:`~refsight.embedders.base.Embedder` or a registry name (``conse``, the default: EfficientNet-Lite0 +
    MiniLM; ``clip:PATH``; ``vlm:MODEL``), loaded on first use; ``attribute_schema`` the VLM attribute record's schema
    (an ``AttributeSchema``, a mapping ``name → allowed values or None``, or a JSON/YAML file; default: fur, ears,
    colour, markings); ``remember_images`` what the store keeps of images a chat sends inline: ``off``,
    ``recurring`` (those sent again) or ``all`` (default: ``$REFSIGHT_REMEMBER_IMAGES``, else ``[store]
    remember_images``, else ``recurring``; :mod:`refsight.settings.remembering`); ``quota_shares`` the namespaces (a
    server's tenants, with ``share_packages=False``) that split ``max_package_bytes`` into equal shares, each tenant's
    packages evicted only by its own writes (:mod:`refsight.store.lifecycle`).
    """

    def __init__(
        self, store: str | Path | Store | None = None, *, model: str | None = None, namespace: str = DEFAULT_NAMESPACE,
        limits: IntakeLimits = _DEFAULT_LIMITS, memory_bytes: int | None = None, progress: bool = False,
        embedder: Embedder | str | None = None,
        attribute_schema: AttributeSchema | Mapping[str, Any] | str | Path | None = None,
        backend_options: BackendOptions | None = None, settings: Settings | None = None, share_packages: bool = True,
        catalog: str | None = None, local_dir: str | Path | None = None,
        redis: str | None = None, max_package_bytes: int | str | None = None, remember_images: str | None = None,
        local_cache_bytes: int | str | None = None, quota_shares: Iterable[str] = (),
    ) -> None:
        self.store, settings, self._owns_store = open_configured_store(
            store, settings, memory_bytes, redis, max_package_bytes, local_cache_bytes, catalog=catalog,
            local_dir=local_dir)
        if not share_packages:  # shared packages have no owner to hold to a share
            self.store.quota_shares = frozenset(quota_shares)
        self.model = model or default_model()
        self.namespace = namespace
        self.limits = limits
        self.progress = progress
        self.share_packages = share_packages
        #: The models served: the config file's options (``refsight.toml`` in the store unless
        #: ``settings`` is given) under the explicit ``backend_options``, merged in one place.
        self.models = Models(
            settings if settings is not None else load_settings(self.store.root), backend_options or BackendOptions(),
            self.model, share_packages=share_packages,
        )
        self.attribute_schema = load_attribute_schema(attribute_schema)  # a bad schema fails here, before any work
        #: The attribute records of the store's references (the store opens at the first use).
        self.attribute_records = AttributeRecords(self.store.derived_root, schema=self.attribute_schema)
        kept = partial(load_kept_image, self.store.catalog, limits=limits)
        #: The parts (see the module docstring); the methods below are the public API.
        self.packages = PackageCache(self.store, kept, remember_images=remember_images_setting(
            remember_images, self.models.settings.store.remember_images))
        self.prefixes = PrefixStateCache(self.store)  # reference-prefix KV states, handed to backends per request
        self.book = ReferenceBook(self.store, self.packages, limits, self._progress_bar)
        self.retrieval = StoreIndex(
            self.store.derived_root, self.store.catalog,
            lambda row: kept(row.image_sha256, label=f"reference {row.ref_id}"),
            embedder=embedder, progress=self._progress_bar,
        )
        self.book.on_remove(self.retrieval.forget)
        self.comparisons = ComparePipeline(
            packages=self.packages, book=self.book, retrieval=self.retrieval, attribute_records=self.attribute_records,
            prefixes=self.prefixes, limits=limits, progress=lambda: self.progress,
        )
        self.maintenance = Maintenance(self.store, self.packages, self.book, self._progress_bar)
        self.ranking = Ranking(self.book, self.packages, self.retrieval)

    # -- lifecycle ---------------------------------------------------------------------
    def close(self) -> None:
        """Close what this engine opened (backends stay cached in the registry for reuse)."""
        self.attribute_records.close()
        self.retrieval.close()
        if self._owns_store:
            self.store.close()

    def stop_renders(self) -> None:
        """Stop every chat-template render in this process now (each runs in a worker process, killed here: a render
        in progress fails at once) and refuse more: for a process that is shutting down (``refsight serve``'s SIGTERM),
        which then waits on no template."""
        from .backends.templates import stop_renders

        stop_renders()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def backend(self, model: str | None = None) -> Backend:
        """The backend for ``model`` (default: the engine's model), loaded once with its merged options."""
        return self.models.backend(model)

    def context(
        self, namespace: str | None = None, model: str | None = None, *, use_cache: bool = True,
        prefix_states: bool = True,
    ) -> RequestContext:
        """The context of one call (default: the engine's namespace and model), as every public method resolves it."""
        return self.models.context(namespace or self.namespace, model, use_cache=use_cache, prefix_states=prefix_states)

    # -- references ----------------------------------------------------------------------
    def add(self, request: AddRequest | ImageSource | None = None, /, **options: Any) -> AddResult:
        """Add one reference image and make sure its package is on disk; raises on bad input.

        ``request`` is an :class:`~refsight.requests.AddRequest`, or the image with the request's
        fields as keywords (``engine.add(image, ref_id="cat")``): ``ref_id``, ``metadata``,
        ``model``, ``namespace`` and ``attributes`` (``"imagenet"``, ``"vlm"``: computes and stores
        those attribute records now, see :meth:`add_many`)."""
        request = AddRequest.of(request, options)
        result = next(iter(self.add_many(
            [request.source], ids=[request.ref_id], metadata=request.metadata, model=request.model,
            namespace=request.namespace, attributes=request.attributes,
        )))
        if isinstance(result, AddFailure):
            raise InvalidInputError(result.input, result.error)
        return result

    def add_many(
        self, sources: Sequence[ImageSource], *, ids: Sequence[str | None] | None = None,
        metadata: Mapping[str, Any] | None = None, model: str | None = None, namespace: str | None = None,
        attributes: Sequence[str] = (),
    ) -> Iterator[AddResult | AddFailure]:
        """Add references, one result per input in order; a bad input fails alone (see ReferenceBook).

        ``attributes`` names the attribute records (``"imagenet"``: EfficientNet-Lite0 top-5;
        ``"vlm"``: the attribute schema filled by the model) computed and stored right after each
        batch is stored, so comparisons find them and the prefilter can use them. Empty (the
        default) adds nothing to ingest: records are then computed at the first compare that
        judges the reference.
        """
        sources_ = check_sources(attributes)
        context = self.context(namespace, model)
        # Only the VLM source reads packages and the model: ImageNet records need neither, so a cached add loads no VLM.
        reads_packages = "vlm" in sources_
        hook = (lambda batch: self.attribute_records.ingest(
            batch, sources_, context.backend() if reads_packages else None, context.scope)) if sources_ else None
        return self.book.add_many(
            sources, ids=ids, metadata=metadata, context=context, after_batch=hook, hook_reads_packages=reads_packages)

    def references(self, *, namespace: str | None = None) -> list[Reference]:
        """All references in the namespace, oldest first."""
        return self.book.list(namespace=self.context(namespace).namespace)

    def reference(self, ref_id: str, *, namespace: str | None = None) -> Reference:
        """One reference; raises ReferenceNotFoundError."""
        return self.book.get(ref_id, namespace=self.context(namespace).namespace)

    def remove(self, ref_id: str, *, namespace: str | None = None) -> Reference:
        """Remove a reference, every package no other reference uses, and its retrieval entries."""
        return self.book.remove(ref_id, namespace=self.context(namespace).namespace)

    def reference_image(self, ref: Reference) -> ImageInput:
        """The reference's image, decoded from its kept original bytes."""
        return self.book.image(ref)

    def reference_image_bytes(self, ref: Reference) -> bytes:
        """The reference's kept original bytes, without decoding them (``reference_image`` decodes)."""
        return self.book.kept_bytes(ref)

    def reference_package(self, ref: Reference, *, model: str | None = None) -> CachedPackage:
        """The reference's durable package under ``model`` (encoded now when missing or corrupt)."""
        return self.packages.reference(self.context(ref.namespace, model), ref)

    def package_state(self, ref: Reference, *, model: str | None = None) -> PackageState:
        """Whether the reference's package for ``model`` is on disk and in memory (nothing is loaded)."""
        key = self.context(ref.namespace, model).package_key(ref.image_sha256)
        return PackageState(cached=self.store.local.contains(key), in_memory=self.store.memory.contains(key))

    # -- generation --------------------------------------------------------------------------
    def generate(
        self, prompt: str, *, ref_ids: Sequence[str] = (), candidate: ImageSource | None = None,
        use_cache: bool = True, max_new_tokens: int = 64, model: str | None = None, namespace: str | None = None,
        prefix_states: bool = True,
    ) -> GenerateResult:
        """Generate from references (cached packages unless ``use_cache=False``; their prefix states unless
        ``prefix_states=False``) plus an optional fresh candidate."""
        if not isinstance(prompt, str) or not check_text(prompt, "prompt").strip():
            raise InvalidInputError("prompt", "the prompt is empty")
        segments: list[Any] = []
        for i, ref_id in enumerate(ref_ids, 1):
            segments += [f"Reference {i} ({ref_id}):", ReferenceSegment(ref_id)]
        if candidate is not None:
            # Loaded here: in chat() a plain string is text, so a path must not reach it as one.
            segments += ["Candidate:", load_image(candidate, limits=self.limits)]
        segments.append(prompt)
        return self.chat(
            segments, use_cache=use_cache, max_new_tokens=max_new_tokens, model=model, namespace=namespace,
            prefix_states=prefix_states,
        )

    @holding_packages
    def chat(
        self, request: GenerationRequest | Sequence[str | ReferenceSegment | ImageSource], /, *,
        on_text: Callable[[str], None] | None = None, stop_event: threading.Event | None = None,
        on_prompt: Callable[[int, int, int], None] | None = None,
        on_tool_call: Callable[[ToolCall], None] | None = None, **options: Any) -> GenerateResult:
        """Generate from segments in order: text (``str``), :class:`ReferenceSegment`, or an image.

        ``request`` is a :class:`~refsight.requests.GenerationRequest`, or the segments with its fields as keywords
        (``max_new_tokens`` 64 unless given).

        References come from their durable packages, other images through the package cache under the engine's
        ``remember_images`` policy (:mod:`refsight.settings.remembering`: candidates in memory only, or remembered,
        durable, when sent again); ``use_cache=False`` sends pixels (the runtime's own fresh path).
        ``references_cached`` has one flag per image. ``sampling`` (default greedy) may set only fields the backend
        honours; ``turns`` splits the segments into chat turns (``(role, count)``, see
        :func:`~refsight.backends.turns.plan_turns`); ``on_text`` streams the answer as it is generated; a set
        ``stop_event`` ends it early (``finish_reason="cancelled"``). When the segments open with references (or
        remembered images), the language model's state after them is reused across requests
        (:mod:`refsight.cache.prefix_states`) unless ``prefix_states=False``. ``raw_prompt``: the segments are the whole
        prompt, no chat template added (:mod:`refsight.backends.text_access`). A prompt whose text and image tokens
        exceed ``max_prompt_tokens`` or the backend's context is a :class:`~refsight.errors.ContextLengthError` before
        the language model runs (:mod:`refsight.inputs.prompt_size`). ``on_prompt(total, cached, processed)``, with
        ``on_text``, hears of the prompt's tokens as their evaluation starts and ends (a backend with
        ``supports_prompt_progress``; any other refuses it by name). With ``tools``: the answer's ``tool_calls``
        (:class:`~refsight.tools.ToolReader`), each streamed to ``on_tool_call`` once read.
        """
        chat = GenerationRequest.of(request, options)
        context = self.context(chat.namespace, chat.model, use_cache=chat.use_cache, prefix_states=chat.prefix_states)
        # Before the model loads: each named reference read, each new image decoded (a bad one costs no encode).
        named = self.book.named_references(chat.segments, namespace=context.namespace)
        chat = replace(chat, segments=self.book.decode_images(chat.segments))
        backend = context.backend()
        planned = backend.plan_prompt(chat)  # its turns, rules and size, before any image is encoded
        backend.check_progress(on_text, on_prompt)
        start = time.perf_counter()
        resolved = self.book.resolve_segments(context, backend, planned.segments, named)
        load_ms = (time.perf_counter() - start) * 1000 - resolved.encode_ms
        # The same request, taken whole, with its images resolved and the reference prefix marked (the backend counts
        # its size again, with every package, before any prefill); a raw prompt has no template prefix to key a state
        # by: it is evaluated whole.
        request = replace(
            planned, segments=resolved.segments, prefix_segments=resolved.prefix_segments,
            prefix_cache=None if chat.raw_prompt else self.prefixes.for_request(context),
        )
        reader = ToolReader.of(request, backend.tool_format())
        generation = backend.generate_one(request, on_text=reader.watch(on_text, on_tool_call), stop_event=stop_event,
                                          on_prompt=on_prompt)
        text, calls = reader.finish(generation.text)
        timings = {k: round(v, 3) for k, v in generation.timings_ms.items()}
        timings["encode"] = round(timings.get("encode", 0.0) + resolved.encode_ms, 3)
        timings["reference_load"] = round(load_ms, 3)
        timings["total"] = elapsed_ms(start)
        return GenerateResult.of(
            generation, model=backend.name, random_weights=backend.random_weights, references_cached=resolved.cached,
            timings_ms=timings, max_new_tokens=chat.max_new_tokens, text=text, tool_calls=calls,
        )

    # -- retrieval -------------------------------------------------------------------------
    def search(self, request: SearchRequest | str | None = None, /, **options: Any) -> SearchResult:
        """Recall the ``k`` references best matching ``text`` or ``image`` (``restrict_to``: only those ids).

        ``request`` is a :class:`~refsight.requests.SearchRequest`, or the text (or nothing, with
        ``image=``) with the request's fields as keywords: ``text``, ``image``, ``k`` (10), ``where``,
        ``restrict_to``, ``namespace``. The index is brought up to date with the catalog first (each
        reference image is embedded once per embedder, ever), so a search always sees every reference.
        """
        search = SearchRequest.of(request, options)
        image = search.image
        query = None if image is None else load_image(image, limits=self.limits)
        context = self.context(search.namespace)
        return self.retrieval.search(
            text=search.text, image=query, k=search.k, namespace=context.namespace, where=search.where,
            restrict_to=search.restrict_to, scope=context.scope,
        )

    def index(self, *, rebuild: bool = False, namespace: str | None = None) -> IndexReport:
        """Bring the retrieval index up to date (``rebuild``: from the store, from scratch)."""
        context = self.context(namespace)
        return self.retrieval.sync(context.namespace, rebuild=rebuild, scope=context.scope)

    @holding_packages
    def embed(self, request: EmbedRequest, /) -> EmbedResult:
        """Unit vectors of the request's inputs, an image's kept by content and embedder (:mod:`refsight.ranking`)."""
        return self.ranking.embed(self.context(request.namespace, use_cache=request.use_cache), request)

    @holding_packages
    def rerank(self, request: RerankRequest, /) -> RerankResult:
        """The request's documents scored against its query, one score each (:mod:`refsight.ranking.rerank`)."""
        return self.ranking.rerank(self.context(request.namespace, request.model, use_cache=request.use_cache), request)

    def ingest(
        self, source: str | Path | Sequence[Any], *, ray: str | None = None, actors: int = 1, gpus_per_actor: float = 0.0,
        cpus_per_actor: float = 1.0, batch_size: int = 8, model: str | None = None, namespace: str | None = None,
        attributes: Sequence[str] = ("imagenet",), errors_file: str | Path | None = None, progress: bool = False,
    ) -> IngestReport:
        """Bulk ingest (:mod:`refsight.ingest`): a directory, a text file of paths, a Parquet/CSV manifest or
        ``IngestItem`` s, in-process or on Ray (``ray``: ``"local"``, ``"auto"`` or an address)."""
        from .ingest import IngestParts, ingest

        parts = IngestParts(
            catalog=self.store.catalog, packages=self.packages, book=self.book, retrieval=self.retrieval,
            attribute_records=self.attribute_records, limits=self.limits,
        )
        report = ingest(
            parts, self.context(namespace, model), source, ray=ray, actors=actors, gpus_per_actor=gpus_per_actor,
            cpus_per_actor=cpus_per_actor, batch_size=batch_size, attributes=attributes, errors_file=errors_file,
            progress=progress,
        )
        self.store.counters.flush()  # the misses of this ingest are on disk for `stats` at once
        return report

    # -- judging ---------------------------------------------------------------------------
    @holding_packages
    def compare(
        self, request: CompareRequest | ImageSource, /, *, on_stage: Callable[[str], None] | None = None, **options: Any,
    ) -> CompareResult:
        """Judge a candidate against references, criterion by criterion (:class:`~refsight.compare.ComparePipeline`).

        ``request`` is a :class:`~refsight.requests.CompareRequest`, or the candidate with the
        request's fields as keywords (``engine.compare(image, criteria=..., top_k=3)``): ``criteria``
        (the rubric), ``ref_ids``, ``top_k``, ``query``, ``recall``, ``rerank``, ``recall_k``,
        ``reranker``, ``force_vlm``, ``attributes``, ``evidence_max_chars``, ``use_cache``,
        ``prefix_states``, ``model``, ``namespace``.

        References are ``ref_ids``, or the ``top_k`` recalled by retrieval (within ``ref_ids``
        when both are given). ``recall`` builds the query from the candidate ``"image"``, the
        ``"text"`` (``query``, else the rubric) or ``"both"`` (default; ``"text"`` when ``query``
        is given). ``rerank=N`` recalls N, reranks them with ``reranker`` (``"vlm"``: P(yes) of
        the model, ``"embedding"``: cosine, or a :class:`~refsight.compare.rerank.Reranker`) and judges
        the ``top_k`` best (``recall_k``: recall that many, rerank the best ``rerank`` of them by recall
        score). References whose stored attribute records settle a required
        criterion as a mismatch are dropped first (``stage: "filtered"``). The candidate is
        encoded once (memory only); references come from their durable packages
        (``use_cache=False`` sends every image as pixels; ``prefix_states=False`` prefills every
        reference prefix afresh). Criteria the attribute records
        (``"imagenet"``, ``"vlm"``) settle are answered from them unless ``force_vlm``.
        ``evidence_max_chars`` bounds each evidence string. Results are sorted by score.
        ``on_stage`` is told each stage's name (``recall``, ``prefilter``, ``rerank``, ``judge`` ...) as it starts.
        """
        request = CompareRequest.of(request, options)
        context = self.context(
            request.namespace, request.model, use_cache=request.use_cache, prefix_states=request.prefix_states
        )
        return self.comparisons.run(context, request, on_stage)

    # -- maintenance -------------------------------------------------------------------
    def stats(self, *, namespace: str | None = None, tenant_view: bool = False, all_namespaces: bool = False) -> StoreStats:
        """Cache statistics (``tenant_view``: only the namespace's packages, no store-wide counters;
        ``all_namespaces``: references counted across every namespace)."""
        return self.maintenance.stats(
            namespace=None if all_namespaces else self.context(namespace).namespace, tenant_view=tenant_view,
            backends=() if tenant_view else self.models.loaded(),
        )

    def verify(self, *, repair: bool = False, model: str | None = None) -> VerifyReport:
        """Check every package; with ``repair``, re-encode corrupt ones from the kept images with ``model``."""
        return self.maintenance.verify(repair=repair, backend=lambda: self.backend(model))

    def check_drift(
        self, sample: int, *, model: str | None = None, namespace: str | None = None, seed: int = 0,
        threshold: float | None = None,
    ) -> DriftReport:
        """Re-encode ``sample`` random references with today's runtime and compare with the stored packages."""
        return self.maintenance.drift(self.context(namespace, model), sample=sample, seed=seed, threshold=threshold)

    def reencode(self, *, model: str | None = None, namespace: str | None = None) -> Iterator[AddResult]:
        """Encode every reference of the namespace for ``model`` (packages already there are skipped)."""
        return self.maintenance.reencode(self.context(namespace, model))

    def prune(self, *, fingerprints: Sequence[str] = (), models: Sequence[str] = (), dry_run: bool = False) -> PruneReport:
        """Drop every package of these fingerprint digests or models (references and kept images stay)."""
        return self.maintenance.prune(fingerprints=fingerprints, models=models, dry_run=dry_run, backend=self.backend)

    def remembered(self, *, namespace: str | None = None, all_namespaces: bool = False) -> list[RememberedImage]:
        """The remembered images (images sent inline and kept: :mod:`refsight.settings.remembering`) of the namespace
        (``all_namespaces``: of the store), most recently used first."""
        return self.maintenance.remembered(namespace=None if all_namespaces else self.context(namespace).namespace)

    def forget_remembered(
        self, *, namespace: str | None = None, all_namespaces: bool = False, dry_run: bool = False,
    ) -> ForgetReport:
        """Forget the namespace's remembered images (``all_namespaces``: the store's): their packages go unless
        a reference or another namespace still holds them (``dry_run``: list them only)."""
        return self.maintenance.forget_remembered(
            namespace=None if all_namespaces else self.context(namespace).namespace, dry_run=dry_run)

    def gc(self, **options: Any) -> dict[str, int]:
        """Remove what interrupted writes left in the store (see :meth:`refsight.store.Store.gc`); returns counts."""
        return self.store.gc(**options)

    def _progress_bar(self, total: int, description: str) -> AbstractContextManager[Any]:
        return progress_bar(total, description, enabled=self.progress)
