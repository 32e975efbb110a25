"""What refsight knows about each model type, one entry per model type: the family entries.

A :class:`~.entry.Family` holds its model type's transformers traits and, per runtime, the built-in
that proves it (and the test), why the runtime is left out, and the facts that runtime's code reads
by model type (:mod:`.entry`). :data:`FAMILIES` is the one place they are registered; every per-model-type
table elsewhere is read off it: the generic transformers backend's traits (``backends/hf/classes.py``),
the family table ``refsight models`` prints (``backends/family_table.py``), the tiny recipes the
built-ins are made from (``builtin_models/family_checkpoints.py``), llama.cpp's window-bound
architectures and vLLM's image-embeddings families and hub layouts.

Data only, on the ground floor: nothing here imports torch, transformers or another room of refsight.
"""

from __future__ import annotations

from .entry import Family
from .kin import KIN, LEFT_OUT, TORCHVISION_ONLY
from .primary import PRIMARY

__all__ = ["FAMILIES", "family"]

#: Model type → its entry (the one registry of family knowledge).
FAMILIES: dict[str, Family] = {f.model_type: f for f in (*PRIMARY, *KIN, *TORCHVISION_ONLY, *LEFT_OUT)}


def family(model_type: str) -> Family:
    """The entry of ``model_type``; one with every default (no built-in, transformers' defaults) when it has none."""
    return FAMILIES.get(model_type) or Family(model_type)
