"""Embedders: images and texts → unit vectors in one space, so text can find images.

* :class:`EfficientNetConSEEmbedder` (the default; real weights, offline) – ConSE zero-shot
  embeddings (Norouzi et al. 2014, "Zero-Shot Learning by Convex Combination of Semantic
  Embeddings") built from EfficientNet-Lite0 and all-MiniLM-L6-v2, plus the classifier's
  penultimate features for image→image similarity. See the class docstring for the layout.
* :class:`ClipEmbedder` – CLIP or SigLIP dual encoders through transformers.
* :class:`VlmEmbedder` – instruction-aware last-token pooling of a VLM backend
  (VLM2Vec / Qwen3-VL-Embedding style).

Every embedder has a fingerprint (model, revision, preprocessing) and a ``digest`` of it;
cached vectors and indexes are keyed by that digest, so changing anything that changes the
vectors gives a fresh cache rather than silently mixing spaces. Outputs are always
L2-normalised float32 ``[n, dim]``.

This module never imports torch, transformers or ``refsight.backends`` at import time.
"""

from __future__ import annotations

import abc
import functools
import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from refsight.errors import InvalidInputError, ModelLoadError
from refsight.images import ImageInput
from refsight.package import canonical_json

__all__ = [
    "Embedder",
    "EfficientNetConSEEmbedder",
    "ClipEmbedder",
    "VlmEmbedder",
    "default_embedder",
]


class Embedder(abc.ABC):
    """Maps images and texts into one vector space; subclasses implement the two ``_embed_*``."""

    #: short human-readable name, reported by search results
    name: str = "embedder"
    #: vectors per model call
    batch_size: int = 16

    @property
    @abc.abstractmethod
    def dim(self) -> int:
        """Dimension of every vector this embedder returns."""

    @abc.abstractmethod
    def fingerprint(self) -> dict[str, Any]:
        """Everything that changes the vectors: model, revision/weights hash, preprocessing."""

    @functools.cached_property
    def digest(self) -> str:
        """Stable short hash of :meth:`fingerprint`; names the cache rows and index folders."""
        return hashlib.sha256(canonical_json(self.fingerprint()).encode()).hexdigest()[:24]

    @abc.abstractmethod
    def _embed_images(self, images: list[ImageInput]) -> np.ndarray:
        """Embed one batch of images (not necessarily normalised)."""

    @abc.abstractmethod
    def _embed_texts(self, texts: list[str], instruction: str | None) -> np.ndarray:
        """Embed one batch of texts (not necessarily normalised)."""

    def embed_images(self, images: Sequence[ImageInput]) -> np.ndarray:
        """Unit float32 vectors [n, dim] for reference or query images."""
        if isinstance(images, ImageInput):
            raise InvalidInputError("images", "expected a list of ImageInput, got a single image")
        images = list(images)
        for i, im in enumerate(images):
            if not isinstance(im, ImageInput):
                raise InvalidInputError(f"images[{i}]", f"expected an ImageInput (use refsight.images.load_image), got {type(im).__name__}")
        return self._batched(images, self._embed_images)

    def embed_texts(self, texts: Sequence[str], instruction: str | None = None) -> np.ndarray:
        """Unit float32 vectors [n, dim] for text queries; ``instruction`` is used where the model supports it."""
        if isinstance(texts, str):
            raise InvalidInputError("texts", "expected a list of strings, got a single string")
        texts = list(texts)
        for i, t in enumerate(texts):
            if not isinstance(t, str) or not t.strip():
                raise InvalidInputError(f"texts[{i}]", "a text query must be a non-empty string")
        if instruction is not None and not isinstance(instruction, str):
            raise InvalidInputError("instruction", f"must be a string or None, got {type(instruction).__name__}")
        return self._batched(texts, lambda chunk: self._embed_texts(chunk, instruction))

    def _batched(self, items: list, fn) -> np.ndarray:
        if not items:
            return np.zeros((0, self.dim), np.float32)
        parts = [np.asarray(fn(items[s : s + self.batch_size]), np.float32) for s in range(0, len(items), self.batch_size)]
        out = np.concatenate(parts)
        if out.shape != (len(items), self.dim):
            raise ModelLoadError(self.name, f"produced shape {out.shape}, expected {(len(items), self.dim)}")
        return _l2(out)


