"""The blocking work behind every endpoint, one tenant at a time, over ONE open store.

:class:`Service` keeps one :class:`refsight.Engine` per namespace, all sharing the
same :class:`refsight.store.Store` (one SQLite database, one memory tier). Its
methods are plain synchronous calls; the routes run them in the
:class:`~refsight.server.limits.WorkPool` so model work never blocks the event loop.

Two things live here rather than in the routes:

- **Encode once under concurrency.** Adds of the same image are serialised by a
  lock per image hash (across tenants), so N simultaneous uploads of one new image
  run the encoder once and the others find its package.
- **No cross-tenant inference.** Packages are content-addressed and shared between
  tenants (an image encoded for one is not encoded again for another), so a raw
  "cached" flag would tell tenant B that *someone* stored this image. The flags a
  tenant sees are therefore relative to its own references: an image the tenant
  does not hold reads exactly as a fresh encode would (same ``cached``,
  ``encode_ms`` and ``bytes``). Timing remains a residual side channel.
"""

from __future__ import annotations

import io
import threading
from typing import Any, Mapping, Sequence

from .. import Engine, ImageInput, IntakeLimits, InvalidInputError, load_image, package_key
from ..engine import AddFailure, ReferenceSegment
from ..locks import KeyedLocks
from .config import ServerConfig

__all__ = ["Service"]


