"""What each language-model layer keeps in an HF prefix state, and how it goes back into a batch's cache.

A prefix state holds, per layer of the language model, what that layer's cache holds after
the prefix alone (batch 1, no padding). The layer's kind decides what that is
(:func:`layer_kinds` reads it off transformers' own ``DynamicCache`` for the model's config):

- ``"full"`` (``DynamicLayer``) and ``"sliding"`` (``DynamicSlidingWindowLayer``: Gemma 3,
  Cohere 2): ``key.{i}`` and ``value.{i}``, ``[1, kv_heads, tokens, head_dim]`` after RoPE, in
  the model dtype (the layer's own heads and head size: Gemma 4's full layers have others than
  its sliding ones). A sliding layer keeps the whole prefix too (recorded), so a batch may lay
  the columns out as it needs; its own ``update`` then keeps the window.
- ``"shared"`` (``DummyLayer``: Gemma 4's KV-shared layers): nothing. Such a layer attends with
  the keys and values its producer layer (the last unshared one of its type) returns from its own
  cache in the same forward, and the producer's state is in the prefix state.
- ``"linear"`` (``LinearAttentionLayer`` of a Gated DeltaNet: Qwen3.5, Qwen3.5-MoE, the language
  model of MiniCPM-V 4.6): ``conv.{i}``, the causal convolution's last ``kernel`` inputs
  ``[1, conv_dim, kernel]`` in the model dtype, and ``recurrent.{i}``, the delta rule's state
  ``[1, v_heads, k_head_dim, v_head_dim]`` (float32: the kernel keeps it so). A recurrent state
  sums the whole prefix in order: it cannot be cut or padded, so the prefix it follows must be
  the row's exact head, with nothing between it and the suffix
  (:meth:`~.prefix_cache.PrefixBatch.parts`).

Any other layer (indexed or compressed attention, a linear layer of another shape) is no kind
here: those models run the plain path.
"""

from __future__ import annotations

from typing import Any

__all__ = ["layer_kinds", "expected_tensors", "snapshot", "fill", "ATTENTION_KINDS"]

#: The kinds whose state is the layer's keys and values.
ATTENTION_KINDS = ("full", "sliding")
#: The config fields of a Gated DeltaNet layer (Qwen3-Next, Qwen3.5): the shapes of its states follow from them.
_DELTANET_FIELDS = ("linear_conv_kernel_dim", "linear_key_head_dim", "linear_value_head_dim", "linear_num_key_heads",
                    "linear_num_value_heads")


def _text_config(backend: Any) -> Any:
    return backend.model.config.get_text_config(decoder=True)


def layer_kinds(backend: Any) -> list[str] | None:
    """Each language-model layer's kind (module docstring), or None when some layer has none (plain path)."""
    from transformers import DynamicCache
    from transformers.cache_utils import DummyLayer, DynamicLayer, DynamicSlidingWindowLayer, LinearAttentionLayer

    cache = DynamicCache(config=backend.model.config)
    deltanet = all(getattr(_text_config(backend), name, None) is not None for name in _DELTANET_FIELDS)
    kinds: list[str] = []
    for layer in cache.layers:
        if type(layer) is DynamicLayer:
            kinds.append("full")
        elif type(layer) is DynamicSlidingWindowLayer:
            kinds.append("sliding")
        elif type(layer) is LinearAttentionLayer and deltanet and layer.number_of_states == 1:
            kinds.append("linear")
        elif type(layer) is DummyLayer:
            kinds.append("shared")
        else:
            return None
    return kinds if any(kind != "shared" for kind in kinds) else None


def _kv_shape(backend: Any, layer: int) -> tuple[int, int, int]:
    """(KV heads, key size, value size) of attention layer ``layer``'s cache: its own where the config varies
    them per layer. Multi-head latent attention (DeepSeek-V3's, Kimi K2.5's) caches its two latents as one
    head each: the compressed keys and values (``kv_lora_rank``) as keys, the shared RoPE key as values."""
    text = _text_config(backend)
    views = getattr(text, "per_layer_config", None)
    config = views[layer] if views is not None else text
    heads = int(getattr(config, "num_key_value_heads", None) or config.num_attention_heads)
    if getattr(config, "kv_lora_rank", None):
        return 1, int(config.kv_lora_rank), int(config.qk_rope_head_dim)
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)
    return heads, head_dim, head_dim


def _deltanet_shapes(backend: Any) -> tuple[list[int], list[int]]:
    """(conv state shape, recurrent state shape) of one Gated DeltaNet layer, batch 1."""
    text = _text_config(backend)
    k_heads, v_heads = int(text.linear_num_key_heads), int(text.linear_num_value_heads)
    k_dim, v_dim = int(text.linear_key_head_dim), int(text.linear_value_head_dim)
    conv_dim = 2 * k_heads * k_dim + v_heads * v_dim
    return [1, conv_dim, int(text.linear_conv_kernel_dim)], [1, v_heads, k_dim, v_dim]


