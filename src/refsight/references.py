"""References: ingest (batched, encode once), look-ups, and removal with listeners.

:class:`ReferenceBook` is what users name: reference ids in namespaces, their metadata
and kept images. Adding a reference decodes and checks the image, gets its durable
package from the :class:`~refsight.cache.packages.PackageCache` (images are encoded in batches
of the backend's ``batch_size``; known ones skip the encoder), then records the kept
bytes, the reference and its package link in ONE catalog transaction. Removing a
reference notifies listeners (the retrieval index drops its entry), so nothing here
knows where derived data lives.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

from .backends.base import Backend
from .backends.fingerprint_record import EncoderFacts, facts_of
from .backends.prefix import reusable_prefix
from .context import RequestContext
from .errors import InvalidInputError, ReferenceNotFoundError, RefsightError, StoreUnavailableError
from .inputs.images import ImageInput, ImageSource, IntakeLimits, load_image, source_label
from .package import VisualPackage
from .cache.packages import CachedPackage, PackageCache
from .results import AddFailure, AddResult
from .inputs.ref_ids import validate_ref_id
from .store import Catalog, Reference, Store
from .store.disk import StoredPackage
from .inputs.text import check_texts

__all__ = ["IngestHook", "ReferenceBook", "ReferenceSegment", "ResolvedSegments", "RemovalListener", "load_kept_image", "validate_metadata"]

class ResolvedSegments(NamedTuple):
    """A prompt's segments as a backend takes them (:meth:`ReferenceBook.resolve_segments`)."""

    #: Text, packages (or, with ``use_cache=False``, pixels).
    segments: list[Any]
    #: One flag per image: no encoder ran for it now.
    cached: list[bool]
    #: Encoder time spent on them (ms).
    encode_ms: float
    #: How many leading segments form the reusable reference prefix (``GenerationRequest.prefix_segments``).
    prefix_segments: int


@dataclass(frozen=True)
class ReferenceSegment:
    """A prompt segment naming a stored reference by id (its package is looked up, never re-encoded)."""

    ref_id: str


#: Called as ``listener(namespace, ref_id)`` after a reference is removed.
RemovalListener = Callable[[str, str], None]
#: Called with ``[(image, package), ...]`` of the references a batch just stored (e.g. attribute records); the
#: package is None for one linked without building its tensors (only for a hook that reads no packages).
IngestHook = Callable[[list[tuple[ImageInput, "VisualPackage | None"]]], None]
#: Opens a progress bar: ``progress(total, description)`` → a context manager with ``update(n)``.
ProgressFactory = Callable[[int, str], AbstractContextManager[Any]]

_UNSAFE = re.compile(r"[^A-Za-z0-9._@+=-]+")
#: Largest metadata object a reference may carry, as JSON.
MAX_METADATA_BYTES = 64 * 1024