def _l2(x: np.ndarray) -> np.ndarray:
    # epsilon: an all-zero vector stays zero instead of becoming NaN
    return (x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)).astype(np.float32)


# --------------------------------------------------------------------------------------------
# default: EfficientNet-Lite0 + MiniLM, ConSE


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
    (crops, flips, colour and scale changes, the other view of the stereo motorcycle pair), the
    penultimate features rank the right photo first more often and by a wider margin than
    ConSE alone, which collapses photos whose top labels are uncertain (e.g. the astronaut or the
    horse silhouette) onto similar label mixtures (``tests/retrieval/test_embedders.py`` measures
    it). The default ``a² = 0.25`` keeps some semantic pull without losing that precision.
    """

    name = "efficientnet-lite0-conse"

    def __init__(self, *, top_t: int = 10, conse_weight: float = 0.25, label_template: str = "a photo of a {}"):
        if not isinstance(top_t, int) or not 1 <= top_t <= 1000:
            raise InvalidInputError("top_t", f"must be an integer in 1..1000, got {top_t!r}")
        if not 0.0 < conse_weight <= 1.0:
            raise InvalidInputError("conse_weight", f"must be in (0, 1], got {conse_weight!r}")
        if "{}" not in label_template:
            raise InvalidInputError("label_template", "must contain '{}' where the class name goes")
        from refsight.models.efficientnet_lite import load_efficientnet_lite0
        from refsight.models.minilm import load_minilm

        self.classifier = load_efficientnet_lite0()
        self.text_encoder = load_minilm()
        self.top_t = top_t
        self.conse_weight = float(conse_weight)
        self.label_template = label_template
        self._a = float(np.sqrt(conse_weight))
        self._b = float(np.sqrt(1.0 - conse_weight))
        self._label_vectors = _label_vectors(label_template)

    @property
    def dim(self) -> int:
        """384 (MiniLM) + 1280 (EfficientNet features)."""
        return 384 + 1280

    @property
    def text_score_scale(self) -> float:
        """Text queries score at most this (``a``); divide by it for a plain cosine."""
        return self._a

    def fingerprint(self) -> dict[str, Any]:
        """Both models' fingerprints plus the ConSE recipe."""
        return {
            "embedder": "conse+features/v1",
            "image_model": self.classifier.fingerprint,
            "text_model": self.text_encoder.fingerprint,
            "top_t": self.top_t,
            "conse_weight": self.conse_weight,
            "label_template": self.label_template,
        }

    def conse(self, probabilities: np.ndarray) -> np.ndarray:
        """ConSE vectors [n, 384] from class probabilities [n, 1000]."""
        top = np.argsort(-probabilities, axis=1)[:, : self.top_t]
        weights = np.take_along_axis(probabilities, top, 1)
        weights = weights / np.maximum(weights.sum(1, keepdims=True), 1e-12)
        vecs = np.einsum("nt,ntd->nd", weights, self._label_vectors[top])
        return _l2(vecs)

    def _embed_images(self, images: list[ImageInput]) -> np.ndarray:
        feats, probs = self.classifier.features_and_probabilities([im.image for im in images])
        return np.concatenate([self._a * self.conse(probs), self._b * feats], axis=1)

    def _embed_texts(self, texts: list[str], instruction: str | None) -> np.ndarray:
        # MiniLM is not instruction-tuned: the instruction is accepted and ignored on purpose
        m = self.text_encoder.encode(texts)
        return np.concatenate([m, np.zeros((len(texts), 1280), np.float32)], axis=1)


@functools.cache
def _label_vectors(template: str) -> np.ndarray:
    """MiniLM embeddings of the 1000 class names, [1000, 384].

    Embedding 1000 sentences costs seconds to a minute on a busy CPU, so the vectors for the
    default template ship precomputed (``refsight/models/imagenet_labels_minilm.npy``). They
    are used only when their recorded template, text-model weights hash and labels-file hash
    all match this process; otherwise they are computed here.
    """
    import json
    from importlib import resources

    from refsight.models.efficientnet_lite import imagenet_labels
    from refsight.models.minilm import load_minilm

    encoder = load_minilm()
    pkg = resources.files("refsight.models")
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


