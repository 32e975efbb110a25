"""A BERT encoder in plain torch: the forward of transformers' ``BertModel`` over its own safetensors weights.

Why not ``AutoModel``: importing transformers' model stack costs ~2.5 s of a process's start, and a
text ``refsight search`` needs nothing else from it (its whole model is all-MiniLM-L6-v2, six small
layers). The computation is transformers' own, step for step (embeddings with their LayerNorm;
per layer: scaled dot-product attention over the non-padding keys, output projection, residual,
LayerNorm, the GELU feed-forward, residual, LayerNorm), so its states match ``BertModel``'s to
float rounding (``tests/embedders/test_minilm.py`` compares them). Inference only, absolute position
embeddings only.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

__all__ = ["BertEncoder"]


class BertEncoder:
    """``BertEncoder(directory)``: ``config.json`` + ``model.safetensors``; :meth:`__call__` gives the last hidden states."""

    def __init__(self, directory: Path) -> None:
        from safetensors.torch import load_file

        config = json.loads((Path(directory) / "config.json").read_text("utf-8"))
        if config.get("model_type") != "bert" or config.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError(f"{directory}: not a BERT model with absolute positions")
        if config.get("hidden_act") != "gelu":
            raise ValueError(f"{directory}: hidden_act {config.get('hidden_act')!r}, only 'gelu' is implemented")
        self.heads = int(config["num_attention_heads"])
        self.layers = int(config["num_hidden_layers"])
        self.eps = float(config["layer_norm_eps"])
        self.hidden = int(config["hidden_size"])
        weights = load_file(str(Path(directory) / "model.safetensors"))
        # Checkpoints saved from BertForX prefix every name with "bert.".
        self.w: dict[str, torch.Tensor] = {k.removeprefix("bert."): v.float() for k, v in weights.items()}

    def _norm(self, x: torch.Tensor, name: str) -> torch.Tensor:
        return F.layer_norm(x, (self.hidden,), self.w[f"{name}.weight"], self.w[f"{name}.bias"], self.eps)

    def _linear(self, x: torch.Tensor, name: str) -> torch.Tensor:
        return F.linear(x, self.w[f"{name}.weight"], self.w[f"{name}.bias"])

    def _embed(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1])
        x = (self.w["embeddings.word_embeddings.weight"][input_ids]
             + self.w["embeddings.token_type_embeddings.weight"][token_type_ids]
             + self.w["embeddings.position_embeddings.weight"][positions])
        return self._norm(x, "embeddings.LayerNorm")

    def _attention(self, x: torch.Tensor, mask: torch.Tensor, name: str) -> torch.Tensor:
        batch, length, _ = x.shape
        split = [self._linear(x, f"{name}.self.{part}").view(batch, length, self.heads, -1).transpose(1, 2)
                 for part in ("query", "key", "value")]
        context = F.scaled_dot_product_attention(*split, attn_mask=mask, scale=1 / math.sqrt(self.hidden // self.heads))
        context = context.transpose(1, 2).reshape(batch, length, self.hidden)
        return self._norm(self._linear(context, f"{name}.output.dense") + x, f"{name}.output.LayerNorm")

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: Any = None) -> torch.Tensor:
        """The last hidden states, [batch, length, hidden], of a padded batch (``attention_mask`` 1 = token)."""
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        with torch.inference_mode():
            x = self._embed(input_ids, token_type_ids)
            # Additive mask over the keys, as transformers builds it: padding gets the dtype's minimum.
            mask = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min
            for i in range(self.layers):
                name = f"encoder.layer.{i}"
                x = self._attention(x, mask, f"{name}.attention")
                inner = F.gelu(self._linear(x, f"{name}.intermediate.dense"))
                x = self._norm(self._linear(inner, f"{name}.output.dense") + x, f"{name}.output.LayerNorm")
        return x