class ReferenceBook:
    """The references of one store (every namespace); every method names its namespace."""

    def __init__(self, store: Store, packages: PackageCache, limits: IntakeLimits, progress: ProgressFactory) -> None:
        self.store = store
        self.packages = packages
        self.limits = limits
        self._progress = progress
        self._listeners: list[RemovalListener] = []

    def on_remove(self, listener: RemovalListener) -> None:
        """Call ``listener(namespace, ref_id)`` after every removal."""
        self._listeners.append(listener)

    # -- ingest ---------------------------------------------------------------------------
    def add_many(
        self,
        sources: Sequence[ImageSource],
        *,
        ids: Sequence[str | None] | None,
        metadata: Mapping[str, Any] | None,
        context: RequestContext,
        after_batch: IngestHook | None = None,
        hook_reads_packages: bool = True,
    ) -> Iterator[AddResult | AddFailure]:
        """Add references, one result per input in input order; a bad input fails alone, storing nothing.

        ``after_batch`` (the ingest hook) is called with ``(image, package)`` of each batch's stored
        references once they are committed, before their results are yielded; with
        ``hook_reads_packages=False`` (it reads the images only), a package already on disk is linked
        without loading the model and handed over as None. The references go to the context's
        namespace, their packages under its model and scope.
        """
        ids = list(ids) if ids is not None else [None] * len(sources)
        if len(ids) != len(sources):
            raise InvalidInputError("ids", f"{len(ids)} ids for {len(sources)} images")
        meta = validate_metadata(metadata or {})
        # Known without a load when recorded (a cached add never loads the model); else the load tells.
        batch_size = (context.known_facts() or facts_of(context.backend())).batch_size
        results = _InOrder()
        batch: list[tuple[int, str, ImageInput]] = []
        tensors = after_batch is not None and hook_reads_packages
        with self._progress(len(sources), "adding") as bar:
            flush = partial(self._flush, meta=meta, context=context, after_batch=after_batch, tensors=tensors,
                            results=results, bar=bar)
            for index, (source, ref_id) in enumerate(zip(sources, ids)):
                taken = self._take_in(source, ref_id, context.namespace)
                if isinstance(taken, AddFailure):
                    results.put(index, taken)
                    bar.update(1)
                else:
                    batch.append((index, *taken))
                    if len(batch) >= batch_size:
                        flush(batch)
                yield from results.ready()
            if batch:
                flush(batch)
            yield from results.ready()

    def _take_in(self, source: ImageSource, ref_id: str | None, namespace: str) -> tuple[str, ImageInput] | AddFailure:
        """``(id, decoded image)`` of one input, or the AddFailure that says why it cannot be added."""
        try:
            image = load_image(source, limits=self.limits)
            return self._choose_id(ref_id, source, image, namespace), image
        except StoreUnavailableError:
            raise  # the store, not this input: the whole request fails (503), nothing half-done
        except RefsightError as e:
            return AddFailure(input=source_label(source), error=str(e))

    def _flush(
        self, batch: list[tuple[int, str, ImageInput]], *, meta: dict[str, Any], context: RequestContext,
        after_batch: IngestHook | None, tensors: bool, results: _InOrder, bar: Any,
    ) -> None:
        """Store one batch, run the ingest hook over what it stored, and hand its results over."""
        stored = self._store_batch(batch, meta, context, tensors=tensors)
        for (index, _, _), (result, _) in zip(batch, stored):
            results.put(index, result)
        added = [(image, package) for (_, _, image), (result, package) in zip(batch, stored) if isinstance(result, AddResult)]
        if after_batch is not None and added:
            after_batch(added)
        bar.update(len(batch))
        batch.clear()

    def _store_batch(
        self, batch: list[tuple[int, str, ImageInput]], meta: dict[str, Any], context: RequestContext, *, tensors: bool
    ) -> list[tuple[AddResult | AddFailure, VisualPackage | None]]:
        """Each input's result (and package, when ``tensors`` or encoded now), in batch order.

        Without ``tensors`` (no ingest hook reads them), images whose package is already on disk are
        linked without loading the model when its fingerprint is known without a load; only the
        others go to the model (loaded then, as before).
        """
        with self.packages.request():  # the batch's packages stay pinned until linked
            linked = {} if tensors else self._link_stored(batch, meta, context)
            rest = [item for item in batch if item[0] not in linked]
            # Only a batch with something left to encode (or to load as tensors) needs the model.
            done = dict(zip((index for index, _, _ in rest), self._store_pinned(rest, meta, context))) if rest else {}
            return [linked.get(index) or done[index] for index, _, _ in batch]

    def _link_stored(
        self, batch: list[tuple[int, str, ImageInput]], meta: dict[str, Any], context: RequestContext
    ) -> dict[int, tuple[AddResult | AddFailure, None]]:
        """The results of the inputs whose package is on disk, linked by the model's fingerprint as known without a
        load (:meth:`RequestContext.known_facts`); {} when it is not known so."""
        facts = context.known_facts()
        if facts is None:
            return {}
        linked: dict[int, tuple[AddResult | AddFailure, None]] = {}
        for index, ref_id, image in batch:
            found = self.packages.stored(context.package_key(image.sha256, facts.fingerprint))
            if found is not None:
                linked[index] = (self._record(ref_id, image, meta, context.namespace, facts, found, None), None)
        return linked

    def _store_pinned(
        self, batch: list[tuple[int, str, ImageInput]], meta: dict[str, Any], context: RequestContext
    ) -> list[tuple[AddResult | AddFailure, VisualPackage | None]]:
        packages: list[CachedPackage] = self.packages.durable(context, [image for _, _, image in batch])
        facts = facts_of(context.backend())
        results: list[tuple[AddResult | AddFailure, VisualPackage | None]] = []
        for (_, ref_id, image), found in zip(batch, packages):
            result = self._record(ref_id, image, meta, context.namespace, facts, found.package, found)
            results.append((result, found.package if isinstance(result, AddResult) else None))
        return results

    def _record(
        self, ref_id: str, image: ImageInput, meta: dict[str, Any], namespace: str, facts: EncoderFacts,
        package: VisualPackage | StoredPackage, found: CachedPackage | None,
    ) -> AddResult | AddFailure:
        """Record the kept bytes, the reference and its package link in one transaction; its result
        (``found``: how the package was obtained; None: a stored package, linked without the model)."""
        try:
            self.store.catalog.ingest_reference(
                ref_id, image.sha256, image.source_bytes, image.source_format, meta,
                namespace=namespace, link=(facts.fingerprint.digest, package.key),
            )
        except StoreUnavailableError:
            raise  # the store, not this input (a full disk, an unreachable catalog): 503
        except RefsightError as e:
            return AddFailure(input=image.name or ref_id, error=str(e))
        cached, encode_ms = (True, 0.0) if found is None else (found.cached, found.encode_ms)
        return AddResult(ref_id, image.sha256, package.key, facts.name, cached, round(encode_ms, 3), package.nbytes)

    def _choose_id(self, ref_id: str | None, source: object, image: ImageInput, namespace: str) -> str:
        return self.choose_id(ref_id, source, image.sha256, namespace)

    def choose_id(self, ref_id: str | None, source: object, image_sha256: str, namespace: str) -> str:
        """The id an image gets: ``ref_id`` when given (InvalidInputError if it names another image),
        else one derived from the source's file name (a hash suffix when that name is taken)."""
        if ref_id is not None:
            validate_ref_id(ref_id)
            existing = self._find(ref_id, namespace)
            if existing is not None and existing.image_sha256 != image_sha256:
                # Checked before any encode: a conflicting id must not leave a package behind.
                raise InvalidInputError(
                    ref_id, f"reference already exists with another image ({existing.image_sha256[:12]}…); "
                    "remove it first or pick another id",
                )
            return ref_id
        base = _id_from_source(source) or image_sha256[:16]
        existing = self._find(base, namespace)
        # A derived id never overwrites another image: add a hash suffix instead.
        return base if existing is None or existing.image_sha256 == image_sha256 else f"{base}-{image_sha256[:8]}"

    def find(self, ref_id: str, namespace: str) -> Reference | None:
        """The reference named ``ref_id`` in ``namespace``, or None."""
        return self._find(ref_id, namespace)

    def _find(self, ref_id: str, namespace: str) -> Reference | None:
        try:
            return self.store.catalog.get_reference(ref_id, namespace=namespace)
        except ReferenceNotFoundError:
            return None

    # -- look-ups -------------------------------------------------------------------------
    def get(self, ref_id: str, *, namespace: str) -> Reference:
        """One reference; raises ReferenceNotFoundError (also for another namespace's id)."""
        return self.store.catalog.get_reference(validate_ref_id(ref_id), namespace=namespace)

    def count(self, *, namespace: str) -> int:
        """How many references ``namespace`` holds."""
        return self.store.catalog.count_references(namespace=namespace)

    def list(self, *, namespace: str) -> list[Reference]:
        """Every reference of ``namespace``, oldest first."""
        return self.store.catalog.list_references(namespace=namespace)

    def image(self, ref: Reference) -> ImageInput:
        """The reference's image, decoded from its kept original bytes."""
        return self.kept_image(ref.image_sha256, label=f"reference {ref.ref_id}")

    def kept_bytes(self, ref: Reference) -> bytes:
        """The reference's kept original bytes, nothing decoded."""
        return self.store.catalog.get_image(ref.image_sha256)

    def kept_image(self, image_sha256: str, *, label: str | None = None) -> ImageInput:
        """A kept image by hash, decoded under the intake limits."""
        return load_kept_image(self.store.catalog, image_sha256, limits=self.limits, label=label)

    # -- a prompt's images ----------------------------------------------------------------------
    def named_references(self, segments: Sequence[Any], *, namespace: str) -> dict[str, Reference]:
        """The references a prompt names, by id, each read once: a mistyped name fails here, before any model work."""
        named = dict.fromkeys(s.ref_id for s in segments if isinstance(s, ReferenceSegment))  # in order, each once
        return {ref_id: self.get(ref_id, namespace=namespace) for ref_id in named}

    def decode_images(self, segments: Sequence[Any]) -> list[Any]:
        """``segments`` with each image sent inline decoded and checked against the intake limits (text and
        references as they are): a bad image is refused before any image of the prompt is encoded."""
        return [s if isinstance(s, (str, ReferenceSegment)) else load_image(s, limits=self.limits) for s in segments]

    def resolve_segments(
        self, context: RequestContext, backend: Backend, segments: Sequence[Any], named: Mapping[str, Reference]
    ) -> ResolvedSegments:
        """A prompt's segments ready for ``backend``: text stays, references (``named``: :meth:`named_references`) and
        images sent inline (decoded: :meth:`decode_images`) become packages (:meth:`PackageCache.served_prompt`:
        references durable, other images under the ``remember_images`` policy); ``use_cache=False`` keeps pixels.
        The reusable prefix runs through references and images whose package is durable, never through the
        prompt's last image when it was sent inline (the candidate's place)."""
        references, inline = _images_by_kind(segments, named)
        served = self.packages.served_prompt(context, backend, references, inline)
        served_references, served_inline = iter(served.references), iter(served.inline)
        visuals = {  # each image's place in the prompt: what serves it
            i: next(served_references) if isinstance(s, ReferenceSegment) else next(served_inline)
            for i, s in enumerate(segments) if not isinstance(s, str)
        }
        resolved = [visuals[i].item if i in visuals else s for i, s in enumerate(segments)]
        cached = [visual.cached for visual in visuals.values()]
        encode_ms = sum(visual.encode_ms for visual in visuals.values())
        # A prefix runs through references (with or without packages) and images whose package is durable, never
        # through the prompt's last image when it was sent inline: that is where clients put the image they ask about;
        # it changes between requests, so a prefix through it (once remembered) would key a state no later request
        # asks for and pass over the references' own state.
        last = max(visuals, default=None)
        through = [  # text as it is, each image as whether a prefix may run through it
            s if isinstance(s, str) else isinstance(s, ReferenceSegment) or (visuals[i].lasting and i != last)
            for i, s in enumerate(segments)
        ]
        return ResolvedSegments(resolved, cached, encode_ms, reusable_prefix(through, bool))

    # -- removal ----------------------------------------------------------------------------

    def remove(self, ref_id: str, *, namespace: str) -> Reference:
        """Remove a reference and the packages no other reference uses; listeners are told."""
        ref, orphaned = self.store.catalog.remove_reference(validate_ref_id(ref_id), namespace=namespace)
        for key in orphaned:
            self.store.packages.delete(key)
        for listener in self._listeners:
            listener(namespace, ref.ref_id)
        return ref