@functools.cache
def default_embedder() -> Embedder:
    """The offline default: :class:`EfficientNetConSEEmbedder` (one per process)."""
    return EfficientNetConSEEmbedder()


# --------------------------------------------------------------------------------------------
# CLIP / SigLIP


class ClipEmbedder(Embedder):
    """A CLIP or SigLIP dual encoder from a hub id or local directory, via transformers.

    Uses the model classes and the PIL image processors (``CLIPImageProcessorPil`` /
    ``SiglipImageProcessorPil``), never the ``*Processor`` wrappers that need torchvision.
    ``instruction`` is ignored (these models are not instruction-tuned).
    """

    def __init__(self, model_id_or_dir: str | Path, *, revision: str | None = None, local_files_only: bool = True):
        import transformers
        from transformers import AutoConfig, AutoTokenizer

        self.source = str(model_id_or_dir)
        kwargs = {"revision": revision, "local_files_only": local_files_only}
        try:
            config = AutoConfig.from_pretrained(self.source, **kwargs)
            kind = config.model_type
            if kind == "clip":
                model_cls, proc_cls = transformers.CLIPModel, transformers.CLIPImageProcessorPil
            elif kind == "siglip":
                model_cls, proc_cls = transformers.SiglipModel, transformers.SiglipImageProcessorPil
            else:
                raise ModelLoadError(self.source, f"model_type {kind!r} is not a CLIP or SigLIP dual encoder")
            self.model = model_cls.from_pretrained(self.source, **kwargs).eval()
            self.tokenizer = AutoTokenizer.from_pretrained(self.source, **kwargs)
            try:
                self.image_processor = proc_cls.from_pretrained(self.source, **kwargs)
            except OSError:
                # no preprocessor_config.json: the family defaults at the model's image size
                size = config.vision_config.image_size
                self.image_processor = proc_cls(size={"height": size, "width": size} if kind == "siglip" else {"shortest_edge": size},
                                                **({"crop_size": {"height": size, "width": size}} if kind == "clip" else {}))
        except ModelLoadError:
            raise
        except Exception as exc:
            raise ModelLoadError(self.source, f"cannot load CLIP/SigLIP model: {exc}") from exc
        self.kind = kind
        self.name = f"{kind}:{Path(self.source).name or self.source}"
        self._dim = int(config.projection_dim) if kind == "clip" else int(config.text_config.hidden_size)
        self._revision = revision or getattr(config, "_commit_hash", None) or _dir_digest(self.source)
        self._max_len = 64 if kind == "siglip" else 77

    @property
    def dim(self) -> int:
        """The shared projection size."""
        return self._dim

    def fingerprint(self) -> dict[str, Any]:
        """Model source, revision (commit hash or weights hash), image preprocessing."""
        proc = self.image_processor.to_dict()
        keep = {k: proc.get(k) for k in ("size", "crop_size", "image_mean", "image_std", "resample", "do_center_crop", "rescale_factor")}
        return {"embedder": f"{self.kind}/v1", "model": self.source, "revision": self._revision, "preprocessing": keep}

    def _embed_images(self, images: list[ImageInput]) -> np.ndarray:
        import torch

        pixels = self.image_processor([im.image for im in images], return_tensors="pt")["pixel_values"]
        with torch.inference_mode():
            out = self.model.get_image_features(pixel_values=pixels)
        return _pooled(out).float().numpy()

    def _embed_texts(self, texts: list[str], instruction: str | None) -> np.ndarray:
        import torch

        # SigLIP was trained on max_length padding; CLIP uses its EOS position, padding is harmless
        padding = "max_length" if self.kind == "siglip" else True
        enc = self.tokenizer(texts, padding=padding, truncation=True, max_length=self._max_len, return_tensors="pt")
        with torch.inference_mode():
            out = self.model.get_text_features(**{k: v for k, v in enc.items() if k in ("input_ids", "attention_mask")})
        return _pooled(out).float().numpy()


def _pooled(out):
    # transformers 5 returns a ModelOutput whose pooler_output holds the projected embedding
    return out if hasattr(out, "float") else out.pooler_output


