"""The package cache: the ONE place where "take the package from the store, or encode it" happens.

Every visual package refsight uses goes through :class:`PackageCache`, under one policy:

- **Reference packages are durable.** A reference's package is served from the memory tier
  or the disk store; when absent (a new model) or corrupt (it is never served), it is
  encoded from the reference's kept image bytes, written to disk and linked to the
  reference. A package that is in memory only (the image was compared as a candidate
  before) is written to disk the moment it is needed as a reference, without encoding.
- **Candidate packages stay in memory.** A compared image is not a reference: its package
  goes to the bounded memory tier only, so it leaves nothing on disk.
- **Images sent inline follow the ``remember_images`` policy** (:mod:`refsight.settings.remembering`): a chat's
  image that is no named reference is a candidate, unless the policy remembers it (``recurring``: the
  second request of a namespace that sends it; ``all``: the first); then its package is made durable as a
  reference's is (written from the memory tier without encoding when it is there) and a row names the
  namespace (:mod:`refsight.store.remembered`). :meth:`PackageCache.served_prompt` says whether each package
  it served is durable, so a reference prefix may run through it.
- **A prompt's keys, derived once.** :meth:`PackageCache.served_prompt` takes a chat's references and inline
  images together, with the backend the request loaded: one fingerprint, one key per image, and an image
  sent twice is one lookup.
- **Encode once.** A per-key lock (shared by every engine in the process) makes concurrent
  requests for the same new image run the encoder once; the others wait and hit. Across
  replicas of a shared store, the store's lease (:meth:`refsight.store.Store.lease`, a
  PostgreSQL advisory lock) does the same; a lease that times out costs an encode, never a
  second row or a torn file (writes are content-addressed and idempotent).
- **Reads do not write.** A hit takes no cross-process lock and issues no SQL write; hits,
  misses, packages found corrupt and the encoder time saved are counted here, once, in the
  store's :class:`~refsight.store.counters.CounterBuffer`.
- **Corrupt is never served.** Every read of a durable package checks it (size, checksum, spec);
  one that fails is deleted, counted (``corrupt``), re-encoded from the kept image and written
  back, whatever else the request found (a prefix-state hit included: packages are looked up
  before any prefix state, so none can stand in for a package).
- **Scopes isolate.** ``scope`` salts the key (see :func:`refsight.package.package_key`): a
  tenant whose scope differs can neither hit nor observe another tenant's packages.
- **The quota holds, never under a running request.** Each use is noted (buffered, see
  :mod:`refsight.store.usage`) for least-recently-used eviction; every key looked up inside a
  :meth:`PackageCache.request` stays pinned until it ends; after a durable write, the store's
  byte quota evicts other, idle packages (:mod:`refsight.store.lifecycle`).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar, Union

from ..backends.base import Backend
from ..context import RequestContext
from ..errors import CorruptPackageError, StoreUnavailableError
from ..inputs.images import ImageInput
from ..support.locks import KeyedLocks
from ..package import VisualPackage, package_key
from ..settings.remembering import DEFAULT_REMEMBER_IMAGES, Sightings, check_remember_images
from ..store import Reference, Store
from ..store.disk import StoredPackage

__all__ = [
    "PackageCache", "CachedPackage", "ModelImage", "ServedImage", "ServedPrompt", "PACKAGE_LOCKS", "holding_packages",
    "encode_packages",
]

#: Package keys are content-addressed and mean the same in every engine of a process (tenants
#: share one store), so one lock table serves them all: an image is encoded once.
PACKAGE_LOCKS = KeyedLocks()


#: One image as a backend takes it: its package, or (``use_cache=False``) its pixels.
ModelImage = Union[VisualPackage, ImageInput]


@dataclass(frozen=True)
class ServedImage:
    """A :data:`ModelImage` and how the cache served it: ``cached`` when no encoder ran for it now; ``lasting``
    when its package is on the durable tier (a reference's, a remembered image's), so a prefix may run through it."""

    item: ModelImage
    cached: bool
    encode_ms: float
    lasting: bool = False


class ServedPrompt(NamedTuple):
    """A chat prompt's images as a backend takes them (:meth:`PackageCache.served_prompt`), each kind in order."""

    #: Its references' durable packages (or their kept images' pixels).
    references: list[ServedImage]
    #: Its images sent inline: packages under the ``remember_images`` policy (or the pixels themselves).
    inline: list[ServedImage]


