"""The :class:`Engine`: the one place that ties store, backend, retrieval and judge together.

Everything user-facing (CLI, HTTP server) goes through it. The engine owns the
cache policy: a reference's package is looked up by key, served from the store on
a hit (no encoder runs), re-encoded from the kept image bytes on a miss or when
the stored copy is corrupt, and counted either way.
"""

from __future__ import annotations

import re
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from .config import default_model, default_store_dir
from .errors import CorruptPackageError, InvalidInputError, RefsightError
from .images import ImageInput, ImageSource, IntakeLimits, load_image
from .locks import KeyedLocks
from .package import EncoderFingerprint, VisualPackage, package_key
from .results import AddFailure, AddResult, CompareResult, GenerateResult, VerifyReport
from .store.base import DEFAULT_NAMESPACE, Reference, ReferenceRow, validate_ref_id

__all__ = [
    "Engine",
    "ReferenceSegment",
    "AddResult",
    "AddFailure",
    "VerifyReport",
    "GenerateResult",
    "CompareResult",
]


@dataclass(frozen=True)
class ReferenceSegment:
    """A prompt segment naming a stored reference by id (its package is looked up)."""

    ref_id: str


#: Package keys are content-addressed and the same in every engine of a process (tenants
#: share one store), so one lock table serves them all: an image is encoded once.
_PACKAGE_LOCKS = KeyedLocks()