class Service:
    """Store + one engine per tenant namespace; every method is blocking and tenant-scoped."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.limits = IntakeLimits(max_pixels=config.max_image_pixels, max_bytes=config.max_body_bytes)
        self.store = None
        self._engines: dict[str, Engine] = {}
        self._engines_lock = threading.Lock()
        self._image_locks = KeyedLocks()
        self._thumbs: dict[tuple[str, int], bytes] = {}
        self._thumbs_lock = threading.Lock()

    # -- lifecycle -------------------------------------------------------------------
    def open(self) -> None:
        """Open the store and load the model once, so the first request pays no load time."""
        from ..config import default_store_dir
        from ..store import open_store

        options = {} if self.config.memory_bytes is None else {"memory_bytes": self.config.memory_bytes}
        self.store = open_store(self.config.store_dir or default_store_dir(), **options)
        engine = self.engine("default")
        engine.backend().fingerprint()

    def close(self) -> None:
        """Close the shared store (engines hold no resources of their own)."""
        if self.store is not None:
            self.store.close()
            self.store = None

    def engine(self, namespace: str) -> Engine:
        """The engine of ``namespace`` (created on first use; all share the one store)."""
        with self._engines_lock:
            engine = self._engines.get(namespace)
            if engine is None:
                engine = Engine(
                    self.store,
                    model=self.config.model,
                    namespace=namespace,
                    limits=self.limits,
                    backend_options=self.config.backend_options,
                )
                self._engines[namespace] = engine
            return engine

    @property
    def model(self) -> str:
        """Name of the served model."""
        return self.engine("default").backend().name

    @property
    def random_weights(self) -> bool:
        """Whether the served model has random weights (its text is meaningless)."""
        return bool(self.engine("default").backend().random_weights)

    # -- helpers -----------------------------------------------------------------------
    def decode(self, data: bytes, label: str) -> ImageInput:
        """Decode an uploaded image under the server's limits; ImageError names ``label``."""
        return load_image(data, limits=self.limits, name=label)

    def _owns_image(self, namespace: str, sha256: str) -> bool:
        return bool(self.store.catalog.find_references(sha256, namespace=namespace))

    def _current_key(self, engine: Engine, image_sha256: str) -> str:
        return package_key(image_sha256, engine.backend().fingerprint())

    def _reference_view(self, engine: Engine, ref) -> dict[str, Any]:
        data = ref.to_dict()
        key = self._current_key(engine, ref.image_sha256)
        data["cached"] = self.store.local.contains(key)
        data["in_memory"] = self.store.memory.contains(key)
        return data

    # -- references ----------------------------------------------------------------------
    def add(self, namespace: str, image: ImageInput, ref_id: str | None, metadata: Mapping[str, Any]) -> dict[str, Any]:
        """Add one reference; the same fields as ``refsight add --json``."""
        engine = self.engine(namespace)
        with self._image_locks.hold(image.sha256):
            owned = self._owns_image(namespace, image.sha256)
            result = next(iter(engine.add_many([image], ids=[ref_id], metadata=dict(metadata))))
        if isinstance(result, AddFailure):
            raise InvalidInputError(ref_id or result.input, result.error)
        data = result.to_dict()
        if data["cached"] and not owned:
            # Another tenant's package: report it as the encode it would have been.
            package = self.store.packages.get(data["package_key"])
            if package is not None:
                data.update(cached=False, encode_ms=round(package.encode_ms, 3), bytes=package.nbytes)
        return data

    def references(self, namespace: str) -> list[dict[str, Any]]:
        """Every reference of the tenant, with its cache state under the served model."""
        engine = self.engine(namespace)
        return [self._reference_view(engine, ref) for ref in engine.references()]

    def reference(self, namespace: str, ref_id: str) -> dict[str, Any]:
        """One reference; ReferenceNotFoundError when the tenant has none by that id."""
        engine = self.engine(namespace)
        return self._reference_view(engine, engine.reference(ref_id))

    def remove(self, namespace: str, ref_id: str) -> dict[str, Any]:
        """Remove the tenant's reference (packages still used by anyone else stay)."""
        ref = self.engine(namespace).remove(ref_id)
        return {"removed": ref.ref_id}

    def thumbnail(self, namespace: str, ref_id: str, size: int) -> bytes:
        """A JPEG thumbnail (longest side ``size``) of the tenant's reference image."""
        engine = self.engine(namespace)
        ref = engine.reference(ref_id)  # the namespace check comes before any cache
        cache_key = (ref.image_sha256, size)
        with self._thumbs_lock:
            cached = self._thumbs.get(cache_key)
        if cached is not None:
            return cached
        image = engine.reference_image(ref).image.copy()
        image.thumbnail((size, size))
        buffer = io.BytesIO()
        image.save(buffer, format="JPEG", quality=85)
        data = buffer.getvalue()
        with self._thumbs_lock:
            if len(self._thumbs) >= 1024:  # a small bounded cache; the oldest entry goes
                self._thumbs.pop(next(iter(self._thumbs)))
            self._thumbs[cache_key] = data
        return data

    # -- model work --------------------------------------------------------------------------
    def compare(self, namespace: str, candidate: ImageInput, **options: Any) -> dict[str, Any]:
        """``engine.compare`` → the JSON of ``refsight compare --json``."""
        engine = self.engine(namespace)
        return engine.compare(candidate, **options).to_dict()

    def search(self, namespace: str, **options: Any) -> dict[str, Any]:
        """``engine.search`` → the JSON of ``refsight search --json``."""
        return self.engine(namespace).search(**options)

    def chat(self, namespace: str, segments: Sequence[Any], **options: Any) -> dict[str, Any]:
        """``engine.chat`` with cache flags relative to the tenant's own images."""
        engine = self.engine(namespace)
        result = engine.chat(list(segments), **options).to_dict()
        flags = result.get("references_cached", [])
        images = [s for s in segments if not isinstance(s, str)]
        if len(flags) == len(images):
            result["references_cached"] = [
                flag and (isinstance(s, ReferenceSegment) or not isinstance(s, ImageInput) or self._owns_image(namespace, s.sha256))
                for flag, s in zip(flags, images)
            ]
        return result

    # -- stats -----------------------------------------------------------------------------
    def stats(self, namespace: str, *, tenants: bool) -> dict[str, Any]:
        """Cache statistics. Alone (no keys) the store's own; with tenants only what is the tenant's."""
        engine = self.engine(namespace)
        if not tenants:
            return engine.stats()
        keys = {k for ref in engine.references() for k in ref.packages.values()}
        records = [self.store.local.record(k) for k in keys]
        # The hit/miss counters span every tenant, so a tenant sees none of them.
        return {
            "references": len(engine.references()),
            "packages": sum(r is not None for r in records),
            "bytes": sum(r.bytes for r in records if r is not None),
            "hits": None,
            "misses": None,
            "evictions": None,
            "encode_ms_saved": None,
            "scope": "namespace",
        }

    def global_stats(self) -> dict[str, Any]:
        """The store-wide counters (for ``/metrics``)."""
        return self.engine("default").stats()