@dataclass(frozen=True)
class CachedPackage:
    """A package and how it was obtained: ``cached`` when no encoder ran for it now."""

    package: VisualPackage
    cached: bool

    @property
    def encode_ms(self) -> float:
        """Encoder time spent on this lookup (0 on a hit)."""
        return 0.0 if self.cached else self.package.encode_ms


class PackageCache:
    """Get-or-encode over one store; ``kept_image(sha256)`` decodes a reference's kept bytes; ``remember_images``
    is the policy for images sent inline (``off``, ``recurring``, ``all``: :mod:`refsight.settings.remembering`)."""

    def __init__(
        self, store: Store, kept_image: Callable[[str], ImageInput], *, remember_images: str = DEFAULT_REMEMBER_IMAGES,
    ) -> None:
        self.store = store
        self._kept_image = kept_image
        self.remember_images = check_remember_images(remember_images)
        #: Which inline images each namespace sent in this process (memory only: a one-off leaves nothing on disk).
        self.sightings = Sightings()

    def request(self) -> AbstractContextManager[None]:
        """A request's scope: every package looked up inside it is pinned (never evicted) until it ends."""
        return self.store.pins.scope()

    # -- lookups ---------------------------------------------------------------------
    def served_prompt(
        self, context: RequestContext, backend: Backend, references: Sequence[Reference], inline: Sequence[ImageInput],
    ) -> ServedPrompt:
        """A chat prompt's images as ``backend`` takes them, each kind in its order: the references' durable packages
        and the images sent inline under the ``remember_images`` policy (remembered: a durable package and the
        namespace's row; else a candidate's package, in memory only). The keys are derived once for the prompt; an
        image sent twice is one sighting and one lookup; an inline image's decoded pixels are released once its
        package stands for it. With ``use_cache=False``, the pixels themselves: the runtime's own fresh path."""
        if not context.use_cache:
            return ServedPrompt(
                [ServedImage(self._kept_image(ref.image_sha256), False, 0.0) for ref in references],
                [ServedImage(image, False, 0.0) for image in inline],
            )
        fingerprint = backend.fingerprint()
        shas = {*(ref.image_sha256 for ref in references), *(image.sha256 for image in inline)}
        keys = {sha: context.package_key(sha, fingerprint) for sha in shas}
        served_references = [
            self._served(self._reference(context, backend, ref, keys[ref.image_sha256]), lasting=True)
            for ref in references
        ]
        sent: dict[str, ServedImage] = {}
        served_images = []
        for image in inline:
            first = sent.get(image.sha256)
            if first is None:
                sent[image.sha256] = first = self._served_inline(context, backend, image, keys[image.sha256])
                served_images.append(first)
            else:
                served_images.append(ServedImage(first.item, True, 0.0, first.lasting))
            image.release()  # a package stands for it: the request holds that, not the decoded pixels
        return ServedPrompt(served_references, served_images)

    def reference(self, context: RequestContext, ref: Reference) -> CachedPackage:
        """The reference's durable package (encoded from the kept image when missing or corrupt)."""
        backend = context.backend()
        return self._reference(context, backend, ref, context.package_key(ref.image_sha256, backend.fingerprint()))

    def candidate(self, context: RequestContext, image: ImageInput) -> CachedPackage:
        """The package of a compared image: a stored one when it exists, else encoded into memory only."""
        backend = context.backend()
        return self._candidate(context, backend, image, context.package_key(image.sha256, backend.fingerprint()))

    def served_reference(self, context: RequestContext, ref: Reference) -> ServedImage:
        """A reference as a backend takes it: its durable package, or with ``use_cache=False`` its kept image's
        pixels, so the runtime takes its own fresh path."""
        if not context.use_cache:
            return ServedImage(self._kept_image(ref.image_sha256), False, 0.0)
        return self._served(self.reference(context, ref), lasting=True)

    def served_candidate(self, context: RequestContext, image: ImageInput) -> ServedImage:
        """A compared image as a backend takes it: its memory-only package (in the context's scope), or with
        ``use_cache=False`` its pixels."""
        if not context.use_cache:
            return ServedImage(image, False, 0.0)
        return self._served(self.candidate(context, image), lasting=False)

    def durable(self, context: RequestContext, images: Sequence[ImageInput]) -> list[CachedPackage]:
        """Durable packages for new references, in order; the missing ones encoded in one batch.

        The caller links each to its reference (in the same transaction that creates it), inside
        a :meth:`request` scope so that the quota cannot take a package before its link exists.
        """
        keys = [context.package_key(image.sha256) for image in images]
        found = self._durable_hits(dict.fromkeys(keys))
        missing = {key: image for key, image in zip(keys, images) if key not in found}
        if missing:
            found.update(self._encode_missing(context, missing, keys))
        return [found[key] for key in keys]

    def _durable_hits(self, keys: Iterable[str]) -> dict[str, CachedPackage]:
        """The packages of ``keys`` the durable tier has, by key."""
        return {key: hit for key in keys if (hit := self._durable_hit(key)) is not None}

    def _encode_missing(
        self, context: RequestContext, missing: dict[str, ImageInput], keys: list[str]
    ) -> dict[str, CachedPackage]:
        """Under the keys' locks (this process's, then across replicas): what another writer stored while we
        waited, and the rest encoded in one batch and written; ``keys`` (the whole batch) stay out of the quota."""
        with ExitStack() as held:
            # Sorted, so two batches that share keys never wait on each other in a cycle.
            for key in sorted(missing):
                held.enter_context(PACKAGE_LOCKS.hold(key))
            for key in sorted(missing):  # then across replicas, in the same order
                held.enter_context(self.store.lease(key))
            found = self._durable_hits(missing)
            todo = {key: image for key, image in missing.items() if key not in found}
            if todo:
                encoded = self._encode(context.backend(), list(todo.values()), context.scope)
                for key, package in zip(todo, encoded):
                    self._write(package, quota=False)
                    found[key] = CachedPackage(package, cached=False)
                # Once for the batch; the caller's request() scope keeps them pinned until linked.
                self.store.enforce_quota(protect=tuple(keys), scope=context.scope)
            return found

    def stored(self, key: str) -> StoredPackage | None:
        """The package of ``key`` when the durable tier has it and it passes every check of a read, its tensors
        left unbuilt (no torch: a cached ``add`` only links it). Counted as a hit; a corrupt one is dropped (None)."""
        started = time.perf_counter()
        found = self._read(key, self.store.local.check)
        if found is not None:
            self._count_hit(key, found.record.fingerprint_digest, found.record.encode_ms, started)
        return found

    def is_durable(self, key: str) -> bool:
        """Whether a package is on the durable tier under ``key`` (a lookup that loads and counts nothing)."""
        return self.store.local.contains(key)

    def store_encoded(self, package: VisualPackage) -> bool:
        """Make durable a reference package another process encoded (bulk ingest); counted as the miss it was.

        Returns False when the key was already on disk (nothing written, nothing counted):
        the encode then happened twice, e.g. a retried batch, and the stored package stays.
        """
        with PACKAGE_LOCKS.hold(package.key), self.store.lease(package.key):
            if self.is_durable(package.key):
                return False
            self._write(package)  # every tier, then the byte quota
        self.store.counters.add(misses=1)
        return True

    def rebuild(self, backend: Backend, image_sha256: str, *, scope: str | None) -> VisualPackage:
        """Encode again from the kept image and replace what is stored under the key (repair: the scope
        is the stored package's, not a request's)."""
        key = package_key(image_sha256, backend.fingerprint(), scope)
        with PACKAGE_LOCKS.hold(key), self.store.lease(key):
            package = self._encode(backend, [self._kept_image(image_sha256)], scope)[0]
            # Delete first: put() is idempotent and would otherwise keep the corrupt file.
            self.store.packages.delete(key)
            self._write(package)
        return package

    # -- internals ---------------------------------------------------------------------
    def _reference(self, context: RequestContext, backend: Backend, ref: Reference, key: str) -> CachedPackage:
        """The reference's durable package under ``key``, linked to it when written (or made durable) now."""
        found = self._durable_package(context, backend, key, lambda: self._kept_image(ref.image_sha256))
        if not found.cached or ref.packages.get(backend.fingerprint().digest) != key:
            # Written now (or made durable now): link it, so it is the reference's and not garbage.
            self.store.catalog.link_package(ref.ref_id, backend.fingerprint().digest, key, namespace=ref.namespace)
        return found

    def _candidate(self, context: RequestContext, backend: Backend, image: ImageInput, key: str) -> CachedPackage:
        """A stored package under ``key`` when one exists, else ``image`` encoded into the memory tier only."""
        found = self._hit(key)
        if found is None:
            with PACKAGE_LOCKS.hold(key):
                found = self._hit(key)
                if found is None:
                    package = self._encode(backend, [image], context.scope)[0]
                    self.store.pins.note(key)
                    self.store.memory.put(package)  # bounded and never written to disk (nor to Redis)
                    found = CachedPackage(package, cached=False)
        return found

    def _served_inline(self, context: RequestContext, backend: Backend, image: ImageInput, key: str) -> ServedImage:
        """An image sent inline under the ``remember_images`` policy: remembered (a durable package and the
        namespace's row) when the policy keeps it, else a candidate's package."""
        lasting = False
        # Remembering saves work; it is no condition of the answer: with the store away (a replica's catalog
        # down) the image is served as a candidate from memory, and kept at a later sighting.
        if self.remember_images != "off":
            try:
                if self.remember_images == "all" or self.sightings.note(context.namespace, key) > 1:
                    return self._served(self._remember(context, backend, image, key), lasting=True)
                # Sent once (in this process), but remembered before (a restart, another replica): durable already.
                lasting = self.is_durable(key)
            except StoreUnavailableError:
                pass
        return self._served(self._candidate(context, backend, image, key), lasting=lasting)

    def _remember(self, context: RequestContext, backend: Backend, image: ImageInput, key: str) -> CachedPackage:
        """A remembered image's durable package (its candidate package written without an encode when still in
        memory), and its namespace's row: each written once; a later hit writes nothing."""
        found = self._durable_package(context, backend, key, lambda: image)
        if not found.cached or not self.store.remembered.contains(context.namespace, key):
            self.store.remembered.add(context.namespace, key)
        return found

    def _durable_package(
        self, context: RequestContext, backend: Backend, key: str, image: Callable[[], ImageInput],
    ) -> CachedPackage:
        """The durable package of ``key``: a hit (made durable when in memory only), else ``image()`` encoded
        and written, once across threads and replicas."""
        found = self._durable_hit(key)
        if found is None:
            with PACKAGE_LOCKS.hold(key), self.store.lease(key):
                found = self._durable_hit(key)  # another thread or replica may have stored it while we waited
                if found is None:
                    package = self._encode(backend, [image()], context.scope)[0]
                    self._write(package)
                    found = CachedPackage(package, cached=False)
        return found

    @staticmethod
    def _served(found: CachedPackage, *, lasting: bool) -> ServedImage:
        return ServedImage(found.package, found.cached, found.encode_ms, lasting=lasting)

    def _hit(self, key: str) -> CachedPackage | None:
        started = time.perf_counter()
        package = self._read(key, self.store.packages.get)
        if package is None:
            return None
        self._count_hit(key, package.fingerprint.digest, package.encode_ms, started)
        return CachedPackage(package, cached=True)

    def _read(self, key: str, read: Callable[[str], Any]) -> Any:
        """What ``read(key)`` finds, or None; a corrupt package is dropped (:meth:`_drop_corrupt`), never served."""
        try:
            return read(key)
        except CorruptPackageError:
            self._drop_corrupt(key)
            return None

    def _drop_corrupt(self, key: str) -> None:
        # Never serve a corrupt package: drop it, so the caller re-encodes from the kept image
        # and writes the repaired package back (counted: `corrupt`, then the miss of the encode).
        self.store.packages.delete(key)
        self.store.counters.add(corrupt=1)

    def _count_hit(self, key: str, fingerprint_digest: str, encode_ms: float, started: float) -> None:
        # load_ms beside encode_ms_saved: what each hit cost against the encode it avoided, in all and per model.
        load_ms = (time.perf_counter() - started) * 1000
        self.store.counters.add(
            hits=1, encode_ms_saved=encode_ms, load_ms=load_ms, **model_counts(fingerprint_digest, encode_ms, load_ms)
        )
        self.store.usage.note(key)  # buffered: a hit writes nothing now
        self.store.pins.note(key)

    def _durable_hit(self, key: str) -> CachedPackage | None:
        found = self._hit(key)
        if found is not None and not self.store.local.contains(key):
            # In memory (or Redis) only: a reference's package must survive a restart.
            self.store.local.put(found.package)
            self.store.enforce_quota(protect=(key,), scope=found.package.scope)
        return found

    def _write(self, package: VisualPackage, *, quota: bool = True) -> None:
        """Write a durable package to every tier; then, unless told otherwise, hold the byte quota."""
        self.store.pins.note(package.key)
        self.store.packages.put(package)
        if quota:
            self.store.enforce_quota(protect=(package.key,), scope=package.scope)

    def _encode(self, backend: Backend, images: list[ImageInput], scope: str | None) -> list[VisualPackage]:
        packages = encode_packages(backend, images, scope)
        self.store.counters.add(misses=len(packages))
        return packages


