"""Store interfaces: packages by key, and the catalog of references.

A :class:`PackageStore` is a content-addressed map ``key -> VisualPackage``
(memory, local disk, later shared tiers). The :class:`Catalog` holds what users
name: references (a validated id, metadata, an image hash, one package per
fingerprint), the original image bytes, and the persistent counters.
"""

from __future__ import annotations

import abc
import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any, Iterator, Mapping, NamedTuple

from ..package import VisualPackage
from ..inputs.text import printable_text

__all__ = [
    "PackageStore",
    "PackageIndex",
    "PackageUsage",
    "FingerprintUsage",
    "Catalog",
    "Reference",
    "ReferenceRow",
    "ReferenceChanges",
    "metadata_from_json",
    "DEFAULT_NAMESPACE",
    "COUNTER_NAMES",
    "PREFIX_COUNTER_NAMES",
]

DEFAULT_NAMESPACE = "default"
#: Counters every store keeps across processes (``quota_evictions``: packages the byte quota
#: evicted from disk; ``pruned``: packages ``prune`` removed).
COUNTER_NAMES = ("hits", "misses", "evictions", "encode_ms_saved", "quota_evictions", "quota_evicted_bytes", "pruned")
#: Counters of the KV prefix-state cache (see :mod:`refsight.cache.prefix_states`); kept apart so the package
#: counters read exactly as before.
PREFIX_COUNTER_NAMES = ("prefix_hits", "prefix_misses", "prefix_ms_saved", "prefix_corrupt")

# A JSON escape of a UTF-16 surrogate: the only way stored (ASCII) JSON can decode to a lone one.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def metadata_from_json(text: str) -> dict[str, Any]:
    """Stored metadata, decoded so that every read can be written out again.

    Metadata is stored as ASCII JSON, whose ``\\uXXXX`` escapes can decode to lone surrogates
    (text an intake without the text check let in); such code points come back as U+FFFD, so
    a listing, a get or a search never fails on them (the row itself stays as stored).
    """
    value = json.loads(text)
    if not _SURROGATE_ESCAPE.search(text):
        return value  # the common case: nothing to repair, no walk
    return _printable(value)


def _printable(value: Any) -> Any:
    # Iterative, so no nesting depth can hit the recursion limit.
    root = [value]
    stack: list[tuple[Any, Any]] = [(root, 0)]
    while stack:
        parent, slot = stack.pop()
        item = parent[slot]
        if isinstance(item, str):
            parent[slot] = printable_text(item)
        elif isinstance(item, dict):
            fixed = {printable_text(k) if isinstance(k, str) else k: v for k, v in item.items()}
            parent[slot] = fixed
            stack.extend((fixed, k) for k in fixed)
        elif isinstance(item, list):
            stack.extend((item, i) for i in range(len(item)))
    return root[0]


@dataclass
class Reference:
    """A user-named reference image: id, metadata, image hash, and its packages by fingerprint digest."""

    ref_id: str
    image_sha256: str
    metadata: dict[str, Any] = field(default_factory=dict)
    created_at: float = 0.0
    namespace: str = DEFAULT_NAMESPACE
    packages: dict[str, str] = field(default_factory=dict)  # fingerprint digest -> package key

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready view (without the namespace, which callers already know)."""
        return {name: value for name, value in asdict(self).items() if name != "namespace"}


class ReferenceRow(NamedTuple):
    """What a derived index needs of a reference: its id, image and metadata (no package links)."""

    ref_id: str
    image_sha256: str
    metadata: dict[str, Any]


class ReferenceChanges(NamedTuple):
    """A namespace's changes after some revision: ``revision`` is the one they bring it up to."""

    revision: int
    changed: list[ReferenceRow]  # added, or given new metadata
    removed: list[str]  # ids removed (and not re-added since)


class PackageStore(abc.ABC):
    """A content-addressed map from package key to :class:`VisualPackage`."""

    #: The tier's name in statistics (``memory``, ``redis``, ``disk``).
    name = "store"

    @abc.abstractmethod
    def get(self, key: str) -> VisualPackage | None:
        """The package, or None when absent. Raises CorruptPackageError, never serves a bad one."""

    @abc.abstractmethod
    def put(self, package: VisualPackage) -> int:
        """Store ``package`` under ``package.key`` (idempotent); returns its size in bytes."""

    @abc.abstractmethod
    def contains(self, key: str) -> bool:
        """Whether a package is stored under ``key`` (without loading it)."""

    @abc.abstractmethod
    def delete(self, key: str) -> bool:
        """Remove a package; True when something was removed."""

    @abc.abstractmethod
    def keys(self) -> Iterator[str]:
        """Every stored key."""

    def close(self) -> None:
        """Release files and connections. Idempotent."""


class PackageUsage(NamedTuple):
    """One durable package as the store lifecycle sees it: size, last use, model, and the isolation scope
    salting its key (a tenant's namespace; None: shared, or not a package)."""

    key: str
    bytes: int
    last_used: float
    fingerprint_digest: str
    scope: str | None = None


class FingerprintUsage(NamedTuple):
    """The durable packages of one encoder fingerprint: what ``prune`` lists and drops."""

    fingerprint_digest: str
    backend: str
    model_id: str
    packages: int
    bytes: int