def _dir_digest(source: str) -> str | None:
    """sha256 over a local model directory's weight files (a revision for unversioned dirs)."""
    path = Path(source)
    if not path.is_dir():
        return None
    h = hashlib.sha256()
    for f in sorted(path.glob("*.safetensors")) + sorted(path.glob("*.bin")):
        h.update(f.name.encode())
        with f.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


# --------------------------------------------------------------------------------------------
# instruction-aware VLM embedder


class VlmEmbedder(Embedder):
    """Last-token pooling of a VLM's final hidden state over an instruction plus image or text.

    The recipe of VLM2Vec and Qwen3-VL-Embedding: the decoder reads the chat-formatted
    ``<instruction> <image or text>`` and the final-layer hidden state of the last prompt token
    is the embedding. Works with any transformers backend of :mod:`refsight.backends.hf`
    (it uses only their public prompt/encode methods): images go through ``backend.encode``,
    and :meth:`embed_packages` takes already cached visual packages, so a reference's vision
    tower output is reused instead of re-encoding the image. A backend may instead provide its
    own ``embed_last_token(items, instruction)`` and ``embedding_dim``.

    ``refsight.backends`` is imported only when a backend is named by string.
    """

    default_instruction = "Represent the given image for retrieving similar images."
    default_text_instruction = "Find an image that matches the given text."

    def __init__(self, backend: Any, *, instruction: str | None = None):
        if isinstance(backend, str):
            from refsight.backends import get_backend

            backend = get_backend(backend)
        self._custom = callable(getattr(backend, "embed_last_token", None))
        generic = all(hasattr(backend, a) for a in ("encode", "build_prompt", "multimodal_inputs", "model", "tokenizer"))
        if not (self._custom or generic):
            raise ModelLoadError(getattr(backend, "name", str(backend)),
                                 "backend has neither embed_last_token() nor the transformers prompt methods; it cannot embed")
        self.backend = backend
        self.name = f"vlm:{backend.name}"
        self.image_instruction = instruction or self.default_instruction
        if self._custom:
            self._dim = int(backend.embedding_dim)
        else:
            cfg = backend.model.config
            self._dim = int(getattr(getattr(cfg, "text_config", cfg), "hidden_size"))
        self.batch_size = 4

    @property
    def dim(self) -> int:
        """The language model's hidden size."""
        return self._dim

    def fingerprint(self) -> dict[str, Any]:
        """The backend's encoder fingerprint plus the pooling recipe and image instruction."""
        fp = self.backend.fingerprint()
        return {
            "embedder": "vlm-last-token/v1",
            "backend": fp.to_dict() if hasattr(fp, "to_dict") else fp,
            "image_instruction": self.image_instruction,
        }

    def embed_packages(self, packages: Sequence[Any]) -> np.ndarray:
        """Unit vectors for references from their cached visual packages (no vision tower run)."""
        packages = list(packages)
        if self._custom:
            raise ModelLoadError(self.name, "this backend embeds images itself; pass images instead")
        return self._batched(packages, lambda chunk: self._pool([[self.image_instruction, p] for p in chunk]))

    def _embed_images(self, images: list[ImageInput]) -> np.ndarray:
        if self._custom:
            return np.asarray(self.backend.embed_last_token(images, self.image_instruction), np.float32)
        return self._pool([[self.image_instruction, p] for p in self.backend.encode(images)])

    def _embed_texts(self, texts: list[str], instruction: str | None) -> np.ndarray:
        instruction = instruction or self.default_text_instruction
        if self._custom:
            return np.asarray(self.backend.embed_last_token(texts, instruction), np.float32)
        return self._pool([[instruction, t] for t in texts])

    def _pool(self, rows: list[list[Any]]) -> np.ndarray:
        import torch

        b = self.backend
        texts = [b.build_prompt(row) for row in rows]
        packages = [seg for row in rows for seg in row if not isinstance(seg, str)]
        # left padding (the backends set it) puts every row's last prompt token at position -1
        b.tokenizer.padding_side = "left"
        enc = b.tokenizer(texts, padding=True, return_tensors="pt", add_special_tokens=False)
        extra = b.multimodal_inputs(packages, enc["input_ids"]) if packages else {}
        with torch.inference_mode():
            out = b.model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"], **extra,
                          output_hidden_states=True, use_cache=False)
        return out.hidden_states[-1][:, -1, :].float().numpy()
