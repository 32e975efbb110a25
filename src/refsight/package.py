"""Visual packages, encoder fingerprints and the keys that name them.

A *visual package* is what a model's vision side produces for one image: named
tensors (merged features, deepstack layers, per-tile features, ...) plus the JSON
metadata the language model needs to place them back into its sequence
(``image_grid_thw``, tile rows/cols, the number of placeholder tokens).

Its key is ``sha256(image hash, fingerprint)``. The fingerprint holds everything
that changes the features: model id and revision, every preprocessing setting,
dtype and the package format version. Hashes are fed field names, dtypes and
shapes as well as bytes, so that two different layouts of the same bytes never
collide.

This module never imports torch: tensors are handled through duck typing
(``.dtype``, ``.shape``, ``.numel()``), so ``import refsight`` stays light.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from .errors import InvalidInputError

__all__ = [
    "PACKAGE_FORMAT_VERSION",
    "EncoderFingerprint",
    "VisualPackage",
    "package_key",
    "framed_sha256",
    "canonical_json",
    "tensor_spec",
]

#: Bumped whenever the on-disk meaning of a package changes; part of every key.
PACKAGE_FORMAT_VERSION = 1


def canonical_json(value: Any) -> str:
    """Stable JSON: sorted keys, no whitespace, ASCII only; equal values give equal text."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


