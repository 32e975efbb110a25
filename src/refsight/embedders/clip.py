"""CLIP and SigLIP dual encoders through transformers, as embedders (``clip:PATH`` in the registry).

transformers and torch are imported only when a model loads or runs.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np

from refsight.errors import ModelLoadError
from refsight.inputs.images import ImageInput
from refsight.embedders._errors import embedder_errors
from refsight.embedders.base import Embedder

__all__ = ["ClipEmbedder", "load_clip"]



class ClipEmbedder(Embedder):
    """A CLIP or SigLIP dual encoder from a hub id or local directory, via transformers.

    Uses the model classes and the PIL image processors (``CLIPImageProcessorPil`` /
    ``SiglipImageProcessorPil``), never the ``*Processor`` wrappers that need torchvision.
    ``instruction`` is ignored (these models are not instruction-tuned).
    """

    def __init__(self, model_id_or_dir: str | Path, *, revision: str | None = None, local_files_only: bool = True):
        self.source = str(model_id_or_dir)
        from refsight.backends.hf.model_source import check_config, hub_kwargs

        # trust_remote_code=False: a model folder's code never runs (refsight.backends.hf.model_source).
        kwargs = {**hub_kwargs(revision), "local_files_only": local_files_only}
        if Path(self.source).is_dir():
            check_config(self.source, self.source)  # custom code and absurd sizes refused before transformers reads it
        with embedder_errors(self.source, ModelLoadError, "cannot load CLIP/SigLIP model"):
            import transformers
            from transformers import AutoConfig, AutoTokenizer

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

        with embedder_errors(self.name, what="embed images"), torch.inference_mode():
            pixels = self.image_processor([im.image for im in images], return_tensors="pt")["pixel_values"]
            out = self.model.get_image_features(pixel_values=pixels)
            return _pooled(out).float().numpy()

    def _embed_texts(self, texts: list[str], instruction: str | None) -> np.ndarray:
        import torch

        # SigLIP was trained on max_length padding; CLIP uses its EOS position, padding is harmless
        padding = "max_length" if self.kind == "siglip" else True
        with embedder_errors(self.name, what="embed texts"), torch.inference_mode():
            enc = self.tokenizer(texts, padding=padding, truncation=True, max_length=self._max_len, return_tensors="pt")
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


def load_clip(name: str) -> ClipEmbedder:
    """Registry factory for ``clip:PATH``: a CLIP/SigLIP model from a local directory (or cached hub id)."""
    return ClipEmbedder(name.partition(":")[2])
