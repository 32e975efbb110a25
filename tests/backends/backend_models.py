"""Names shared by the backend tests (a uniquely named module: see tests/image_corpus.py)."""

from refsight.builtin_models.family_checkpoints import FAMILY_SPECS

#: The tiny checkpoints of the families with a module of their own (Qwen, SmolVLM).
TINY_FAMILIES = ("tiny-qwen2-vl", "tiny-qwen2.5-vl", "tiny-qwen3-vl", "tiny-smolvlm")
#: The tiny checkpoints of the families the generic backend serves (Gemma 3, LLaVA, InternVL ...).
GENERIC_FAMILIES = tuple(FAMILY_SPECS)
#: Every tiny transformers family.
ALL_FAMILIES = TINY_FAMILIES + GENERIC_FAMILIES
#: Tower calls per image where a family's get_image_features runs its tower more than once (Step 3.7: the global
#: view, then the local crops); every other family: one.
TOWER_CALLS = {"tiny-step3p7": 2}


def vision_tower(backend):
    """The module that runs the vision encoder of a transformers backend (whatever the family calls it)."""
    inner = backend.model.model
    # embed_vision: the encoder-free Gemma 4's patch embedding, its whole "tower".
    for name in ("visual", "vision_model", "vision_tower", "image_tower", "vision_encoder", "embed_vision"):
        tower = getattr(inner, name, None)
        if tower is not None:
            return tower
    # Emu3: the VQ-VAE's encoder (get_image_features calls vqmodel.encode, never the VQ-VAE's forward).
    vqmodel = getattr(inner, "vqmodel", None)
    if vqmodel is not None:
        return vqmodel.encoder
    raise AttributeError(f"{type(inner).__name__} has no vision tower attribute")
