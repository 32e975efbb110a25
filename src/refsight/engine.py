"""The :class:`Engine`: refsight's public front. It builds the parts and runs the pipelines.

The parts, each a module with one concern:

- :class:`~refsight.packages.PackageCache`: the one get-or-encode (cache policy, counters);
- :class:`~refsight.references.ReferenceBook`: ingest and reference CRUD;
- :class:`~refsight.retrieval.store_index.StoreIndex`: recall, kept in sync with the catalog;
- :class:`~refsight.maintenance.Maintenance`: verify, repair, re-encode, stats, gc;
- the judge (:mod:`refsight.judge`) and the model backends (:mod:`refsight.backends`).

The engine runs three pipelines over them: ``compare`` (recall → judge), ``chat`` /
``generate`` and ``search``. Every method takes a ``namespace`` (default: the engine's),
so one engine serves every tenant of a server. With ``share_packages=False`` the
namespace also salts every package key, so tenants never share (or observe) encodes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from functools import partial
from pathlib import Path
from typing import Any

from .backends.base import Backend, GenerationRequest
from .backends.options import BackendOptions
from .backends.sampling import Sampling, check_supported
from .backends.turns import plan_turns
from .config import default_model, default_store_dir
from .drift import DriftReport
from .errors import InvalidInputError
from .images import ImageInput, ImageSource, IntakeLimits, load_image
from .maintenance import Maintenance
from .packages import CachedPackage, PackageCache
from .references import ReferenceBook, ReferenceSegment, load_kept_image, source_label
from .results import (
    AddFailure,
    AddResult,
    CompareResult,
    GenerateResult,
    IndexReport,
    PackageState,
    SearchResult,
    StoreStats,
    VerifyReport,
)
from .retrieval.embedders import Embedder
from .retrieval.store_index import StoreIndex
from .settings import Settings, load_settings
from .store import DEFAULT_NAMESPACE, Reference, Store, open_store
from .timing import StageTimer, elapsed_ms, progress_bar

__all__ = ["Engine", "PackageState", "ReferenceSegment"]


_DEFAULT_LIMITS = IntakeLimits()


class Engine:
    """Store + backend + retrieval + judge behind one object.

    ``store`` is a directory (default: ``$REFSIGHT_STORE`` or the user cache dir) or an
    open :class:`~refsight.store.Store` (then the caller closes it); ``model`` a
    registered model name (default: ``$REFSIGHT_MODEL`` or ``tiny-qwen2-vl``), loaded on
    first use with ``backend_options`` over the config file's (``settings``); ``embedder`` the retrieval embedder (default:
    EfficientNet-Lite0 + MiniLM, loaded on first use).
    """

    def __init__(
        self,
        store: str | Path | Store | None = None,
        *,
        model: str | None = None,
        namespace: str = DEFAULT_NAMESPACE,
        limits: IntakeLimits = _DEFAULT_LIMITS,
        memory_bytes: int | None = None,
        progress: bool = False,
        embedder: Embedder | None = None,
        backend_options: BackendOptions | None = None,
        settings: Settings | None = None,
        share_packages: bool = True,
    ) -> None:
        self._owns_store = not isinstance(store, Store)
        if isinstance(store, Store):
            self.store = store
        else:
            options = {} if memory_bytes is None else {"memory_bytes": memory_bytes}
            self.store = open_store(Path(store) if store is not None else default_store_dir(), **options)
        self.model = model or default_model()
        self.namespace = namespace
        self.limits = limits
        self.progress = progress
        self.backend_options = backend_options or BackendOptions()
        #: The config file's options (``refsight.toml`` in the store unless given); explicit options win.
        self.settings = settings if settings is not None else load_settings(self.store.root)
        self.share_packages = share_packages
        self._backends: dict[str, Backend] = {}
        self._sidecars = None  # the attribute sidecars, opened at the first comparison that uses them
        kept = partial(load_kept_image, self.store.catalog, limits=limits)
        #: The parts (see the module docstring); the methods below are the public API.
        self.packages = PackageCache(self.store, kept)
        self.book = ReferenceBook(self.store, self.packages, limits, self._progress_bar)
        self.retrieval = StoreIndex(
            self.store.root,
            self.store.catalog,
            lambda row: kept(row.image_sha256, label=f"reference {row.ref_id}"),
            embedder=embedder,
            progress=self._progress_bar,
        )
        self.book.on_remove(self.retrieval.forget)
        self.maintenance = Maintenance(self.store, self.packages, self.book, self._progress_bar)

    # -- lifecycle ---------------------------------------------------------------------
    def close(self) -> None:
        """Close what this engine opened (backends stay cached in the registry for reuse)."""
        if self._sidecars is not None:
            self._sidecars.close()
            self._sidecars = None
        self.retrieval.close()
        if self._owns_store:
            self.store.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def backend(self, model: str | None = None) -> Backend:
        """The backend for ``model`` (default: the engine's model), loaded once with the engine's options."""
        from .backends.registry import get_backend

        name = model or self.model
        if name not in self._backends:
            options = self.settings.backend_options(name).merged(self.backend_options)
            self._backends[name] = get_backend(name, **options.as_kwargs())
        return self._backends[name]

    def scope(self, namespace: str | None = None) -> str | None:
        """The isolation scope salting ``namespace``'s package keys (None when packages are shared)."""
        return None if self.share_packages else (namespace or self.namespace)

    def _ns(self, namespace: str | None) -> str:
        return namespace or self.namespace

    # -- references ----------------------------------------------------------------------
    def add(
        self, source: ImageSource, *, ref_id: str | None = None, metadata: Mapping[str, Any] | None = None,
        model: str | None = None, namespace: str | None = None,
    ) -> AddResult:
        """Add one reference image and make sure its package is on disk; raises on bad input."""
        result = next(iter(self.add_many([source], ids=[ref_id], metadata=metadata, model=model, namespace=namespace)))
        if isinstance(result, AddFailure):
            raise InvalidInputError(result.input, result.error)
        return result

    def add_many(
        self, sources: Sequence[ImageSource], *, ids: Sequence[str | None] | None = None,
        metadata: Mapping[str, Any] | None = None, model: str | None = None, namespace: str | None = None,
    ) -> Iterator[AddResult | AddFailure]:
        """Add references, one result per input in order; a bad input fails alone (see ReferenceBook)."""
        namespace = self._ns(namespace)
        backend, scope = self.backend(model), self.scope(namespace)
        return self.book.add_many(sources, ids=ids, metadata=metadata, backend=backend, namespace=namespace, scope=scope)

    def references(self, *, namespace: str | None = None) -> list[Reference]:
        """All references in the namespace, oldest first."""
        return self.book.list(namespace=self._ns(namespace))

    def reference(self, ref_id: str, *, namespace: str | None = None) -> Reference:
        """One reference; raises ReferenceNotFoundError."""
        return self.book.get(ref_id, namespace=self._ns(namespace))

    def remove(self, ref_id: str, *, namespace: str | None = None) -> Reference:
        """Remove a reference, every package no other reference uses, and its retrieval entries."""
        return self.book.remove(ref_id, namespace=self._ns(namespace))

    def reference_image(self, ref: Reference) -> ImageInput:
        """The reference's image, decoded from its kept original bytes."""
        return self.book.image(ref)

    def reference_package(self, ref: Reference, *, model: str | None = None) -> CachedPackage:
        """The reference's durable package under ``model`` (encoded now when missing or corrupt)."""
        return self.packages.reference(self.backend(model), ref, scope=self.scope(ref.namespace))

    def package_state(self, ref: Reference, *, model: str | None = None) -> PackageState:
        """Whether the reference's package for ``model`` is on disk and in memory (nothing is loaded)."""
        key = self.packages.key(self.backend(model), ref.image_sha256, self.scope(ref.namespace))
        return PackageState(cached=self.store.local.contains(key), in_memory=self.store.memory.contains(key))

    # -- generation --------------------------------------------------------------------------
    def generate(
        self, prompt: str, *, ref_ids: Sequence[str] = (), candidate: ImageSource | None = None,
        use_cache: bool = True, max_new_tokens: int = 64, model: str | None = None, namespace: str | None = None,
    ) -> GenerateResult:
        """Generate from references (cached packages unless ``use_cache=False``) plus an optional fresh candidate."""
        if not prompt or not prompt.strip():
            raise InvalidInputError("prompt", "the prompt is empty")
        segments: list[Any] = []
        for i, ref_id in enumerate(ref_ids, 1):
            segments += [f"Reference {i} ({ref_id}):", ReferenceSegment(ref_id)]
        if candidate is not None:
            # Loaded here: in chat() a plain string is text, so a path must not reach it as one.
            segments += ["Candidate:", load_image(candidate, limits=self.limits, name=source_label(candidate))]
        segments.append(prompt)
        return self.chat(segments, use_cache=use_cache, max_new_tokens=max_new_tokens, model=model, namespace=namespace)

    def chat(
        self, segments: Sequence[str | ReferenceSegment | ImageSource], *, use_cache: bool = True,
        max_new_tokens: int = 64, json_schema: dict[str, Any] | None = None, model: str | None = None,
        namespace: str | None = None, sampling: Sampling | None = None, turns: Sequence[tuple[str, int]] | None = None,
        on_text: Callable[[str], None] | None = None, stop_event: threading.Event | None = None,
    ) -> GenerateResult:
        """Generate from segments in order: text (``str``), :class:`ReferenceSegment`, or an image.

        References come from their durable packages, other images through the package cache as
        candidates (memory only); ``use_cache=False`` sends pixels (the runtime's own fresh path).
        ``references_cached`` has one flag per image. ``sampling`` (default greedy) may set only
        fields the backend honours; ``turns`` splits the segments into chat turns (``(role,
        count)``, see :func:`~refsight.backends.turns.plan_turns`); ``on_text`` streams the answer
        as it is generated; a set ``stop_event`` ends it early (``finish_reason="cancelled"``).
        """
        namespace = self._ns(namespace)
        backend, scope = self.backend(model), self.scope(namespace)
        sampling = sampling or Sampling()
        check_supported(sampling, backend.sampling_fields, backend.name)
        segments, turns = plan_turns(list(segments), turns, backend.supports_turns)
        start = time.perf_counter()
        resolved: list[Any] = []
        cached: list[bool] = []
        encode_ms = 0.0
        for segment in segments:
            if isinstance(segment, str):
                resolved.append(segment)
                continue
            if isinstance(segment, ReferenceSegment):
                visual = self.packages.visual(
                    backend, self.reference(segment.ref_id, namespace=namespace), use_cache=use_cache, scope=scope
                )
            else:
                image = load_image(segment, limits=self.limits, name=source_label(segment))
                visual = self.packages.visual(backend, image, use_cache=use_cache, scope=scope)
            resolved.append(visual.item)
            cached.append(visual.cached)
            encode_ms += visual.encode_ms
        load_ms = (time.perf_counter() - start) * 1000 - encode_ms
        request = GenerationRequest(
            segments=resolved, max_new_tokens=max_new_tokens, json_schema=json_schema, sampling=sampling, turns=turns
        )
        if on_text is not None:
            generation = backend.generate_stream(request, on_text=on_text, stop_event=stop_event)
        else:
            generation = backend.generate([request])[0]
        timings = {k: round(v, 3) for k, v in generation.timings_ms.items()}
        timings["encode"] = round(timings.get("encode", 0.0) + encode_ms, 3)
        timings["reference_load"] = round(load_ms, 3)
        timings["total"] = elapsed_ms(start)
        return GenerateResult.of(
            generation, model=backend.name, random_weights=backend.random_weights, references_cached=cached,
            timings_ms=timings, max_new_tokens=max_new_tokens,
        )

    # -- retrieval -------------------------------------------------------------------------
    def search(
        self, text: str | None = None, *, image: ImageSource | None = None, k: int = 10,
        where: Mapping[str, Any] | None = None, restrict_to: Sequence[str] | None = None, namespace: str | None = None,
    ) -> SearchResult:
        """Recall the ``k`` references best matching ``text`` or ``image`` (``restrict_to``: only those ids).

        The index is brought up to date with the catalog first (each reference image is
        embedded once per embedder, ever), so a search always sees every reference.
        """
        if (text is None) == (image is None):
            raise InvalidInputError("query", "give exactly one of a text query or an image")
        if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= 1000:
            raise InvalidInputError("k", f"must be an integer in 1..1000, not {k!r}")
        query = None if image is None else load_image(image, limits=self.limits, name=source_label(image))
        return self.retrieval.search(
            text=text, image=query, k=k, namespace=self._ns(namespace), where=where, restrict_to=restrict_to
        )

    def index(self, *, rebuild: bool = False, namespace: str | None = None) -> IndexReport:
        """Bring the retrieval index up to date (``rebuild``: from the store, from scratch)."""
        return self.retrieval.sync(self._ns(namespace), rebuild=rebuild)

    # -- judging ---------------------------------------------------------------------------
    def compare(
        self, candidate: ImageSource, *, criteria: Any, ref_ids: Sequence[str] = (), top_k: int | None = None,
        query: str | None = None, use_cache: bool = True, force_vlm: bool = False,
        attributes: Sequence[str] = ("imagenet",), evidence_max_chars: int | None = None,
        model: str | None = None, namespace: str | None = None,
    ) -> CompareResult:
        """Judge ``candidate`` against references, criterion by criterion.

        References are ``ref_ids``, or the ``top_k`` recalled by retrieval (by the candidate
        image, or by ``query`` text; within ``ref_ids`` when both are given). The candidate
        is encoded once (memory only); references come from their durable packages
        (``use_cache=False`` sends every image as pixels: same verdicts, other timings).
        Criteria the attribute sidecars (``"imagenet"``, ``"vlm"``) settle are answered from
        them unless ``force_vlm``. ``evidence_max_chars`` bounds each evidence string.
        """
        from .judge import Judge, parse_rubric
        from .judge.sidecars import SIDECAR_SOURCES

        namespace = self._ns(namespace)
        rubric = parse_rubric(criteria)  # a bad rubric fails before any model work
        unknown = set(attributes) - set(SIDECAR_SOURCES)
        if unknown:
            raise InvalidInputError("attributes", f"unknown sources {sorted(unknown)}; use {', '.join(SIDECAR_SOURCES)}")
        backend, scope = self.backend(model), self.scope(namespace)
        timer = StageTimer()
        image = load_image(candidate, limits=self.limits, name=source_label(candidate))
        recalled: list[dict[str, Any]] = []
        if top_k is not None:
            with timer("retrieval"):
                found = self.retrieval.search(
                    text=query, image=None if query else image, k=top_k, namespace=namespace, restrict_to=ref_ids or None
                )
            recalled, ref_ids = [hit.to_dict() for hit in found.hits], found.ref_ids
        if not ref_ids:
            raise InvalidInputError("references", "no reference to compare with: give reference ids, or recall them with top_k")
        refs = [self.reference(r, namespace=namespace) for r in ref_ids]
        with timer("candidate_encode"):  # encoded once (memory only), shared by every reference's request
            candidate_visual = self.packages.visual(backend, image, use_cache=use_cache, scope=scope).item
        with timer("reference_load"):
            visuals = [self.packages.visual(backend, ref, use_cache=use_cache, scope=scope) for ref in refs]
        inputs = [v.item for v in visuals]
        ref_attrs: list[Any] = [None] * len(refs)
        candidate_attrs = None
        if attributes and not force_vlm:
            with timer("attributes"):
                ref_attrs, candidate_attrs = self._sidecar_records().records(
                    [(ref.image_sha256, item, partial(self.reference_image, ref)) for ref, item in zip(refs, inputs)],
                    image, candidate_visual, attributes, backend,
                )
        options = {} if evidence_max_chars is None else {"evidence_max_chars": evidence_max_chars}
        judge = Judge(backend, force_vlm=force_vlm, **options)
        with timer("generate"):
            results = judge.judge(
                [(ref.ref_id, item, attrs) for ref, item, attrs in zip(refs, inputs, ref_attrs)],
                candidate_visual, rubric, candidate_attrs=candidate_attrs,
            )
        return CompareResult(
            candidate_sha256=image.sha256,
            model=backend.name,
            random_weights=bool(backend.random_weights),
            results=[{**result.to_dict(), "reference_cached": v.cached} for result, v in zip(results, visuals)],
            timings_ms=timer.done(),
            recalled=recalled,
            vlm_calls=judge.vlm_calls,
        )

    def _sidecar_records(self):
        if self._sidecars is None:
            from .judge.sidecars import SidecarRecords

            self._sidecars = SidecarRecords(self.store.root)
        return self._sidecars

    # -- maintenance -------------------------------------------------------------------
    def stats(self, *, namespace: str | None = None, tenant_view: bool = False, all_namespaces: bool = False) -> StoreStats:
        """Cache statistics (``tenant_view``: only the namespace's packages, no store-wide counters;
        ``all_namespaces``: references counted across every namespace)."""
        return self.maintenance.stats(namespace=None if all_namespaces else self._ns(namespace), tenant_view=tenant_view)

    def verify(self, *, repair: bool = False, model: str | None = None) -> VerifyReport:
        """Check every package; with ``repair``, re-encode corrupt ones from the kept images with ``model``."""
        return self.maintenance.verify(repair=repair, backend=lambda: self.backend(model))

    def check_drift(
        self, sample: int, *, model: str | None = None, namespace: str | None = None, seed: int = 0,
        threshold: float | None = None,
    ) -> DriftReport:
        """Re-encode ``sample`` random references with today's runtime and compare with the stored packages."""
        namespace = self._ns(namespace)
        return self.maintenance.drift(
            self.backend(model), namespace=namespace, scope=self.scope(namespace), sample=sample, seed=seed,
            threshold=threshold,
        )

    def reencode(self, *, model: str | None = None, namespace: str | None = None) -> Iterator[AddResult]:
        """Encode every reference of the namespace for ``model`` (packages already there are skipped)."""
        namespace = self._ns(namespace)
        return self.maintenance.reencode(backend=self.backend(model), namespace=namespace, scope=self.scope(namespace))

    def gc(self, **options: Any) -> dict[str, int]:
        """Remove what interrupted writes left in the store (see :meth:`refsight.store.Store.gc`); returns counts."""
        return self.store.gc(**options)

    def _progress_bar(self, total: int, description: str) -> AbstractContextManager[Any]:
        return progress_bar(total, description, enabled=self.progress)

