"""The default embedder: ConSE over EfficientNet-Lite0 and all-MiniLM-L6-v2 (real weights, offline).

ConSE zero-shot embeddings (Norouzi et al. 2014, "Zero-Shot Learning by Convex Combination
of Semantic Embeddings") built from the ImageNet classifier and the sentence encoder, plus
the classifier's penultimate features for image→image similarity. See the class docstring
for the layout. Registered as ``conse`` (:mod:`refsight.embedders.registry`); torch is
imported only when the models load.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from refsight.errors import InvalidInputError, ModelLoadError
from refsight.inputs.images import ImageInput
from refsight.embedders._errors import embedder_errors
from refsight.embedders.base import Embedder, l2_normalise

__all__ = ["EfficientNetConSEEmbedder", "load_conse"]



class EfficientNetConSEEmbedder(Embedder):
    """ConSE text↔image space plus penultimate CNN features, concatenated into one vector.

    An image becomes ``[a·c, b·f]`` (dim 384 + 1280 = 1664) where

    * ``c`` is ConSE: the probability-weighted mean of the MiniLM embeddings of its top-``T``
      ImageNet labels (probabilities renormalised over the top T), L2-normalised;
    * ``f`` is the L2-normalised 1280-d penultimate EfficientNet feature;
    * ``a² + b² = 1``, so the whole vector is unit length.

    A text becomes ``[m, 0]`` with ``m`` its MiniLM embedding. So one inner product serves both
    query kinds with one index:

    * text → image: ``a · cos(m, c)``, i.e. pure ConSE ranking (scores are scaled by ``a``);
    * image → image: ``a²·cos(c, c') + b²·cos(f, f')``, a blend dominated by the CNN features.

    Why the blend for image queries: on the bundled photos with transformed copies as queries
    (crops, flips, colour and scale changes), the penultimate features rank the right photo first more often and by a wider margin than
    ConSE alone, which collapses photos whose top labels are uncertain (e.g. the astronaut or the
    horse silhouette) onto similar label mixtures (``tests/retrieval/test_embedders.py`` measures
    it). The default ``a² = 0.25`` keeps some semantic pull without losing that precision.
    """

    name = "efficientnet-lite0-conse"
    #: Cut at 384 (and renormalised) a vector is its ConSE part alone: text and images in one space, the CNN
    #: features dropped (a text's vector is unchanged). Any other cut mixes the two.
    truncations = (384,)

    def __init__(self, *, top_t: int = 10, conse_weight: float = 0.25, label_template: str = "a photo of a {}"):
        if not isinstance(top_t, int) or not 1 <= top_t <= 1000:
            raise InvalidInputError("top_t", f"must be an integer in 1..1000, got {top_t!r}")
        if not 0.0 < conse_weight <= 1.0:
            raise InvalidInputError("conse_weight", f"must be in (0, 1], got {conse_weight!r}")
        if "{}" not in label_template:
            raise InvalidInputError("label_template", "must contain '{}' where the class name goes")
        from refsight.embedders.efficientnet_lite import classifier_fingerprint
        from refsight.embedders.minilm import MAX_TOKENS, load_minilm

        with embedder_errors(self.name, ModelLoadError, "cannot load the ConSE models"):
            # The classifier loads when an image is first embedded: a text search never needs it.
            self._classifier_fingerprint = classifier_fingerprint()
            self.text_encoder = load_minilm()
            self._label_vectors = _label_vectors(label_template)
        self.top_t = top_t
        self.conse_weight = float(conse_weight)
        self.label_template = label_template
        self._a = float(np.sqrt(conse_weight))
        self._b = float(np.sqrt(1.0 - conse_weight))
        self.max_tokens = MAX_TOKENS

    @property
    def classifier(self) -> Any:
        """The EfficientNet-Lite0 classifier, loaded on first use (once per process)."""
        from refsight.embedders.efficientnet_lite import load_efficientnet_lite0

        with embedder_errors(self.name, ModelLoadError, "cannot load the ConSE image model"):
            return load_efficientnet_lite0()

    @property
    def dim(self) -> int:
        """384 (MiniLM) + 1280 (EfficientNet features)."""
        return 384 + 1280

    def fingerprint(self) -> dict[str, Any]:
        """Both models' fingerprints plus the ConSE recipe."""
        return {
            "embedder": "conse+features/v1",
            "image_model": self._classifier_fingerprint,
            "text_model": self.text_encoder.fingerprint,
            "top_t": self.top_t,
            "conse_weight": self.conse_weight,
            "label_template": self.label_template,
        }

    def text_tokens(self, text: str) -> list[int]:
        """MiniLM's WordPiece ids of ``text`` (``[CLS]`` and ``[SEP]`` included), uncut."""
        return self.text_encoder.tokens(text)

    def token_text(self, tokens: Sequence[int]) -> str:
        """The text of MiniLM WordPiece ids (special tokens left out)."""
        try:
            return self.text_encoder.text_of(tokens)
        except ValueError as exc:
            raise InvalidInputError("input", f"{exc} (MiniLM's, which {self.name} reads texts with)") from None

    def conse(self, probabilities: np.ndarray) -> np.ndarray:
        """ConSE vectors [n, 384] from class probabilities [n, 1000]."""
        top = np.argsort(-probabilities, axis=1)[:, : self.top_t]
        weights = np.take_along_axis(probabilities, top, 1)
        weights = weights / np.maximum(weights.sum(1, keepdims=True), 1e-12)
        vecs = np.einsum("nt,ntd->nd", weights, self._label_vectors[top])
        return l2_normalise(vecs)

    def _embed_images(self, images: list[ImageInput]) -> np.ndarray:
        with embedder_errors(self.name, what="embed images"):
            feats, probs = self.classifier.features_and_probabilities([im.image for im in images])
        return np.concatenate([self._a * self.conse(probs), self._b * feats], axis=1)

    def _embed_texts(self, texts: list[str], instruction: str | None) -> np.ndarray:
        # MiniLM is not instruction-tuned: the instruction is accepted and ignored on purpose
        with embedder_errors(self.name, what="embed texts"):
            m = self.text_encoder.encode(texts)
        return np.concatenate([m, np.zeros((len(texts), 1280), np.float32)], axis=1)