#: The per-model hit counters: ``model_<first 16 hex of the fingerprint digest>_<hits|encode_ms|load_ms>``.
MODEL_COUNTER_PREFIX = "model_"


def model_counts(fingerprint_digest: str, encode_ms: float, load_ms: float) -> dict[str, float]:
    """One hit's counts under its model's own counter names (``refsight stats``' per-model figures)."""
    model = f"{MODEL_COUNTER_PREFIX}{fingerprint_digest[:16]}"
    return {f"{model}_hits": 1, f"{model}_encode_ms": encode_ms, f"{model}_load_ms": load_ms}


def encode_packages(backend: Backend, images: Sequence[ImageInput], scope: str | None) -> list[VisualPackage]:
    """The packages of ``images`` under ``scope``: the one encode call, shared by the cache and bulk ingest.

    Bulk ingest workers hold no store: they encode here and send the packages to the one
    writer, which stores them through :meth:`PackageCache.store_encoded`.
    """
    packages = backend.encode(list(images))
    if scope is not None:
        # The same tensors under the isolation scope: a new key; tensors are shared, never copied.
        packages = [dataclasses.replace(package, scope=scope) for package in packages]
    return packages


_Method = TypeVar("_Method", bound=Callable[..., Any])


def holding_packages(method: _Method) -> _Method:
    """Run an engine method inside ``self.packages.request()``: the packages it holds are never evicted under it."""

    @functools.wraps(method)
    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        with self.packages.request():
            return method(self, *args, **kwargs)

    return run  # type: ignore[return-value]
