"""Loading a transformers VLM for :class:`~.base.HFBackend`: options checked, processor built, weights loaded.

The order is the point: every option is checked and the image processor is built and
tried on one small image before the (possibly slow) weight load, so a wrong setting
fails in milliseconds with its name. A hub branch or tag is pinned to its commit first,
and every file is loaded at that commit, with ``trust_remote_code=False`` (:mod:`.model_source`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from ...errors import InvalidInputError, ModelLoadError
from .runtime import runtime_errors

__all__ = ["MARKER_FILE", "LoadedParts", "load_parts", "refuse_other_backend_options", "read_marker"]

#: A JSON file refsight writes next to the weights of the models it builds
#: (``{"random_weights": true, "model_id": ...}``); real checkpoints have none.
MARKER_FILE = "refsight_model.json"

#: Backend options that belong to other runtimes: the transformers backends refuse them by name.
_OTHER_RUNTIMES = {"mmproj": "the llama.cpp backend", "encoder": "the vLLM backend"}


@dataclass
class LoadedParts:
    """What :func:`load_parts` loaded: the constructor arguments of an ``HFBackend``."""

    model: Any
    tokenizer: Any
    image_processor: Any
    model_id: str
    revision: str
    random_weights: bool
    batch_size: int
    device: str
    #: The checkpoint's directory when it was loaded from one (None: a hub model).
    local_dir: str | None = None


def refuse_other_backend_options(options: Mapping[str, Any]) -> None:
    """Raise :class:`InvalidInputError` naming an option of another runtime (``mmproj``, ``encoder``)."""
    for option, owner in _OTHER_RUNTIMES.items():
        if options.get(option) is not None:
            raise InvalidInputError(
                option, f"is an option of {owner}; the transformers backends (hf:, tiny-*, shape-*) do not use it"
            )


def read_marker(source: str) -> dict[str, Any]:
    """The :data:`MARKER_FILE` beside the weights refsight built, or {}."""
    from ..model_files import read_json

    path = Path(source) / MARKER_FILE
    if not path.is_file():
        return {}
    try:
        return read_json(source, path)  # bounded and depth-checked: the folder is input like any other
    except ModelLoadError:
        return {}


def _check_options(family_class: Any, options: dict[str, Any], batch_size: Any) -> dict[str, Any]:
    """The family's own options, every other runtime's and unknown name refused."""
    refuse_other_backend_options(options)
    options = {k: v for k, v in options.items() if k not in _OTHER_RUNTIMES}
    accepted = {"min_pixels", "max_pixels", *family_class.processor_options}
    unknown = sorted(set(options) - accepted)
    if unknown:
        raise InvalidInputError(
            ", ".join(unknown), f"unknown option(s) for {family_class.family}; accepted: {', '.join(sorted(accepted))}"
        )
    if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1):
        raise InvalidInputError("batch_size", f"must be a positive integer, got {batch_size!r}")
    return options


def _image_processor(
    family_class: Any, name: str, source: str, hub: dict[str, Any], options: dict[str, Any],
    processor_kwargs: Mapping[str, Any] | None,
) -> Any:
    """The checkpoint's image processor with the user's settings, built and tried once."""
    from .preprocessing import check_processor_kwargs, probe_processor

    processor_class = family_class.image_processor_class()
    user_settings = check_processor_kwargs(processor_class, processor_kwargs)
    with runtime_errors(name, ModelLoadError, f"cannot load the image processor of {source}"):
        base_processor = processor_class.from_pretrained(source, **hub)
    mapped = family_class.processor_overrides(options, base_processor)
    clash = sorted(set(mapped) & set(user_settings))
    if clash:
        raise InvalidInputError(
            f"processor_kwargs: {', '.join(clash)}", "also set by a dedicated option (--min/max-pixels ...); set it once"
        )
    overrides = {**user_settings, **mapped}
    if not overrides:
        return base_processor
    try:
        image_processor = processor_class.from_pretrained(source, **hub, **overrides)
    except Exception as e:  # noqa: BLE001 - a bad value of a setting the user named
        raise InvalidInputError(f"processor settings {', '.join(sorted(overrides))}", f"{type(e).__name__}: {e}") from None
    probe_processor(image_processor, list(overrides))
    return image_processor


def _weights(
    family_class: Any, name: str, source: str, config: Any, hub: dict[str, Any], *, dtype: Any, device: str, attn: str | None
) -> tuple[Any, Any]:
    """(model, tokenizer), the model on ``device`` in ``dtype``."""
    from transformers import AutoTokenizer

    from .model_source import shape_report

    load: dict[str, Any] = {"config": config, "dtype": dtype, **hub}
    if attn is not None:
        load["attn_implementation"] = attn
    if device != "cpu":
        # Straight onto the accelerator: a large checkpoint never sits whole in host memory.
        load["device_map"] = {"": device}
    what = f"cannot load {source}" + (f" with attn={attn!r}" if attn else "")
    with runtime_errors(name, ModelLoadError, what, device=device, dtype=str(dtype).removeprefix("torch.")):
        with shape_report(name, source), bars_on_terminal_only():  # a wrong shape: one line, not transformers' table
            model = family_class.model_class().from_pretrained(source, **load)
        model.eval()
        tokenizer = AutoTokenizer.from_pretrained(source, **hub)
    return model, tokenizer


@contextmanager
def bars_on_terminal_only() -> Iterator[None]:
    """transformers' "Loading weights" bar only where stderr is a terminal: in a log, a notebook's captured
    output or a pipe its carriage returns are noise (the CLI turns the hub's bars off the same way)."""
    from transformers.utils import logging as hf_logging

    if sys.stderr.isatty() or not hf_logging.is_progress_bar_enabled():
        yield
        return
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.enable_progress_bar()


def load_parts(
    family_class: Any,
    name: str,
    source: str,
    config: Any,
    *,
    model_id: str | None = None,
    revision: str | None = None,
    dtype: str | None = None,
    device: str | None = None,
    attn: str | None = None,
    batch_size: int | None = None,
    processor_kwargs: Mapping[str, Any] | None = None,
    random_weights: bool | None = None,
    **options: Any,
) -> LoadedParts:
    """Check the options, build the image processor, load the weights; see ``HFBackend.from_pretrained``."""
    from .model_source import hub_kwargs
    from .revision import directory_revision, resolve_hub_revision
    from .runtime import resolve_device, resolve_dtype

    options = _check_options(family_class, options, batch_size)
    local = os.path.isdir(source)
    if local and revision is not None:
        raise InvalidInputError(
            "revision", f"applies to hub models; {source} is a local directory, named by the hash of its files"
        )
    device_name = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, device_name, config)
    # A branch or tag moves: pin the commit now and load every file at it.
    commit = None if local else resolve_hub_revision(name, source, revision)
    hub = hub_kwargs(commit)  # trust_remote_code=False on every load: a model folder's code never runs
    image_processor = _image_processor(family_class, name, source, hub, options, processor_kwargs)
    model, tokenizer = _weights(family_class, name, source, config, hub, dtype=torch_dtype, device=device_name, attn=attn)
    marker = read_marker(source)
    return LoadedParts(
        model=model,
        tokenizer=tokenizer,
        image_processor=image_processor,
        model_id=model_id or marker.get("model_id") or source,
        revision=directory_revision(source) if local else commit,
        random_weights=bool(marker.get("random_weights", False)) if random_weights is None else random_weights,
        batch_size=batch_size or 4,
        device=device_name,
        local_dir=source if local else None,
    )
