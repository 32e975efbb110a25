"""Hugging Face transformers backends: one generic backend for every family with transformers' seam.

:func:`load_hf_backend` takes ``hf:<hub id or local directory>``, reads the config,
picks the family from ``config.model_type`` (:func:`family_for`: a
:class:`~.generic.GenericBackend` class for any model type with transformers'
precomputed-features seam, its exceptions from :mod:`refsight.families`) and loads everything
with ``from_pretrained``. A model that cannot be loaded (offline, missing files,
unsupported architecture, custom code, sizes the weights do not have: :mod:`.model_source`)
raises :class:`~refsight.errors.ModelLoadError` saying which. A model folder's code never runs.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ...errors import ModelLoadError
from .base import HFBackend

__all__ = ["load_hf_backend", "family_for", "HFBackend"]


def family_for(model_type: str, name: str = "") -> type[HFBackend]:
    """The backend class serving ``model_type``; :class:`ModelLoadError` (one line, naming the
    proven model types and why this one cannot be served) if none does."""
    from .classes import family_classes, traits_for
    from .generic import generic_family
    from ...support.torchvision_cpu import missing_torchvision

    try:
        return generic_family(model_type, name)
    except ModelLoadError as e:
        missing = "" if traits_for(model_type).unavailable else missing_torchvision(family_classes(model_type))
        if missing:  # served once torchvision imports: not "unsupported"
            raise ModelLoadError(name or model_type, f"model type {model_type!r}: {missing}") from None
        from ..family_table import proven_model_types

        raise ModelLoadError(
            name or model_type,
            f"unsupported architecture {model_type!r} ({e.reason}); supported model types: "
            f"{', '.join(proven_model_types('transformers'))}",
        ) from None


def _looks_like_path(source: str) -> bool:
    # A hub id is "name" or "org/name"; anything else that is not one is a path.
    return source.startswith(("/", "./", "../", "~")) or source.count("/") > 1 or os.path.exists(source)


def load_hf_backend(name: str, *, source: str | None = None, **options: Any) -> HFBackend:
    """Load ``hf:<hub id or directory>`` (or ``source`` when given) as a refsight backend.

    ``options`` are the :class:`~refsight.backends.options.BackendOptions` fields —
    ``device``, ``dtype``, ``attn``, ``min_pixels``, ``max_pixels``, ``processor_kwargs``,
    ``revision``, ``batch_size`` (``mmproj`` and ``encoder`` belong to other runtimes and
    are refused by name) — plus ``model_id`` (the name in fingerprints), ``random_weights``
    and the family's own options (SmolVLM's ``tile_size`` / ``longest_edge`` / ``do_image_splitting``:
    :mod:`.load_options`).
    A hub revision is resolved to its commit before anything loads.
    """
    from transformers import AutoConfig

    from .base import refuse_other_backend_options
    from .model_source import check_config, hub_kwargs
    from .revision import resolve_hub_revision

    refuse_other_backend_options(options)
    if source is None:
        source = name[3:] if name.startswith("hf:") else name
    if not source:
        raise ModelLoadError(name, "no model given after 'hf:'")
    source = os.path.expanduser(source)
    if _looks_like_path(source):
        path = Path(source)
        if not path.exists():
            raise ModelLoadError(name, f"no such model directory: {source}")
        if not path.is_dir():
            raise ModelLoadError(name, f"{source} is a file; give the directory that holds config.json")
        if not (path / "config.json").is_file():
            raise ModelLoadError(name, f"missing files: {source} has no config.json")
        source = str(path.resolve())
    revision = None
    if not os.path.isdir(source):
        # Pin the commit first: the config must come from the same commit as the weights.
        options["revision"] = revision = resolve_hub_revision(name, source, options.get("revision"))
    # refsight reads config.json itself first: custom code and absurd sizes are refused, and the
    # family is known, before transformers is asked anything (it never runs the folder's code).
    model_type = check_config(name, source, revision)["model_type"]
    backend_class = family_for(model_type, name)
    try:
        config = AutoConfig.from_pretrained(source, **hub_kwargs(revision))
    except OSError as e:
        raise ModelLoadError(name, f"cannot load the config of {source}: {e}") from e
    except MemoryError as e:
        raise ModelLoadError(name, f"out of memory reading the config of {source}") from e
    except (ValueError, KeyError, TypeError) as e:
        # transformers raises these for a sub-config's unknown model_type or a field of the wrong type.
        raise ModelLoadError(name, f"unsupported config in {source}: {type(e).__name__}: {e}") from e
    return backend_class.from_pretrained(name, source, config, **options)
