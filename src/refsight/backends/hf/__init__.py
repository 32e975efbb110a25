"""Hugging Face transformers backends: one generic backend for every family with transformers' seam.

:func:`load_hf_backend` takes ``hf:<hub id or local directory>``, reads the config,
picks the family from ``config.model_type`` (:func:`family_for`: a
:class:`~.generic.GenericBackend` class for any model type with transformers'
precomputed-features seam, its exceptions from :mod:`.families`) and loads everything
with ``from_pretrained``. A model that cannot be loaded (offline, missing files,
unsupported architecture) raises :class:`~refsight.errors.ModelLoadError` saying which.
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
    from .generic import generic_family

    try:
        return generic_family(model_type, name)
    except ModelLoadError as e:
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
    hub_revision: dict[str, str] = {}
    if not os.path.isdir(source):
        # Pin the commit first: the config must come from the same commit as the weights.
        options["revision"] = resolve_hub_revision(name, source, options.get("revision"))
        hub_revision = {"revision": options["revision"]}
    try:
        config = AutoConfig.from_pretrained(source, **hub_revision)
    except OSError as e:
        offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in {"1", "true", "yes", "on"}
        hint = " (HF_HUB_OFFLINE is set and the model is not in the local cache)" if offline else ""
        raise ModelLoadError(name, f"cannot load the config of {source}{hint}: {e}") from e
    except MemoryError as e:
        raise ModelLoadError(name, f"out of memory reading the config of {source}") from e
    except (ValueError, KeyError) as e:
        # transformers raises ValueError / KeyError for a model_type it does not know.
        raise ModelLoadError(name, f"unsupported architecture in {source}: {e}") from e
    backend_class = family_for(getattr(config, "model_type", ""), name)
    return backend_class.from_pretrained(name, source, config, **options)