class _InOrder:
    """Results by input index, handed out in input order whatever order their batches finish in."""

    def __init__(self) -> None:
        self._done: dict[int, AddResult | AddFailure] = {}
        self._next = 0

    def put(self, index: int, result: AddResult | AddFailure) -> None:
        """Keep the result of input ``index``."""
        self._done[index] = result

    def ready(self) -> Iterator[AddResult | AddFailure]:
        """The results whose turn has come."""
        while self._next in self._done:
            yield self._done.pop(self._next)
            self._next += 1


def _images_by_kind(
    segments: Sequence[Any], named: Mapping[str, Reference]
) -> tuple[list[Reference], list[ImageInput]]:
    """A prompt's references (``named``: by id) and its images sent inline, each kind in prompt order."""
    references = [named[s.ref_id] for s in segments if isinstance(s, ReferenceSegment)]
    return references, [s for s in segments if isinstance(s, ImageInput)]


def load_kept_image(catalog: Catalog, image_sha256: str, *, limits: IntakeLimits, label: str | None = None) -> ImageInput:
    """The kept original bytes of an image, decoded under ``limits`` (what re-encoding starts from)."""
    data = catalog.get_image(image_sha256)
    return load_image(data, limits=limits, name=label or f"image {image_sha256[:12]}")


def validate_metadata(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """``metadata`` as a plain dict, or InvalidInputError naming the problem."""
    if not isinstance(metadata, Mapping):
        raise InvalidInputError("metadata", "metadata must be a mapping of keys to values")
    for key in metadata:
        if not isinstance(key, str) or not key or len(key) > 128:
            raise InvalidInputError(f"metadata key {key!r}", "keys are non-empty strings of at most 128 characters")
    check_texts(dict(metadata), "metadata")  # keys and values, nested ones too: stored text must encode
    try:
        text = json.dumps(dict(metadata))
    except (TypeError, ValueError, RecursionError) as e:
        raise InvalidInputError("metadata", f"not JSON-serialisable: {e}") from None
    if len(text) > MAX_METADATA_BYTES:
        raise InvalidInputError("metadata", f"larger than {MAX_METADATA_BYTES // 1024} KiB")
    return dict(metadata)


def _id_from_source(source: object) -> str | None:
    if isinstance(source, (str, Path)):
        stem = _UNSAFE.sub("-", Path(source).stem).replace("..", ".").lstrip("._@+=-")[:100]
        return stem or None
    return None