@functools.cache
def _label_vectors(template: str) -> np.ndarray:
    """MiniLM embeddings of the 1000 class names, [1000, 384].

    Embedding 1000 sentences costs seconds to a minute on a busy CPU, so the vectors for the
    default template ship precomputed (``refsight/embedders/imagenet_labels_minilm.npy``). They
    are used only when their recorded template, text-model weights hash and labels-file hash
    all match this process; otherwise they are computed here.
    """
    import json
    from importlib import resources

    from refsight.embedders.efficientnet_lite import imagenet_labels
    from refsight.embedders.minilm import load_minilm

    encoder = load_minilm()
    pkg = resources.files("refsight.embedders")
    try:
        meta = json.loads(pkg.joinpath("imagenet_labels_minilm.json").read_text("utf-8"))
        labels_sha = hashlib.sha256(pkg.joinpath("imagenet_labels.txt").read_bytes()).hexdigest()
        if (meta.get("template") == template and meta.get("text_model") == encoder.fingerprint
                and meta.get("labels_sha256") == labels_sha):
            with pkg.joinpath("imagenet_labels_minilm.npy").open("rb") as f:
                vectors = np.load(f)
            if vectors.shape == (1000, encoder.dim):
                return vectors.astype(np.float32)
    except (OSError, ValueError):
        pass  # no usable precomputed file: compute below
    return encoder.encode([template.format(label) for label in imagenet_labels()])


def load_conse(name: str = "conse") -> EfficientNetConSEEmbedder:
    """Registry factory for ``conse``: the embedder with its default recipe."""
    return EfficientNetConSEEmbedder()