class Engine:
    """Store + backend + retrieval + judge behind one object.

    ``store`` is a directory (default: ``$REFSIGHT_STORE`` or the user cache dir) or an
    open :class:`~refsight.store.Store`; ``model`` a registered model name (default:
    ``$REFSIGHT_MODEL`` or ``tiny-qwen2-vl``). The backend loads on first use, and so
    does ``embedder``, the retrieval embedder (default: EfficientNet-Lite0 + MiniLM).
    """

    def __init__(
        self,
        store: Any = None,
        *,
        model: str | None = None,
        namespace: str = DEFAULT_NAMESPACE,
        limits: IntakeLimits = IntakeLimits(),
        memory_bytes: int | None = None,
        progress: bool = False,
        embedder: Any = None,
        backend_options: "BackendOptions | None" = None,
    ) -> None:
        from .backends.options import BackendOptions
        from .store import Store, open_store

        # An engine closes only a store it opened itself (tenants share one store).
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
        self._backends: dict[str, Any] = {}
        # Loaded on first use: the attribute sidecars, the retriever.
        self._attrs = None
        self._retriever = None
        #: what the last index sync did (a :class:`~refsight.retrieval.catalog_sync.SyncReport`)
        self.last_sync = None
        self._embedder = embedder
        self.backend_options = backend_options or BackendOptions()

    # -- lifecycle ---------------------------------------------------------------
    def close(self) -> None:
        """Close what this engine opened (backends stay cached in the registry for reuse)."""
        if self._attrs is not None:
            self._attrs.close()
            self._attrs = None
        if self._retriever is not None:
            self._retriever.close()
            self._retriever = None
        if self._owns_store:
            self.store.close()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def backend(self, model: str | None = None):
        """The backend for ``model`` (default: the engine's model), loaded once."""
        from .backends.registry import get_backend

        name = model or self.model
        if name not in self._backends:
            self._backends[name] = get_backend(name, **self.backend_options.as_kwargs())
        return self._backends[name]

    # -- references ------------------------------------------------------------------
    def add(
        self,
        source: ImageSource,
        *,
        ref_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        model: str | None = None,
    ) -> AddResult:
        """Add one reference image and make sure its package exists; raises on bad input."""
        result = next(iter(self.add_many([source], ids=[ref_id], metadata=metadata, model=model)))
        if isinstance(result, AddFailure):
            raise InvalidInputError(result.input, result.error)
        return result

    def add_many(
        self,
        sources: Sequence[ImageSource],
        *,
        ids: Sequence[str | None] | None = None,
        metadata: Mapping[str, Any] | None = None,
        model: str | None = None,
    ) -> Iterator[AddResult | AddFailure]:
        """Add references, one result per input in order; a bad input fails alone.

        Images are decoded and checked first, then encoded in batches of the
        backend's ``batch_size`` (images already encoded for this fingerprint skip
        the encoder entirely), then linked to their reference ids.
        """
        ids = list(ids) if ids is not None else [None] * len(sources)
        if len(ids) != len(sources):
            raise InvalidInputError("ids", f"{len(ids)} ids for {len(sources)} images")
        meta = _validate_metadata(metadata or {})
        backend = self.backend(model)
        fingerprint = backend.fingerprint()
        batch: list[tuple[int, str, ImageInput]] = []
        done: dict[int, AddResult | AddFailure] = {}
        next_index = 0

        def flush_ready() -> Iterator[AddResult | AddFailure]:
            # Results come out in input order, whatever order batches finish in.
            nonlocal next_index
            while next_index in done:
                yield done.pop(next_index)
                next_index += 1

        def store(batch) -> None:
            results = self._store_batch(batch, meta, backend, fingerprint)
            for (index, _, _), result in zip(batch, results):
                done[index] = result
            bar.update(len(batch))

        with self._progress_bar(len(sources), "adding") as bar:
            for index, (source, ref_id) in enumerate(zip(sources, ids)):
                try:
                    image = load_image(source, limits=self.limits, name=_label(source))
                    ref_id = self._choose_ref_id(ref_id, source, image)
                except RefsightError as e:
                    done[index] = AddFailure(input=_label(source), error=str(e))
                    bar.update(1)
                else:
                    batch.append((index, ref_id, image))
                    if len(batch) >= backend.batch_size:
                        store(batch)
                        batch = []
                yield from flush_ready()
            if batch:
                store(batch)
            yield from flush_ready()

    def _store_batch(self, batch, meta, backend, fingerprint: EncoderFingerprint) -> Iterator[AddResult | AddFailure]:
        catalog, packages = self.store.catalog, self.store.packages
        keys = [package_key(image.sha256, fingerprint) for _, _, image in batch]
        # Encode each distinct missing image once, in one batched call.
        images_by_key = {key: image for key, (_, _, image) in zip(keys, batch)}
        encoded: dict[str, VisualPackage] = {}
        with ExitStack() as held:
            # Sorted, so two batches that share keys never wait on each other in a cycle.
            for key in sorted(k for k in images_by_key if not packages.contains(k)):
                held.enter_context(_PACKAGE_LOCKS.hold(key))
                if not packages.contains(key):  # another thread may have stored it meanwhile
                    encoded[key] = None
            if encoded:
                for key, package in zip(list(encoded), backend.encode([images_by_key[k] for k in encoded])):
                    packages.put(package)
                    encoded[key] = package
        for key, (_, ref_id, image) in zip(keys, batch):
            try:
                # Bytes and package land before the reference row that points at them,
                # so a crash never leaves a reference without its image or package.
                catalog.put_image(image.sha256, image.source_bytes, image.source_format)
                catalog.add_reference(ref_id, image.sha256, meta, namespace=self.namespace)
                catalog.link_package(ref_id, fingerprint.digest, key, namespace=self.namespace)
            except RefsightError as e:
                yield AddFailure(input=image.name or ref_id, error=str(e))
                continue
            if key in encoded:
                package = encoded.pop(key)
                catalog.bump(misses=1)
                yield AddResult(
                    ref_id, image.sha256, key, backend.name, False, round(package.encode_ms, 3), package.nbytes
                )
            else:
                record = self.store.local.record(key)
                catalog.bump(hits=1, encode_ms_saved=record.encode_ms)
                yield AddResult(ref_id, image.sha256, key, backend.name, True, 0.0, record.bytes)

    def _choose_ref_id(self, ref_id: str | None, source: object, image: ImageInput) -> str:
        if ref_id is not None:
            return validate_ref_id(ref_id)
        base = _id_from_source(source) or image.sha256[:16]
        try:
            existing = self.store.catalog.get_reference(base, namespace=self.namespace)
        except RefsightError:
            return base
        # A derived id never overwrites another image: add a hash suffix instead.
        return base if existing.image_sha256 == image.sha256 else f"{base}-{image.sha256[:8]}"

    def references(self) -> list[Reference]:
        """All references in this engine's namespace, oldest first."""
        return self.store.catalog.list_references(namespace=self.namespace)

    def reference(self, ref_id: str) -> Reference:
        """One reference; raises ReferenceNotFoundError."""
        return self.store.catalog.get_reference(validate_ref_id(ref_id), namespace=self.namespace)

    def remove(self, ref_id: str) -> Reference:
        """Remove a reference and every package no other reference uses."""
        ref, orphaned = self.store.catalog.remove_reference(validate_ref_id(ref_id), namespace=self.namespace)
        for key in orphaned:
            self.store.packages.delete(key)
        self._unindex(ref.ref_id)
        return ref

    def _unindex(self, ref_id: str) -> None:
        # The index must never point at a removed reference. Dropping the live entry is
        # enough and needs no model: every index answer is checked against live entries.
        if self._retriever is not None:
            self._retriever.remove(ref_id, namespace=self.namespace)
            return
        database = self.store.root / "retrieval" / "vectors.sqlite"
        if database.exists():
            from .retrieval.vectors import VectorDB

            vectors = VectorDB(database)
            try:
                vectors.delete_ref(self.namespace, ref_id)
            finally:
                vectors.close()

    # -- packages --------------------------------------------------------------------
    def package_for(
        self, ref: Reference, *, model: str | None = None, use_cache: bool = True
    ) -> tuple[VisualPackage | ImageInput, bool]:
        """The reference's package under ``model`` and whether it came from the cache.

        With ``use_cache=False`` the kept image itself is returned, so the backend
        encodes it fresh (the ``--no-cache`` path). A missing or corrupt package is
        re-encoded from the kept image bytes and stored again.
        """
        backend = self.backend(model)
        if not use_cache:
            return self.reference_image(ref), False
        fingerprint = backend.fingerprint()
        key = package_key(ref.image_sha256, fingerprint)
        with _PACKAGE_LOCKS.hold(key):
            package = self._stored_package(key)
            if package is not None:
                return package, True
            package = backend.encode([self.reference_image(ref)])[0]
            self.store.packages.put(package)
            self.store.catalog.link_package(ref.ref_id, fingerprint.digest, key, namespace=ref.namespace)
            self.store.catalog.bump(misses=1)
            return package, False

    def _stored_package(self, key: str) -> VisualPackage | None:
        """The stored package under ``key`` (a hit is counted), or None when absent or corrupt."""
        try:
            package = self.store.packages.get(key)
        except CorruptPackageError:
            # Never serve a corrupt package: drop it, so the caller re-encodes.
            self.store.packages.delete(key)
            return None
        if package is not None:
            self.store.catalog.bump(hits=1, encode_ms_saved=package.encode_ms)
        return package

    def reference_image(self, ref: Reference | ReferenceRow) -> ImageInput:
        """The reference's image, decoded from its kept original bytes."""
        data = self.store.catalog.get_image(ref.image_sha256)
        return load_image(data, limits=self.limits, name=f"reference {ref.ref_id}")

    # -- generation ------------------------------------------------------------------
    def generate(
        self,
        prompt: str,
        *,
        ref_ids: Sequence[str] = (),
        candidate: ImageSource | None = None,
        use_cache: bool = True,
        max_new_tokens: int = 64,
        model: str | None = None,
    ) -> GenerateResult:
        """Generate from references (cached packages unless ``use_cache=False``) plus an optional fresh candidate."""
        if not prompt or not prompt.strip():
            raise InvalidInputError("prompt", "the prompt is empty")
        segments: list[Any] = []
        for i, ref_id in enumerate(ref_ids, 1):
            segments += [f"Reference {i} ({ref_id}):", ReferenceSegment(ref_id)]
        if candidate is not None:
            # Loaded here: in chat() a plain string is text, so a path must not reach it as one.
            segments += ["Candidate:", load_image(candidate, limits=self.limits, name=_label(candidate))]
        segments.append(prompt)
        return self.chat(segments, use_cache=use_cache, max_new_tokens=max_new_tokens, model=model)

    def chat(
        self,
        segments: Sequence[Any],
        *,
        use_cache: bool = True,
        max_new_tokens: int = 64,
        json_schema: dict[str, Any] | None = None,
        model: str | None = None,
    ) -> GenerateResult:
        """Generate from segments in order: text (``str``), :class:`ReferenceSegment` (a
        stored reference by id), or an image (``Path``, bytes, PIL image, ImageInput).

        References come from their cached packages; an image source whose package
        is already stored (a reference's image sent again as bytes) is served from
        the store too, transparently; other images are encoded fresh.
        ``references_cached`` has one flag per image segment, in order.
        """
        from .backends.base import GenerationRequest

        backend = self.backend(model)
        start = time.perf_counter()
        resolved: list[Any] = []
        cached: list[bool] = []
        for segment in segments:
            if isinstance(segment, str):
                resolved.append(segment)
                continue
            if isinstance(segment, ReferenceSegment):
                item, hit = self.package_for(self.reference(segment.ref_id), model=model, use_cache=use_cache)
            else:
                item, hit = self._image_segment(segment, backend, use_cache)
            resolved.append(item)
            cached.append(hit)
        load_ms = (time.perf_counter() - start) * 1000
        request = GenerationRequest(segments=resolved, max_new_tokens=max_new_tokens, json_schema=json_schema)
        generation = backend.generate([request])[0]
        timings = {"reference_load": round(load_ms, 3), **{k: round(v, 3) for k, v in generation.timings_ms.items()}}
        timings["total"] = round((time.perf_counter() - start) * 1000, 3)
        return GenerateResult(
            text=generation.text,
            tokens=list(generation.token_ids),
            model=backend.name,
            random_weights=bool(generation.random_weights or backend.random_weights),
            references_cached=cached,
            timings_ms=timings,
        )

    def _image_segment(self, source: Any, backend, use_cache: bool) -> tuple[VisualPackage | ImageInput, bool]:
        image = load_image(source, limits=self.limits, name=_label(source))
        if use_cache:
            package = self._stored_package(package_key(image.sha256, backend.fingerprint()))
            if package is not None:
                return package, True
        return image, False

    # -- retrieval -------------------------------------------------------------------------
    def search(
        self,
        text: str | None = None,
        *,
        image: ImageSource | None = None,
        k: int = 10,
        where: Mapping[str, Any] | None = None,
        restrict_to: Sequence[str] | None = None,
    ) -> dict[str, Any]:
        """Recall the ``k`` references best matching ``text`` or ``image``.

        Returns ``{"embedder", "results": [{"ref_id", "score"}]}``, best first. The
        index is brought up to date with the catalog first (each image is embedded
        once per embedder, ever), so a search always sees every reference.
        ``restrict_to`` limits the results to those reference ids.
        """
        if (text is None) == (image is None):
            raise InvalidInputError("query", "give exactly one of a text query or an image")
        if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= 1000:
            raise InvalidInputError("k", f"must be an integer in 1..1000, not {k!r}")
        retriever = self.sync_index()
        scope = {"where": where, "namespace": self.namespace, "ref_ids": restrict_to or None}
        if text is not None:
            hits = retriever.search_text(text, k=k, **scope)
        else:
            query = load_image(image, limits=self.limits, name=_label(image))
            hits = retriever.search_image(query, k=k, **scope)
        return {
            "embedder": retriever.embedder_name,
            "results": [{"ref_id": ref_id, "score": round(float(score), 6)} for ref_id, score in hits],
        }

    def sync_index(self, *, rebuild: bool = False):
        """The retriever, its index holding exactly this namespace's references.

        Costs O(changes since the last sync): references added or changed are decoded and
        embedded in batches (vectors are cached per image), removed ones are dropped, and
        with no change it only compares two revisions. ``rebuild`` reconstructs the
        entries and index files from the catalog (see :mod:`refsight.retrieval.catalog_sync`).
        """
        from .retrieval.catalog_sync import sync_with_catalog

        retriever = self.retriever()
        self.last_sync = sync_with_catalog(
            retriever,
            self.store.catalog,
            self.namespace,
            self.reference_image,
            rebuild=rebuild,
            progress_bar=lambda total: self._progress_bar(total, "indexing"),
        )
        return retriever

    def retriever(self):
        """The retriever over this store with the engine's embedder (default: EfficientNet-Lite0 + MiniLM)."""
        if self._retriever is None:
            from .retrieval import Retriever, default_embedder

            self._retriever = Retriever(self.store.root, self._embedder or default_embedder())
        return self._retriever

    # -- judging ---------------------------------------------------------------------------
    def compare(
        self,
        candidate: ImageSource,
        *,
        criteria: Any,
        ref_ids: Sequence[str] = (),
        top_k: int | None = None,
        query: str | None = None,
        use_cache: bool = True,
        force_vlm: bool = False,
        attributes: Sequence[str] = ("imagenet",),
        evidence_max_chars: int | None = None,
        model: str | None = None,
    ) -> CompareResult:
        """Judge ``candidate`` against references, criterion by criterion.

        References are ``ref_ids``, or the ``top_k`` recalled by retrieval (by the
        candidate image, or by ``query`` text when given; within ``ref_ids`` when both
        are given). The candidate is encoded once; references come from their cached
        packages (``use_cache=False`` re-encodes them: same verdicts, other timings).
        Criteria the attribute sidecars (``attributes``: ``"imagenet"``, ``"vlm"``) can
        settle are answered from them unless ``force_vlm``. ``evidence_max_chars`` bounds
        each evidence string (and so the generation budget).
        """
        from .judge import Judge, parse_rubric
        from .judge.sidecars import SIDECAR_SOURCES

        rubric = parse_rubric(criteria)  # a bad rubric fails before any model work
        backend = self.backend(model)
        unknown = set(attributes) - set(SIDECAR_SOURCES)
        if unknown:
            raise InvalidInputError(
                "attributes", f"unknown attribute sources {sorted(unknown)}; use {', '.join(SIDECAR_SOURCES)}"
            )
        timings: dict[str, float] = {}
        start = time.perf_counter()
        image = load_image(candidate, limits=self.limits, name=_label(candidate))

        recalled: list[dict[str, Any]] = []
        if top_k is not None:
            clock = time.perf_counter()
            found = self.search(query, image=None if query else image, k=top_k, restrict_to=ref_ids or None)
            recalled = found["results"]
            ref_ids = [hit["ref_id"] for hit in recalled]
            timings["retrieval"] = _ms(clock)
        if not ref_ids:
            raise InvalidInputError("references", "no reference to compare with: name --ref IDs or use --top-k")
        refs = [self.reference(r) for r in ref_ids]

        clock = time.perf_counter()
        # Encoded once, then shared by every reference's request.
        candidate_package = self._candidate_package(image, backend, use_cache)
        timings["candidate_encode"] = _ms(clock)

        clock = time.perf_counter()
        visuals = [self.package_for(ref, model=model, use_cache=use_cache) for ref in refs]
        timings["reference_load"] = _ms(clock)

        ref_attrs: list[Any] = [None] * len(refs)
        candidate_attrs = None
        if attributes and not force_vlm:
            clock = time.perf_counter()
            ref_attrs, candidate_attrs = self._sidecars().records(
                [
                    (ref.image_sha256, visual, partial(self.reference_image, ref))
                    for ref, (visual, _) in zip(refs, visuals)
                ],
                image,
                candidate_package,
                attributes,
                backend,
            )
            timings["attributes"] = _ms(clock)

        clock = time.perf_counter()
        options = {} if evidence_max_chars is None else {"evidence_max_chars": evidence_max_chars}
        judge = Judge(backend, force_vlm=force_vlm, **options)
        results = judge.judge(
            [(ref.ref_id, visual, attrs) for ref, (visual, _), attrs in zip(refs, visuals, ref_attrs)],
            candidate_package,
            rubric,
            candidate_attrs=candidate_attrs,
        )
        timings["generate"] = _ms(clock)
        timings["total"] = _ms(start)
        return CompareResult(
            candidate_sha256=image.sha256,
            model=backend.name,
            random_weights=bool(backend.random_weights),
            results=[{**result.to_dict(), "reference_cached": cached} for result, (_, cached) in zip(results, visuals)],
            timings_ms=timings,
            recalled=recalled,
            vlm_calls=judge.vlm_calls,
        )

    def _candidate_package(self, image: ImageInput, backend, use_cache: bool) -> VisualPackage:
        """The candidate's package: from the store when seen before, else encoded once.

        A fresh candidate's package goes to the memory tier only (bounded, evicted
        by LRU), never to disk: candidates are not references. The per-key lock
        makes concurrent compares of the same new candidate encode it once.
        """
        if not use_cache:
            return backend.encode([image])[0]
        key = package_key(image.sha256, backend.fingerprint())
        with _PACKAGE_LOCKS.hold(key):
            package = self._stored_package(key)
            if package is not None:
                return package
            package = backend.encode([image])[0]
            self.store.memory.put(package)
            self.store.catalog.bump(misses=1)
            return package

    def _sidecars(self):
        if self._attrs is None:
            from .judge.sidecars import SidecarRecords

            self._attrs = SidecarRecords(self.store.root)
        return self._attrs

    # -- maintenance -------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """``{"references", "packages", "bytes", "hits", "misses", "evictions", "encode_ms_saved"}``."""
        counters = self.store.catalog.counters()
        local = self.store.local.stats()
        return {
            "references": self.store.catalog.count_references(namespace=self.namespace),
            "packages": local["packages"],
            "bytes": local["bytes"],
            "hits": int(counters.get("hits", 0)),
            "misses": int(counters.get("misses", 0)),
            "evictions": int(counters.get("evictions", 0)),
            "encode_ms_saved": round(float(counters.get("encode_ms_saved", 0.0)), 3),
        }

    def verify(self, *, repair: bool = False, model: str | None = None) -> VerifyReport:
        """Check every package (checksum, shapes, dtypes); with ``repair``, re-encode corrupt ones.

        Repair re-encodes from the kept image with ``model`` (default: the engine's
        model); a corrupt package made by another model is reported as unrepairable
        with the reason, and is never served.
        """
        report = VerifyReport()
        local = self.store.local
        for key, problem in local.verify_all():
            report.checked += 1
            if problem is None:
                continue
            report.corrupt.append(key)
            if repair:
                reason = self._repair(key, model)
                if reason is None:
                    report.repaired.append(key)
                else:
                    report.unrepairable[key] = reason
        return report

    def _repair(self, key: str, model: str | None) -> str | None:
        record = self.store.local.record(key)
        backend = self.backend(model)
        if record.fingerprint_digest != backend.fingerprint().digest:
            made_by = record.fingerprint.model_id
            return f"made by another encoder ({made_by}); run verify --repair --model for that model"
        try:
            data = self.store.catalog.get_image(record.image_sha256)
        except RefsightError:
            return "its original image is no longer kept"
        package = backend.encode([load_image(data, limits=self.limits, name=f"image {record.image_sha256[:12]}")])[0]
        # Delete first: put() is idempotent and would otherwise keep the corrupt file.
        self.store.packages.delete(key)
        self.store.packages.put(package)
        return None

    def reencode(self, *, model: str | None = None) -> Iterator[AddResult]:
        """Encode every reference for ``model`` (packages already there are skipped)."""
        backend = self.backend(model)
        fingerprint = backend.fingerprint()
        refs = self.references()
        with self._progress_bar(len(refs), f"encoding for {backend.name}") as bar:
            for ref in refs:
                key = package_key(ref.image_sha256, fingerprint)
                cached = self.store.packages.contains(key)
                if cached:
                    self.store.catalog.link_package(ref.ref_id, fingerprint.digest, key, namespace=ref.namespace)
                    record = self.store.local.record(key)
                    yield AddResult(ref.ref_id, ref.image_sha256, key, backend.name, True, 0.0, record.bytes)
                else:
                    package, _ = self.package_for(ref, model=model)
                    yield AddResult(
                        ref.ref_id,
                        ref.image_sha256,
                        key,
                        backend.name,
                        False,
                        round(package.encode_ms, 3),
                        package.nbytes,
                    )
                bar.update(1)

    @contextmanager
    def _progress_bar(self, total: int, description: str):
        from tqdm import tqdm

        # Only worth a bar for several images; it goes to stderr so --json stays clean.
        with tqdm(
            total=total, desc=description, unit="img", disable=not self.progress or total < 2, leave=False
        ) as bar:
            yield bar


