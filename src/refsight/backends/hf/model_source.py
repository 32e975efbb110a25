"""A transformers checkpoint checked before transformers reads it: never its code, never an absurd shape.

A model folder is input like any other. transformers imports Python from the folder when its
config names custom classes (``auto_map``) and ``trust_remote_code`` is not False; left at
None, it even asks "Do you wish to run the custom code? [y/N]" on stdin. refsight never runs a
model folder's code, and never prompts:

* every transformers load passes ``trust_remote_code=False`` (:func:`hub_kwargs` builds the
  keywords every ``from_pretrained`` of the HF backend, the CLIP embedder and the vLLM backend takes);
* :func:`check_config` reads ``config.json`` itself first, bounded and depth-checked
  (:mod:`..model_files`), and refuses an ``auto_map`` (custom classes, known model type or not)
  with one line, before transformers is asked anything; the folder's other small JSON files
  (tokenizer, processor and generation configs) are read the same way first, so a malformed
  or thousand-level-deep one is one line naming the file.

It also bounds what the config would make transformers allocate. Each size field
(:data:`SIZE_BOUNDS`: ``vocab_size``, ``hidden_size``, ``num_hidden_layers`` ...) in the
config and its sub-configs must be an integer under a bound far above any real model's, and
checked against the weights when the folder holds safetensors files (their headers only): the
parameters the config implies at the least (the embedding, one MLP matrix per layer, the vision
position table; :func:`least_parameters`) must not exceed what the files hold, and the embedding
rows must be a ``vocab_size`` of the config. A config of ``vocab_size`` 10**12 is one line, not a
mismatch table or an allocation of terabytes. A quantized checkpoint packs several weights per
stored element, so for it only the bounds apply. Any other shape transformers finds wrong while
loading is one line too (:func:`shape_report`), instead of its load report's table.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from pathlib import Path
from typing import Any, Iterator

from ...errors import ModelLoadError
from ..model_files import count, integer, problem, read_json, safetensors_shapes

__all__ = [
    "NO_REMOTE_CODE", "SIZE_BOUNDS", "hub_kwargs", "check_config", "config_file", "least_parameters", "shape_report",
]

#: The keyword every transformers load of refsight passes: a model folder's code never runs.
NO_REMOTE_CODE = {"trust_remote_code": False}

_LAYERS, _WIDTH, _COUNT = 1 << 12, 1 << 17, 1 << 24
#: Largest value of each size field of a config (or sub-config); the largest real models are
#: orders of magnitude below (vocabularies of 262,144, widths of 16,384, 128 layers).
SIZE_BOUNDS = {
    "vocab_size": _COUNT, "max_position_embeddings": _COUNT,
    "hidden_size": _WIDTH, "embed_dim": _WIDTH, "intermediate_size": _WIDTH * 8, "moe_intermediate_size": _WIDTH * 8,
    "projection_dim": _WIDTH, "out_hidden_size": _WIDTH, "head_dim": _WIDTH, "image_size": _WIDTH, "patch_size": _WIDTH,
    "num_hidden_layers": _LAYERS, "depth": _LAYERS, "num_layers": _LAYERS,
    "num_attention_heads": _LAYERS, "num_key_value_heads": _LAYERS, "num_heads": _LAYERS,
    "num_experts": _LAYERS * 4, "num_local_experts": _LAYERS * 4, "n_routed_experts": _LAYERS * 4,
}
#: The folder's other small JSON files transformers parses (its own json.loads raises RecursionError on deep nesting).
_OTHER_JSON = (
    "generation_config.json", "preprocessor_config.json", "processor_config.json", "tokenizer_config.json",
    "special_tokens_map.json", "chat_template.json", "video_preprocessor_config.json",
)
_WIDTHS = ("hidden_size", "embed_dim")
_DEPTHS = ("num_hidden_layers", "depth", "num_layers")


def hub_kwargs(revision: str | None = None) -> dict[str, Any]:
    """The keywords of every transformers load: ``trust_remote_code=False``, and the commit of a hub model."""
    return {**NO_REMOTE_CODE, **({"revision": revision} if revision else {})}


def config_file(name: str, source: str, revision: str | None = None) -> Path:
    """``config.json`` of a local folder, or of a hub model at ``revision`` (from the hub or its cache)."""
    if os.path.isdir(source):
        return Path(source) / "config.json"
    from huggingface_hub import hf_hub_download

    try:
        return Path(hf_hub_download(source, "config.json", revision=revision))
    except Exception as e:  # noqa: BLE001 - offline, gated, missing: one line naming the model
        offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in {"1", "true", "yes", "on"}
        hint = " (HF_HUB_OFFLINE is set and the model is not in the local cache)" if offline else ""
        raise ModelLoadError(name, f"cannot load the config of {source}{hint}: {type(e).__name__}: {e}") from None


def check_config(name: str, source: str, revision: str | None = None) -> dict[str, Any]:
    """The checkpoint's ``config.json`` as a dict, refused (:class:`ModelLoadError`, one line) when it
    names custom code, lacks a model type, or its sizes are absurd or disagree with the weights."""
    path = config_file(name, source, revision)
    config = read_json(name, path, kind="a model config (a JSON object)")
    for field, sub in _configs(config, ""):
        if "auto_map" in sub:
            raise ModelLoadError(
                name,
                f"{path}: {field}auto_map names custom code ({_classes(sub['auto_map'])}); refsight never runs a model "
                "folder's code: use a checkpoint whose model_type transformers itself supports",
            )
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise problem(name, path, "model_type", "missing; a transformers config names its model type")
    _check_sizes(name, path, config)
    if os.path.isdir(source):
        for other in _OTHER_JSON:
            if (Path(source) / other).is_file():
                read_json(name, Path(source) / other)  # bounded and depth-checked before transformers parses it
        _check_weights(name, Path(source), path, config)
    return config


def _configs(config: dict[str, Any], prefix: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """The config and every nested object in it (``text_config``, ``vision_config`` ...), with its field path."""
    stack = [(prefix, config)]
    while stack:
        field, sub = stack.pop()
        yield field, sub
        stack.extend((f"{field}{key}.", value) for key, value in sub.items() if isinstance(value, dict))


def _classes(auto_map: Any) -> str:
    if isinstance(auto_map, dict):
        shown = ", ".join(f"{k} → {v}" for k, v in list(auto_map.items())[:3] if isinstance(v, str))
        return shown[:160] or "classes"
    return "classes"


def _check_sizes(name: str, path: Path, config: dict[str, Any]) -> None:
    """Each size field an integer (or a list or {height, width} of them) within :data:`SIZE_BOUNDS`, or null."""
    for field, sub in _configs(config, ""):
        for key, high in SIZE_BOUNDS.items():
            value = sub.get(key)
            if value is None:
                continue
            items = value if isinstance(value, list) else list(value.values()) if isinstance(value, dict) else [value]
            for item in items:
                integer(name, path, field + key, item, high=high)


def _size(sub: dict[str, Any], keys: tuple[str, ...]) -> int:
    value = next((sub[k] for k in keys if isinstance(sub.get(k), int)), 0)
    return value if isinstance(value, int) else 0


def least_parameters(config: dict[str, Any]) -> tuple[int, str]:
    """A lower bound on the parameters a checked config describes, and the sub-config it comes from.

    Per sub-config that holds no sub-config of its own (a composite config's top level may keep
    stale defaults, PaliGemma's ``vocab_size`` 257152 beside its text config's): ``vocab_size ×
    width`` (the embedding), ``layers × width × intermediate_size`` (one MLP matrix a layer;
    ``layers × width`` without one: a norm) and ``(image_size / patch_size)² × width`` (a vision
    position table). The largest one's, a bound no real checkpoint's weights fall below.
    """
    least, where = 0, ""
    for field, sub in _configs(config, ""):
        if any(isinstance(value, dict) and any(key in value for key in SIZE_BOUNDS) for value in sub.values()):
            continue
        width, layers = _size(sub, _WIDTHS), _size(sub, _DEPTHS)
        inner = _size(sub, ("intermediate_size",)) or 1
        side = _size(sub, ("image_size",)) // max(_size(sub, ("patch_size",)), 1)
        implied = _size(sub, ("vocab_size",)) * width + layers * width * inner + side * side * width
        if implied > least:
            least, where = implied, field.rstrip(".") or "the top level"
    return least, where


def _check_weights(name: str, folder: Path, path: Path, config: dict[str, Any]) -> None:
    """The config against the safetensors headers of ``folder`` (when it has any and is not quantized)."""
    files = sorted(p for p in folder.glob("*.safetensors") if p.is_file())
    if not files or any("quantization_config" in sub for _, sub in _configs(config, "")):
        return
    shapes: dict[str, tuple[int, ...]] = {}
    for file in files:
        shapes.update(safetensors_shapes(name, file))
    held = count(shapes)
    least, where = least_parameters(config)
    if least > held:
        raise problem(
            name, path, where,
            f"its sizes imply at least {least:,} parameters but the weight files hold {held:,}; the config does not "
            "describe these weights (refused before anything is allocated)",
        )
    _check_vocabulary(name, path, config, shapes)


def _check_vocabulary(name: str, path: Path, config: dict[str, Any], shapes: dict[str, tuple[int, ...]]) -> None:
    """Each token embedding's rows are one of the config's vocabulary sizes."""
    vocabularies = {sub["vocab_size"] for _, sub in _configs(config, "") if isinstance(sub.get("vocab_size"), int)}
    if not vocabularies:
        return
    for tensor, shape in shapes.items():
        if tensor.rsplit(".", 2)[-2:] == ["embed_tokens", "weight"] and len(shape) == 2 and shape[0] not in vocabularies:
            raise problem(
                name, path, "vocab_size",
                f"{', '.join(map(str, sorted(vocabularies)))} does not match the {shape[0]} rows of {tensor} "
                "in the weights; the config does not describe these weights",
            )


_MISMATCH = re.compile(r"^\s*([^|]+?)\s*\|.*MISMATCH.*ckpt: torch\.Size\((\[[^\]]*\])\) vs model:\s*torch\.Size\((\[[^\]]*\])\)")


class _HeldReport(logging.Filter):
    """Holds transformers' weight-load report back (a table of many lines) until the load ends."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def filter(self, record: logging.LogRecord) -> bool:
        if "LOAD REPORT" in record.getMessage():
            self.records.append(record)
            return False
        return True


@contextlib.contextmanager
def shape_report(name: str, source: str) -> Iterator[None]:
    """Around a transformers weight load: a shape the weights do not have is one :class:`ModelLoadError`
    line naming the first tensor and the count, not transformers' load report table and a pointer to it.

    Any other outcome shows the report (missing or unexpected keys) as transformers would.
    """
    logger = logging.getLogger("transformers.modeling_utils")
    held = _HeldReport()
    logger.addFilter(held)
    mismatch = None
    try:
        yield
    except RuntimeError as e:
        if "ignore_mismatched_sizes" not in str(e):
            raise
        mismatch = e
    finally:
        logger.removeFilter(held)
        if mismatch is None:
            for record in held.records:
                logger.handle(record)
    if mismatch is None:
        return
    rows = [m for r in held.records for line in r.getMessage().splitlines() if (m := _MISMATCH.match(line))]
    first = f", first {rows[0][1]}: {rows[0][2]} in the weights, {rows[0][3]} from the config" if rows else ""
    raise ModelLoadError(
        name, f"{source}/config.json does not describe the weights: {len(rows) or 'some'} tensor(s) differ in shape{first}"
    ) from None
