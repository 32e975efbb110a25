"""Drift check: do stored packages still match what the current runtime would encode?

A package key pins everything that *should* change features (weights, processor
settings, dtype, attention kernel ...), but not the runtime underneath: a new torch,
transformers or GPU driver can move features a little, or a disk can hand back altered
bytes that still pass the checks. :func:`check_drift` re-encodes a random sample of
stored references with the current backend and compares, per package, the largest
absolute difference of any tensor element, and whether a fixed probe prompt gives
the same greedy tokens from the stored package as from the fresh one.

``refsight verify --fresh N [--model M]`` runs it and exits 1 when the report is not ok.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Iterable

from ..errors import CorruptPackageError, InvalidInputError

__all__ = ["PROBE_PROMPT", "DEFAULT_THRESHOLD", "PackageDrift", "DriftReport", "check_drift"]

#: The text asked about each image; greedy tokens from stored and fresh packages must agree.
PROBE_PROMPT = "Describe this image in one short sentence."
#: Tokens generated for the probe (enough to expose a changed argmax, cheap on a CPU).
PROBE_TOKENS = 8
#: A threshold for ``refsight verify --fresh``: far above float32 batching noise (features of
#: one image encoded alone or in a batch differ by ~1e-7), far below a damaged package. A
#: bfloat16 store whose packages were encoded in other batch shapes may differ by one bf16
#: rounding step (2^-8 of a feature's magnitude): judge those with ``max_rel_diff``.
DEFAULT_THRESHOLD = 1e-3


@dataclass
class PackageDrift:
    """One sampled reference: its stored package against a fresh encode."""

    ref_id: str
    image_sha256: str
    key: str
    #: Largest |stored − fresh| over every element of every tensor (inf when shapes or names differ).
    max_abs_diff: float
    #: The probe prompt's greedy tokens from the stored and the fresh package are the same.
    tokens_agree: bool
    #: ``max_abs_diff <= threshold`` and the package could be read.
    ok: bool
    #: Why the comparison could not be made ("corrupt: ...", "shapes differ ..."), else None.
    problem: str | None = None
    #: The stored package's provenance (device, versions, date), when it has one.
    stored_provenance: dict[str, Any] | None = None
    #: ``max_abs_diff`` over the largest |stored| element (scale-free; inf when incomparable).
    max_rel_diff: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready view (an infinite difference becomes null)."""
        return {
            "ref_id": self.ref_id,
            "image_sha256": self.image_sha256,
            "key": self.key,
            "max_abs_diff": self.max_abs_diff if self.max_abs_diff != float("inf") else None,
            "max_rel_diff": self.max_rel_diff if self.max_rel_diff != float("inf") else None,
            "tokens_agree": self.tokens_agree,
            "ok": self.ok,
            "problem": self.problem,
            "stored_provenance": self.stored_provenance,
        }


