"""Result records the engine returns; each has ``to_dict()`` giving the CLI's/HTTP API's JSON."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["AddResult", "AddFailure", "VerifyReport", "GenerateResult", "CompareResult"]


@dataclass
class AddResult:
    """One stored reference, as ``refsight add --json`` prints it."""

    ref_id: str
    image_sha256: str
    package_key: str
    model: str
    cached: bool
    encode_ms: float
    bytes: int

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields."""
        return asdict(self)


@dataclass
class AddFailure:
    """An input that could not be added; nothing was stored for it."""

    input: str
    error: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields."""
        return asdict(self)


@dataclass
class VerifyReport:
    """What ``verify`` found: keys checked, corrupt keys, keys repaired, keys left unrepairable."""

    checked: int = 0
    corrupt: list[str] = field(default_factory=list)
    repaired: list[str] = field(default_factory=list)
    unrepairable: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """True when no corruption remains."""
        return len(self.repaired) == len(self.corrupt)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields (``repaired`` as a count, the keys beside it)."""
        return {
            "checked": self.checked,
            "corrupt": self.corrupt,
            "repaired": len(self.repaired),
            "repaired_keys": self.repaired,
            "unrepairable": self.unrepairable,
        }


@dataclass
class GenerateResult:
    """The answer of ``generate``: text, tokens and where the time went."""

    text: str
    tokens: list[int]
    model: str
    random_weights: bool
    references_cached: list[bool]
    timings_ms: dict[str, float]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields."""
        return asdict(self)


@dataclass
class CompareResult:
    """A candidate judged against references, as ``refsight compare --json`` prints it.

    ``results`` holds one entry per judged reference (see
    :meth:`refsight.judge.ReferenceResult.to_dict`) plus ``reference_cached``;
    ``recalled`` lists the shortlist retrieval picked (empty without ``top_k``).
    """

    candidate_sha256: str
    model: str
    random_weights: bool
    results: list[dict[str, Any]]
    timings_ms: dict[str, float]
    recalled: list[dict[str, Any]] = field(default_factory=list)
    vlm_calls: int = 0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields (``recalled`` only when retrieval ran)."""
        data = asdict(self)
        if not self.recalled:
            data.pop("recalled")
        return data