def _ms(since: float) -> float:
    return round((time.perf_counter() - since) * 1000, 3)


_UNSAFE = re.compile(r"[^A-Za-z0-9._@+=-]+")


def _id_from_source(source: object) -> str | None:
    if isinstance(source, (str, Path)):
        stem = _UNSAFE.sub("-", Path(source).stem).replace("..", ".").lstrip("._@+=-")[:100]
        return stem or None
    return None


def _label(source: object) -> str:
    if isinstance(source, (str, Path)):
        return str(source)
    if isinstance(source, (bytes, bytearray, memoryview)):
        return f"<{len(source)} bytes>"
    return getattr(source, "name", None) or type(source).__name__


def _validate_metadata(metadata: Mapping[str, Any]) -> dict[str, Any]:
    import json

    if not isinstance(metadata, Mapping):
        raise InvalidInputError("metadata", "metadata must be a mapping of keys to values")
    for key in metadata:
        if not isinstance(key, str) or not key or len(key) > 128:
            raise InvalidInputError(f"metadata key {key!r}", "keys are non-empty strings of at most 128 characters")
    try:
        text = json.dumps(dict(metadata))
    except (TypeError, ValueError) as e:
        raise InvalidInputError("metadata", f"not JSON-serialisable: {e}") from None
    if len(text) > 64 * 1024:
        raise InvalidInputError("metadata", "larger than 64 KiB")
    return dict(metadata)