def expected_tensors(backend: Any, kinds: list[str], tokens: int) -> dict[str, tuple[list[int], tuple[Any, ...]]]:
    """Every tensor a state of ``tokens`` prefix tokens must hold: name → (shape, the dtypes allowed)."""
    import torch

    dtype = backend.model.dtype
    want: dict[str, tuple[list[int], tuple[Any, ...]]] = {}
    for i, kind in enumerate(kinds):
        if kind in ATTENTION_KINDS:
            heads, key_dim, value_dim = _kv_shape(backend, i)
            want[f"key.{i}"] = ([1, heads, tokens, key_dim], (dtype,))
            want[f"value.{i}"] = ([1, heads, tokens, value_dim], (dtype,))
        elif kind == "linear":
            conv, recurrent = _deltanet_shapes(backend)
            want[f"conv.{i}"] = (conv, (dtype,))
            # transformers' torch kernel keeps the recurrent state in float32; a fused kernel may keep the model's.
            want[f"recurrent.{i}"] = (recurrent, (torch.float32, dtype))
    return want


def snapshot(cache: Any, kinds: list[str]) -> dict[str, Any]:
    """The tensors of a cache filled by one batch-1 forward over the prefix, on the CPU (new memory)."""
    tensors: dict[str, Any] = {}
    for i, (kind, layer) in enumerate(zip(kinds, cache.layers)):
        if kind in ATTENTION_KINDS:
            tensors[f"key.{i}"] = layer.keys.detach().to("cpu").contiguous()
            tensors[f"value.{i}"] = layer.values.detach().to("cpu").contiguous()
        elif kind == "linear":
            tensors[f"conv.{i}"] = layer.conv_states[0].detach().to("cpu").clone().contiguous()
            tensors[f"recurrent.{i}"] = layer.recurrent_states[0].detach().to("cpu").clone().contiguous()
    return tensors


def fill(cache: Any, kinds: list[str], states: list[Any], width: int, backend: Any) -> None:
    """Put each row's state into ``cache`` (a new ``DynamicCache`` of the batch), through each layer's own update.

    ``states``: per row, its :class:`~refsight.backends.prefix.PrefixState` or None (no prefix: the row's
    whole prompt is its suffix). Attention layers get ``width`` columns per row, left-padded with zeros the
    attention mask hides; linear layers get each row's convolution and recurrent state, zeros for a row
    without one (exactly a fresh start: the causal convolution pads with zeros, the recurrence starts at
    zero). Every tensor is new memory (``torch.cat``): decoding updates the cache in place, and the stored,
    shared states must never change.
    """
    any_state = any(s is not None for s in states)
    for i, kind in enumerate(kinds):
        if kind in ATTENTION_KINDS:
            _fill_attention(cache, i, states, width, backend)
        elif kind == "linear" and any_state:  # else the layer stays empty: the part's prefill starts it fresh
            _fill_linear(cache, i, states, backend)


def _fill_attention(cache: Any, i: int, states: list[Any], width: int, backend: Any) -> None:
    """Attention layer ``i``: each row's keys and values, ``width`` columns, left-padded (zeros for a row without)."""
    import torch

    device, dtype = backend.device, backend.model.dtype
    heads, key_dim, value_dim = _kv_shape(backend, i)
    keys = [_columns(s, f"key.{i}", (1, heads, width, key_dim), device, dtype) for s in states]
    values = [_columns(s, f"value.{i}", (1, heads, width, value_dim), device, dtype) for s in states]
    # A sliding layer's own update keeps its last columns and counts the whole width, as a fresh prefill would.
    cache.update(torch.cat(keys, dim=0), torch.cat(values, dim=0), i)


def _fill_linear(cache: Any, i: int, states: list[Any], backend: Any) -> None:
    """Gated DeltaNet layer ``i``: each row's convolution and recurrent state (zeros for a row without)."""
    import torch

    device, dtype = backend.device, backend.model.dtype
    conv_shape, recurrent_shape = _deltanet_shapes(backend)
    conv = torch.cat([_state(s, f"conv.{i}", conv_shape, device, dtype) for s in states], dim=0)
    recurrent = [_state(s, f"recurrent.{i}", recurrent_shape, device, None) for s in states]
    recurrent_dtype = next(r.dtype for r, s in zip(recurrent, states) if s is not None)
    cache.update_conv_state(conv, i, conv_kernel_size=conv_shape[-1])
    cache.update_recurrent_state(torch.cat([r.to(recurrent_dtype) for r in recurrent], dim=0), i)


def _columns(state: Any, name: str, shape: tuple[int, ...], device: Any, dtype: Any) -> Any:
    """A row's keys or values as ``shape`` (the batch's width): left-padded with zeros, or all zeros."""
    import torch

    if state is None:
        return torch.zeros(shape, dtype=dtype, device=device)
    part = state.tensors[name].to(device, dtype)
    missing = shape[2] - part.shape[2]
    # Left padding: zeros the attention mask hides. A new tensor: the state stays as stored.
    return torch.nn.functional.pad(part, (0, 0, missing, 0)) if missing else part


def _state(state: Any, name: str, shape: list[int], device: Any, dtype: Any) -> Any:
    """A row's linear-layer state on ``device`` (``dtype`` None: as stored), or zeros for a row without one."""
    import torch

    if state is None:
        return torch.zeros(shape, dtype=dtype or torch.float32, device=device)
    tensor = state.tensors[name]
    return tensor.to(device, dtype) if dtype is not None else tensor.to(device)
