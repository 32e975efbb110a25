"""One image's ``get_image_features`` output as named tensors, and several of them joined back into one.

Families return their features in different shapes: one batched tensor (Gemma 3, InternVL:
``[tiles, tokens, hidden]``), a list or tuple of per-image or per-tile tensors (LLaVA,
Mistral 3, MiniCPM-V), and some add per-layer structures beside them (Qwen3-VL-MoE's
``deepstack_features``: a list over layers of per-image tuples). :func:`pack` stores the main
field as ``features`` (or ``features.0`` ...) and each such extra field under its own name,
with a small description of the nesting; :func:`join` rebuilds, from the packages of one
prompt in order, the output a single call over all those images would have returned: tensors
concatenate on their first axis, sequences of tensors concatenate as sequences, and sequences
of sequences (per-layer structures) join layer by layer.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["pack", "join", "split", "tensor_names", "MAIN"]

#: The storage name of the main feature field, whatever the family calls it.
MAIN = "features"
# Output fields that are never part of what the forward reads back.
# (DeepSeek-VL-Hybrid's SAM tower reports its own under high_res_vision_*.)
_SKIPPED = {"hidden_states", "attentions", "high_res_vision_hidden_states", "high_res_vision_attentions"}


def pack(output: Any, field: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(tensors, structure)`` of one image's output: ``field`` as :data:`MAIN`, plus every other
    sequence-valued field; ``structure`` names the output class and each field's nesting."""
    fields = {MAIN: (field, getattr(output, field))}
    for name, value in output.items():
        if name != field and name not in _SKIPPED and isinstance(value, (list, tuple)):
            fields[name] = (name, value)
    tensors: dict[str, Any] = {}
    shapes: dict[str, Any] = {}
    for stored, (name, value) in fields.items():
        shapes[stored] = {"field": name, "nesting": _flatten(stored, value, tensors)}
    structure = {"class": f"{type(output).__module__}:{type(output).__qualname__}", "fields": shapes}
    return tensors, structure


def split(output: Any, field: str, count: int) -> list[Any]:
    """The outputs of ``count`` images, one each, from one call over all of them (the inverse of :func:`join`),
    for families whose sequence fields hold one tensor per image (per layer, for per-layer fields).

    Only what :func:`pack` stores is split: ``field`` and the other sequence-valued fields.
    :class:`ValueError` when a field does not hold one entry per image.
    """
    kept = {name: value for name, value in output.items()
            if name == field or (name not in _SKIPPED and isinstance(value, (list, tuple)))}
    pieces = {name: _split_value(name, value, count) for name, value in kept.items()}
    return [type(output)(**{name: parts[i] for name, parts in pieces.items()}) for i in range(count)]


def _split_value(name: str, value: Any, count: int) -> list[Any]:
    if isinstance(value, (list, tuple)):
        kind = type(value)
        if _one_tensor_each(value, count):
            return [kind([v]) for v in value]
        if value and all(isinstance(v, (list, tuple)) for v in value):
            layers = [_split_value(name, layer, count) for layer in value]
            return [kind(layer[i] for layer in layers) for i in range(count)]
    raise ValueError(f"{name} does not hold one entry per image of the {count}")


def _one_tensor_each(value: list[Any] | tuple[Any, ...], count: int) -> bool:
    """``value`` holds one tensor per image."""
    return len(value) == count and all(hasattr(v, "shape") for v in value)


def _flatten(prefix: str, value: Any, into: dict[str, Any]) -> Any:
    """Store ``value``'s tensors under ``prefix``, ``prefix.0`` ...; return its nesting ("tensor" or a list)."""
    if hasattr(value, "shape"):
        into[prefix] = value.contiguous().clone()
        return "tensor"
    kind = "tuple" if isinstance(value, tuple) else "list"
    return {kind: [_flatten(f"{prefix}.{i}", item, into) for i, item in enumerate(value)]}


def _rebuild(prefix: str, nesting: Any, tensors: dict[str, Any]) -> Any:
    if nesting == "tensor":
        return tensors[prefix]
    (kind, items), = nesting.items()
    values = [_rebuild(f"{prefix}.{i}", item, tensors) for i, item in enumerate(items)]
    return tuple(values) if kind == "tuple" else values


def tensor_names(structure: dict[str, Any]) -> list[str]:
    """Every tensor name a package of this ``structure`` must hold."""
    names: list[str] = []

    def walk(prefix: str, nesting: Any) -> None:
        if nesting == "tensor":
            names.append(prefix)
            return
        (_, items), = nesting.items()
        for i, item in enumerate(items):
            walk(f"{prefix}.{i}", item)

    for stored, shape in structure["fields"].items():
        walk(stored, shape["nesting"])
    return names


def _merge(values: list[Any]) -> Any:
    """Several images' values of one field, as one call over all of them returns it."""
    import torch

    first = values[0]
    if isinstance(first, torch.Tensor):
        return torch.cat(values, dim=0)
    if len(first) and isinstance(first[0], torch.Tensor):
        joined = [item for value in values for item in value]
        return tuple(joined) if isinstance(first, tuple) else joined
    layers = [_merge(list(layer)) for layer in zip(*values)]
    return tuple(layers) if isinstance(first, tuple) else layers


def join(packages: list[Any]) -> Any:
    """The ``mm_encoder_outputs["image"]`` object of these packages, in prompt order."""
    structure = packages[0].metadata["structure"]
    output_class = _output_class(structure["class"])
    fields = {}
    for stored, shape in structure["fields"].items():
        values = [_rebuild(stored, p.metadata["structure"]["fields"][stored]["nesting"], p.tensors) for p in packages]
        fields[shape["field"]] = _merge(values)
    return output_class(**fields)


def _output_class(path: str) -> Any:
    """The output class a package names, which must be one of transformers' ``ModelOutput`` classes
    (a package read from disk must not make refsight import anything else)."""
    from transformers.utils import ModelOutput

    module, _, name = path.partition(":")
    if not module.startswith("transformers."):
        raise ValueError(f"output class {path!r} is not a transformers class")
    cls = getattr(importlib.import_module(module), name, None)
    if not (isinstance(cls, type) and issubclass(cls, ModelOutput)):
        raise ValueError(f"output class {path!r} is not a transformers ModelOutput")
    return cls