@dataclass
class DriftReport:
    """The result of :func:`check_drift`: per package, and whether all are within the threshold."""

    model: str
    threshold: float
    sample: int
    seed: int
    packages: list[PackageDrift] = field(default_factory=list)
    #: References with no package under the current fingerprint (nothing to compare).
    skipped: int = 0
    #: The current runtime's provenance (device, versions).
    runtime: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """Every sampled package is within the threshold."""
        return all(p.ok for p in self.packages)

    @property
    def max_abs_diff(self) -> float:
        """The largest difference over the sample (0.0 for an empty sample)."""
        return max((p.max_abs_diff for p in self.packages), default=0.0)

    @property
    def tokens_agree(self) -> bool:
        """Every probe gave the same tokens from the stored and the fresh package."""
        return all(p.tokens_agree for p in self.packages)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready view, one entry per sampled package."""
        worst = self.max_abs_diff
        return {
            "model": self.model,
            "ok": self.ok,
            "threshold": self.threshold,
            "sample": self.sample,
            "seed": self.seed,
            "checked": len(self.packages),
            "skipped": self.skipped,
            "max_abs_diff": worst if worst != float("inf") else None,
            "tokens_agree": self.tokens_agree,
            "runtime": self.runtime,
            "packages": [p.to_dict() for p in self.packages],
        }


def _max_diff(stored: dict[str, Any], fresh: dict[str, Any]) -> tuple[float, float, str | None]:
    """(max |Δ|, max |Δ| / max |stored|, problem) over every tensor of two packages."""
    inf = float("inf")
    if set(stored) != set(fresh):
        return inf, inf, f"tensor names differ: stored {sorted(stored)}, fresh {sorted(fresh)}"
    worst = scale = 0.0
    for name in sorted(stored):
        a, b = stored[name], fresh[name]
        if tuple(a.shape) != tuple(b.shape):
            return inf, inf, f"{name}: shape {list(a.shape)} stored, {list(b.shape)} fresh"
        if a.numel():
            # float64 so that the difference itself adds no rounding.
            worst = max(worst, float((a.double() - b.double()).abs().max()))
            scale = max(scale, float(a.double().abs().max()))
    return worst, (worst / scale if scale else (0.0 if worst == 0 else inf)), None


def check_drift(
    store: Any,
    backend: Any,
    references: Iterable[Any],
    *,
    sample: int,
    seed: int,
    threshold: float,
    scope: str | None = None,
) -> "DriftReport":
    """Re-encode ``sample`` randomly chosen references and compare with their stored packages.

    ``store`` is an open :class:`~refsight.store.Store`; ``references`` are catalog
    references (anything with ``image_sha256`` and ``ref_id``). Only references with a
    package under ``backend.fingerprint()`` (and ``scope``) are sampled; the others are
    counted in ``skipped``. The draw depends only on ``seed`` and the references' images.
    """
    from ..inputs.images import load_image
    from ..package import package_key

    if isinstance(sample, bool) or not isinstance(sample, int) or sample < 1:
        raise InvalidInputError("sample", f"must be a positive integer, got {sample!r}")
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or threshold < 0:
        raise InvalidInputError("threshold", f"must be a number >= 0, got {threshold!r}")
    fingerprint = backend.fingerprint()
    # One entry per image: two references to one image share one package.
    by_image: dict[str, Any] = {}
    for ref in references:
        by_image.setdefault(ref.image_sha256, ref)
    candidates, skipped = [], 0
    for sha in sorted(by_image):  # sorted: the draw must not depend on catalog order
        key = package_key(sha, fingerprint, scope)
        if store.packages.contains(key):
            candidates.append((by_image[sha], key))
        else:
            skipped += 1
    chosen = random.Random(seed).sample(candidates, min(sample, len(candidates)))

    runtime = {}
    device = getattr(backend, "device", None)
    if device is not None:
        from ..backends.hf.runtime import provenance

        runtime = provenance(device)
        runtime.pop("date", None)
    report = DriftReport(
        model=backend.name, threshold=float(threshold), sample=sample, seed=seed, skipped=skipped, runtime=runtime
    )
    for ref, key in chosen:
        report.packages.append(_check_one(store, backend, ref, key, threshold, load_image))
    return report


def _unreadable(ref_id: str, image_sha256: str, key: str, problem: str) -> PackageDrift:
    inf = float("inf")
    return PackageDrift(ref_id, image_sha256, key, inf, tokens_agree=False, ok=False, problem=problem, max_rel_diff=inf)


def _check_one(store: Any, backend: Any, ref: Any, key: str, threshold: float, load_image: Any) -> PackageDrift:
    from ..requests import GenerationRequest

    ref_id = str(getattr(ref, "ref_id", ref.image_sha256))
    try:
        stored = store.packages.get(key)
    except CorruptPackageError as e:
        return _unreadable(ref_id, ref.image_sha256, key, f"corrupt: {e.reason}")
    if stored is None:  # removed since we looked
        return _unreadable(ref_id, ref.image_sha256, key, "no longer stored")
    image = load_image(store.catalog.get_image(ref.image_sha256))
    fresh = backend.encode([image])[0]
    diff, relative, problem = _max_diff(stored.tensors, fresh.tensors)
    agree = False
    if problem is None:
        try:
            backend.validate_package(stored)
            out = backend.generate(
                [
                    GenerationRequest([stored, PROBE_PROMPT], max_new_tokens=PROBE_TOKENS),
                    GenerationRequest([fresh, PROBE_PROMPT], max_new_tokens=PROBE_TOKENS),
                ]
            )
            agree = out[0].token_ids == out[1].token_ids
        except CorruptPackageError as e:
            problem = f"corrupt: {e.reason}"
    provenance = stored.metadata.get("provenance") if isinstance(stored.metadata, dict) else None
    return PackageDrift(
        ref_id=ref_id,
        image_sha256=ref.image_sha256,
        key=key,
        max_abs_diff=diff,
        tokens_agree=agree,
        ok=problem is None and diff <= threshold,
        problem=problem,
        stored_provenance=provenance if isinstance(provenance, dict) else None,
        max_rel_diff=relative,
    )


