"""The ImageNet attribute source: top-k labels of the real EfficientNet-Lite0 classifier per image.

Model code, so it lives here; the judge (:mod:`refsight.judge.attribute_records`) stores its records
and settles criteria from them. torch is imported only when the classifier loads.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from refsight.errors import InvalidInputError
from refsight.inputs.images import ImageInput
from refsight.embedders._errors import embedder_errors
from refsight.package import canonical_json

__all__ = ["IMAGENET_KEY", "ImageNetAttributeSource"]

#: Key of the ImageNet record; reserved, so no schema attribute may use it.
IMAGENET_KEY = "imagenet_top5"


def _digest(value: Any) -> str:
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()


class ImageNetAttributeSource:
    """Top-k ImageNet labels from the real EfficientNet-Lite0 classifier (loaded on first use)."""

    name = "imagenet"

    def __init__(self, classifier: Any = None, *, k: int = 5) -> None:
        if not isinstance(k, int) or not 1 <= k <= 20:
            raise InvalidInputError("k", f"must be an integer in 1..20, not {k!r}")
        self._classifier = classifier
        self.k = k

    @property
    def classifier(self) -> Any:
        """The classifier, loaded lazily (torch is imported only then)."""
        if self._classifier is None:
            from refsight.embedders.efficientnet_lite import load_efficientnet_lite0

            self._classifier = load_efficientnet_lite0()
        return self._classifier

    @property
    def fingerprint(self) -> str:
        """The classifier's fingerprint (model, weights hash, preprocessing)."""
        return _digest({"source": "imagenet", "classifier": self.classifier.fingerprint})

    @property
    def schema_digest(self) -> str:
        """Names the record shape: the top-k list."""
        return _digest({"record": IMAGENET_KEY, "k": self.k})

    def compute(self, items: Sequence[Any]) -> list[dict[str, Any]]:
        """``{"imagenet_top5": [{"label", "score"}]}`` per image; packages are refused (no pixels)."""
        for i, item in enumerate(items):
            if not isinstance(item, ImageInput):
                raise InvalidInputError(
                    f"item {i} ({type(item).__name__})", "the ImageNet attribute source needs the image's pixels, not a package"
                )
        with embedder_errors(self.name, what="classify images"):
            tops = self.classifier.top_k([item.image for item in items], k=self.k)
        return [{IMAGENET_KEY: [{"label": label, "score": round(float(s), 6)} for label, s in top]} for top in tops]