@dataclass(frozen=True)
class EncoderFingerprint:
    """Everything that changes a model's visual features for a given image.

    ``revision`` is a hub commit or a hash of the weight files; ``preprocessing``
    holds every processor setting (min/max pixels, patch and merge size, tile size,
    normalisation ...). Two fingerprints are equal exactly when their canonical
    JSON is equal.
    """

    backend: str
    model_id: str
    revision: str
    dtype: str
    preprocessing: Mapping[str, Any] = field(default_factory=dict)
    format_version: int = PACKAGE_FORMAT_VERSION

    def __post_init__(self) -> None:
        for name in ("backend", "model_id", "revision", "dtype"):
            value = getattr(self, name)
            # An empty revision would let two different weight sets share keys.
            if not isinstance(value, str) or not value:
                raise InvalidInputError(f"EncoderFingerprint.{name}", f"must be a non-empty string, got {value!r}")
        if type(self.format_version) is not int:
            raise InvalidInputError(
                "EncoderFingerprint.format_version", f"must be an int, got {self.format_version!r}"
            )
        if not isinstance(self.preprocessing, Mapping):
            raise InvalidInputError(
                "EncoderFingerprint.preprocessing", f"must be a mapping, got {type(self.preprocessing).__name__}"
            )
        try:
            snapshot = json.loads(canonical_json(dict(self.preprocessing)))
        except (TypeError, ValueError) as e:
            raise InvalidInputError(
                "EncoderFingerprint.preprocessing", f"must be JSON data with string keys and finite numbers: {e}"
            ) from None
        # Keep a private copy: the key and hash of a frozen fingerprint must not
        # change when the caller later edits the dict it passed in.
        object.__setattr__(self, "preprocessing", snapshot)
        # Serialised once: a request asks for its packages' keys many times (issue 41: ~1.5 ms a request).
        object.__setattr__(self, "_json", canonical_json(self._plain()))

    def to_dict(self) -> dict[str, Any]:
        """A plain dict, suitable for JSON."""
        return json.loads(self._json)

    def difference(self, other: "EncoderFingerprint") -> list[str]:
        """The fields in which ``other`` differs from this one (``preprocessing.KEY`` for each differing setting)."""
        a, b = self.to_dict(), other.to_dict()
        fields_ = [k for k in b if k != "preprocessing" and a.get(k) != b[k]]
        pre_a, pre_b = a.get("preprocessing") or {}, b.get("preprocessing") or {}
        return fields_ + [f"preprocessing.{k}" for k in sorted(set(pre_a) | set(pre_b)) if pre_a.get(k) != pre_b.get(k)]

    def _plain(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "model_id": self.model_id,
            "revision": self.revision,
            "dtype": self.dtype,
            # Round-trip through JSON so tuples and lists compare equal.
            "preprocessing": json.loads(canonical_json(dict(self.preprocessing))),
            "format_version": self.format_version,
        }

    def to_json(self) -> str:
        """The canonical JSON text of this fingerprint (sorted keys, stable; made once)."""
        return self._json

    @property
    def digest(self) -> str:
        """sha256 hex of the canonical JSON; names the fingerprint in the store."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()

    @classmethod
    def from_json(cls, text: str | Mapping[str, Any]) -> "EncoderFingerprint":
        """Rebuild a fingerprint from :meth:`to_json` output (or its dict)."""
        try:
            data = json.loads(text) if isinstance(text, str) else dict(text)
            return cls(
                backend=data["backend"],
                model_id=data["model_id"],
                revision=data["revision"],
                dtype=data["dtype"],
                preprocessing=data.get("preprocessing", {}),
                format_version=int(data.get("format_version", PACKAGE_FORMAT_VERSION)),
            )
        except InvalidInputError:
            raise
        except (ValueError, TypeError, KeyError) as e:
            reason = f"missing field {e}" if isinstance(e, KeyError) else str(e)
            raise InvalidInputError("fingerprint JSON", f"not a fingerprint: {reason}") from None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, EncoderFingerprint) and self.to_json() == other.to_json()

    def __hash__(self) -> int:
        return hash(self.to_json())


def package_key(image_sha256: str, fingerprint: EncoderFingerprint, scope: str | None = None) -> str:
    """The key of the package of one image under one fingerprint (and one isolation scope).

    Every part is length-prefixed with its field name so that no choice of strings can
    make two different (image, fingerprint, scope) triples hash alike. ``scope`` salts
    the key for tenant isolation: packages of the same image in two scopes are two
    packages, so no tenant's cache state can be observed by another (``None``, the
    default, shares packages and gives the same keys as before scopes existed).
    """
    if not isinstance(image_sha256, str) or not image_sha256:
        raise InvalidInputError("image_sha256", f"must be a non-empty hex string, got {image_sha256!r}")
    if not isinstance(fingerprint, EncoderFingerprint):
        raise InvalidInputError("fingerprint", f"must be an EncoderFingerprint, got {type(fingerprint).__name__}")
    if scope is not None and (not isinstance(scope, str) or not scope):
        raise InvalidInputError("scope", f"must be None or a non-empty string, got {scope!r}")
    parts = [("image_sha256", image_sha256), ("fingerprint", fingerprint.to_json())]
    if scope is not None:
        parts.append(("scope", scope))
    return framed_sha256(parts)


def framed_sha256(parts: Sequence[tuple[str, str]]) -> str:
    """sha256 over named fields, each framed as ``name:length:value``, so no choice of strings
    makes two different field lists hash alike (package keys, prefix-state keys)."""
    h = hashlib.sha256()
    for name, value in parts:
        data = value.encode()
        h.update(f"{name}:{len(data)}:".encode())
        h.update(data)
    return h.hexdigest()


def tensor_spec(tensors: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """``{name: {"dtype": "bfloat16", "shape": [..]}}`` for a mapping of tensors."""
    return {
        name: {"dtype": str(t.dtype).removeprefix("torch."), "shape": [int(s) for s in t.shape]}
        for name, t in sorted(tensors.items())
    }


@dataclass
class VisualPackage:
    """Named tensors + metadata + provenance for one image under one fingerprint.

    Treat a package as immutable: the memory tier hands the same tensors to every
    reader, so in-place edits would leak between requests.
    """

    tensors: dict[str, Any]
    metadata: dict[str, Any]
    image_sha256: str
    fingerprint: EncoderFingerprint
    created_at: float = field(default_factory=time.time)
    encode_ms: float = 0.0
    #: The isolation scope salting the key (a tenant namespace), or None when shared.
    scope: str | None = None

    @property
    def key(self) -> str:
        """``package_key(image_sha256, fingerprint, scope)``, computed once per (image, fingerprint, scope)."""
        parts = (self.image_sha256, self.fingerprint, self.scope)
        memo = self.__dict__.get("_key_memo")
        if memo is None or memo[0] != parts:
            memo = (parts, package_key(*parts))
            self.__dict__["_key_memo"] = memo
        return memo[1]

    @property
    def nbytes(self) -> int:
        """Total size of the tensors in bytes."""
        return sum(int(t.numel()) * int(t.element_size()) for t in self.tensors.values())

    @property
    def spec(self) -> dict[str, dict[str, Any]]:
        """Name, dtype and shape of every tensor (see :func:`tensor_spec`)."""
        return tensor_spec(self.tensors)

    def header(self) -> dict[str, Any]:
        """Everything but the tensors, as JSON-ready data (stored in the file header)."""
        return {
            "metadata": self.metadata,
            "image_sha256": self.image_sha256,
            "fingerprint": self.fingerprint.to_dict(),
            "created_at": self.created_at,
            "encode_ms": self.encode_ms,
            "spec": self.spec,
            # Only scoped packages carry the field, so shared ones keep their old header.
            **({"scope": self.scope} if self.scope is not None else {}),
        }