class PackageIndex(abc.ABC):
    """What the store lifecycle (byte quota, prune) needs of the durable packages' index.

    The embedded store's SQLite index implements it (:class:`~refsight.store.DiskPackageStore`);
    a shared catalog implements the same methods, so quota and prune run one code path
    (:mod:`refsight.store.lifecycle`) on either.
    """

    @abc.abstractmethod
    def total_bytes(self, *, scope: str | None = None) -> int:
        """Bytes of every durable package (``scope``: of those salted by that scope only)."""

    @abc.abstractmethod
    def least_recently_used(
        self, limit: int, *, after: tuple[float, str] | None = None, scope: str | None = None
    ) -> list[PackageUsage]:
        """Up to ``limit`` packages, least recently used first (ties by key), after ``(last_used, key)``
        (``scope``: only those salted by that scope)."""

    @abc.abstractmethod
    def touch(self, uses: Mapping[str, float]) -> None:
        """Record uses: each key's ``last_used`` becomes the later of its own and the given time."""

    @abc.abstractmethod
    def fingerprint_usage(self) -> list[FingerprintUsage]:
        """Packages and bytes per encoder fingerprint."""

    @abc.abstractmethod
    def packages_of(self, fingerprint_digest: str) -> list[PackageUsage]:
        """Every durable package made under one fingerprint."""

    @abc.abstractmethod
    def delete(self, key: str) -> bool:
        """Remove one package (index row, then its bytes); True when it was there."""


class Catalog(abc.ABC):
    """References, their package links, the kept image bytes, and persistent counters.

    Every method takes a ``namespace`` (tenants); ids are unique per namespace.
    """

    # -- references -------------------------------------------------------------
    @abc.abstractmethod
    def add_reference(
        self, ref_id: str, image_sha256: str, metadata: dict[str, Any], *, namespace: str = DEFAULT_NAMESPACE
    ) -> Reference:
        """Create a reference, or return the existing one when it has the same image.

        Raises InvalidInputError when ``ref_id`` exists with another image (metadata of an
        existing reference with the same image is merged).
        """

    @abc.abstractmethod
    def ingest_reference(
        self,
        ref_id: str,
        image_sha256: str,
        data: bytes,
        fmt: str | None,
        metadata: dict[str, Any],
        *,
        namespace: str = DEFAULT_NAMESPACE,
        link: tuple[str, str] | None = None,
    ) -> Reference:
        """Keep the image bytes, create or merge the reference and link its package: all or nothing."""

    @abc.abstractmethod
    def get_reference(self, ref_id: str, *, namespace: str = DEFAULT_NAMESPACE) -> Reference:
        """The reference; raises ReferenceNotFoundError."""

    @abc.abstractmethod
    def find_references(self, image_sha256: str, *, namespace: str = DEFAULT_NAMESPACE) -> list[Reference]:
        """References in ``namespace`` whose image has this hash."""

    @abc.abstractmethod
    def list_references(self, *, namespace: str = DEFAULT_NAMESPACE) -> list[Reference]:
        """All references in ``namespace``, oldest first."""

    @abc.abstractmethod
    def remove_reference(self, ref_id: str, *, namespace: str = DEFAULT_NAMESPACE) -> tuple[Reference, list[str]]:
        """Remove a reference; returns it and the package keys no reference uses any more."""

    @abc.abstractmethod
    def revision(self, *, namespace: str = DEFAULT_NAMESPACE) -> int:
        """A counter that grows with every change to the namespace's references."""

    @abc.abstractmethod
    def changes_since(self, revision: int | None, *, namespace: str = DEFAULT_NAMESPACE) -> ReferenceChanges:
        """References changed and removed after ``revision``; ``None`` lists every reference as changed."""

    @abc.abstractmethod
    def last_change(self, ref_id: str, *, namespace: str = DEFAULT_NAMESPACE) -> tuple[int, bool] | None:
        """``(revision, removed)`` of the id's latest journaled change, or None (what a removal listener checks)."""

    @abc.abstractmethod
    def link_package(
        self, ref_id: str, fingerprint_digest: str, package_key: str, *, namespace: str = DEFAULT_NAMESPACE
    ) -> None:
        """Record that ``package_key`` is the reference's package under that fingerprint."""

    @abc.abstractmethod
    def unlink_fingerprint(self, fingerprint_digest: str) -> int:
        """Forget every reference's package link under one fingerprint (``prune``); returns how many."""

    # -- image bytes --------------------------------------------------------------
    @abc.abstractmethod
    def put_image(self, image_sha256: str, data: bytes, fmt: str | None) -> None:
        """Keep the original bytes of an image, content-addressed by its pixel hash (idempotent)."""

    @abc.abstractmethod
    def get_image(self, image_sha256: str) -> bytes:
        """The kept original bytes; raises NotFoundError."""

    # -- counters -----------------------------------------------------------------
    @abc.abstractmethod
    def bump(self, **amounts: float) -> None:
        """Add to persistent counters (see COUNTER_NAMES), atomically across processes."""

    @abc.abstractmethod
    def counters(self) -> dict[str, float]:
        """Current counter values."""
