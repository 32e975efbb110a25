"""Models from Ollama's own store: ``ollama:NAME[:TAG]`` served by the llama.cpp backend.

Ollama keeps a model as an OCI-style manifest and content-addressed blobs under
``$OLLAMA_MODELS`` (default ``~/.ollama/models``)::

    manifests/<registry>/<namespace>/<name>/<tag>     JSON: config + layers, each {mediaType, digest, size}
    blobs/sha256-<hex>                                 one file per layer, named by its sha256

The model layer (``application/vnd.ollama.image.model``) is the language model's GGUF and the
projector layer (``application/vnd.ollama.image.projector``) the mmproj GGUF: exactly what
``llamacpp:<model.gguf>`` with ``mmproj=`` loads, so the backend is the llama.cpp one, reading the
blobs in place. The params layer (JSON: ``stop``, ``temperature`` ...) gives the sampling defaults a
request does not set, over Ollama's own top-k 40 and top-p 0.9 (``backend.sampling_defaults``; ``num_ctx``
is the context unless ``n_ctx`` is given), each checked at start as a request would use it: a value no
request could work with (a ``temperature`` of ``"hot"``, NaN, ``num_ctx`` above the trained context)
refuses to load, naming the layer's blob and the parameter. The system layer is the default system prompt; the template layer
(Ollama's Go template) is reported by ``/api/show``, while prompts are rendered in the GGUF's own
chat template. Package keys hold the blobs' content hashes
(the fingerprint's ``model_sha256`` / ``mmproj_sha256`` are the digests), so the same blobs served as
``llamacpp:`` share packages, and a blob whose content is not its digest is refused.

Models whose vision tower lives inside the model blob in Ollama's own layout (Ollama's newer engine:
no projector layer) cannot be loaded by llama.cpp; that is one error naming the model, the reason
and where its GGUF + mmproj come from.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ...errors import InvalidInputError, ModelLoadError
from ...inputs.reading import FileReadError, read_regular_file
from ..model_files import integer, parse_json, problem, read_json, text

__all__ = ["OLLAMA_PREFIX", "MAX_STOP_CHARS", "OllamaModel", "context_param", "default_models_dir", "find_model",
           "load_ollama_backend", "parse_name", "sampling_defaults"]

OLLAMA_PREFIX = "ollama:"
MODEL_LAYER = "application/vnd.ollama.image.model"
PROJECTOR_LAYER = "application/vnd.ollama.image.projector"
PARAMS_LAYER = "application/vnd.ollama.image.params"
TEMPLATE_LAYER = "application/vnd.ollama.image.template"
SYSTEM_LAYER = "application/vnd.ollama.image.system"
DEFAULT_REGISTRY, DEFAULT_NAMESPACE, DEFAULT_TAG = "registry.ollama.ai", "library", "latest"
#: Largest manifest, params, template or system blob read (the real ones are a few KiB).
MAX_SMALL_BLOB = 1 << 20
#: The longest stop string a params layer may set (real ones are special tokens: ``<|im_end|>``, ``<end_of_turn>``).
MAX_STOP_CHARS = 256
#: Ollama params → refsight's :class:`~refsight.sampling.Sampling` fields they set by default.
PARAM_SAMPLING = {
    "temperature": "temperature", "top_k": "top_k", "top_p": "top_p", "min_p": "min_p", "seed": "seed",
    "stop": "stop", "repeat_penalty": "repetition_penalty", "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
}
#: Ollama's own sampler defaults (``api.DefaultOptions``), under the params layer's: a sampled request that sets
#: neither draws from the top 40 tokens within top-p 0.9, as it would from Ollama. Greedy decoding never reads them.
OLLAMA_SAMPLER = {"top_k": 40, "top_p": 0.9}
_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_DIGEST = re.compile(r"sha256[:-](?P<hex>[0-9a-f]{64})")
#: The config blob's fields refsight reports (``/api/show``): strings when present.
_CONFIG_TEXT = ("model_format", "model_family", "model_type", "file_type")


def default_models_dir() -> Path:
    """``$OLLAMA_MODELS``, else ``~/.ollama/models`` (Ollama's own default)."""
    return Path(os.environ.get("OLLAMA_MODELS") or Path.home() / ".ollama" / "models").expanduser()


def parse_name(name: str) -> tuple[str, str, str, str]:
    """``[registry/][namespace/]model[:tag]`` → (registry, namespace, model, tag), Ollama's defaults filled in."""
    head, _, last = name.rpartition("/")
    model, _, tag = last.partition(":")
    parts = [*(head.split("/") if head else []), model]
    if not 1 <= len(parts) <= 3 or not all(_PART.fullmatch(p) for p in [*parts, tag or DEFAULT_TAG]):
        raise InvalidInputError(name, "an Ollama model name is [registry/][namespace/]model[:tag] (letters, digits, . _ -)")
    parts = [DEFAULT_REGISTRY, DEFAULT_NAMESPACE][: 3 - len(parts)] + parts
    return parts[0], parts[1], parts[2], tag or DEFAULT_TAG


class OllamaModel:
    """One model of an Ollama store: its manifest, layers and what they say (read once, small blobs only)."""

    def __init__(self, name: str, root: Path) -> None:
        registry, namespace, model, tag = parse_name(name)
        #: Ollama's short name (``llava:7b``; the registry and ``library/`` left out, as ``ollama list`` shows it).
        self.name = f"{model}:{tag}" if namespace == DEFAULT_NAMESPACE else f"{namespace}/{model}:{tag}"
        if registry != DEFAULT_REGISTRY:
            self.name = f"{registry}/{self.name}"
        self.root = root
        self.manifest_path = root / "manifests" / registry / namespace / model / tag
        if not self.manifest_path.is_file():
            raise ModelLoadError(
                OLLAMA_PREFIX + name,
                f"no such model in the Ollama store {root} (no {self.manifest_path}); `ollama pull {self.name}` "
                "puts it there, or set $OLLAMA_MODELS to the store's models directory",
            )
        try:
            raw = read_regular_file(self.manifest_path, MAX_SMALL_BLOB)
        except FileReadError as e:
            raise problem(OLLAMA_PREFIX + name, self.manifest_path, "", e.reason) from None
        self.manifest, self.layers = _manifest(OLLAMA_PREFIX + name, self.manifest_path, raw)
        #: Ollama's digest of a model: the sha256 of its manifest.
        self.digest = hashlib.sha256(raw).hexdigest()
        self.modified_at = datetime.fromtimestamp(self.manifest_path.stat().st_mtime, timezone.utc)
        self.size = sum(layer.get("size", 0) for layer in self.layers.values())

    def blob(self, media_type: str) -> Path | None:
        """The blob file of the layer of ``media_type``, or None when the manifest has no such layer."""
        layer = self.layers.get(media_type)
        if layer is None:
            return None
        match = _DIGEST.fullmatch(str(layer.get("digest", "")))
        if match is None:
            raise ModelLoadError(OLLAMA_PREFIX + self.name, f"layer {media_type}: bad digest {layer.get('digest')!r}")
        path = self.root / "blobs" / f"sha256-{match['hex']}"
        if not path.is_file():
            raise ModelLoadError(OLLAMA_PREFIX + self.name, f"layer {media_type}: blob {path} is missing")
        return path

    def text(self, media_type: str) -> str | None:
        """A small layer's text (template, system), or None."""
        path = self.blob(media_type)
        return None if path is None else read_regular_file(path, MAX_SMALL_BLOB).decode("utf-8", "replace")

    def config(self) -> dict[str, Any]:
        """The config blob (``model_format``, ``model_family``, ``model_type``, ``file_type`` ...), or {} when the
        manifest names none or its blob is absent; a blob that is there is checked field by field."""
        match = _DIGEST.fullmatch(str((self.manifest.get("config") or {}).get("digest", "")))
        path = self.root / "blobs" / f"sha256-{match['hex']}" if match else None
        if path is None or not path.is_file():
            return {}
        model = OLLAMA_PREFIX + self.name
        data = read_json(model, path, max_bytes=MAX_SMALL_BLOB, kind="an Ollama config blob (a JSON object)")
        for field in _CONFIG_TEXT:
            if data.get(field) is not None:
                text(model, path, field, data[field])
        families = data.get("model_families")
        if families is not None and not (isinstance(families, list) and all(isinstance(f, str) for f in families)):
            raise problem(model, path, "model_families", "must be a list of strings")
        return data

    def params(self) -> dict[str, Any]:
        """The params layer's JSON object (Modelfile ``PARAMETER`` lines), or {}."""
        text = self.text(PARAMS_LAYER)
        if text is None:
            return {}
        try:
            data = json.loads(text)
        except (ValueError, RecursionError):
            raise self.bad_layer(PARAMS_LAYER, "is not JSON") from None
        if not isinstance(data, dict):
            raise self.bad_layer(PARAMS_LAYER, "is not a JSON object")
        return data

    def bad_layer(self, media_type: str, reason: str) -> ModelLoadError:
        """The error of a small layer whose content refsight cannot serve: the model, the layer's blob and why."""
        kind = media_type.rsplit(".", 1)[-1]
        return ModelLoadError(OLLAMA_PREFIX + self.name, f"its {kind} layer ({self.blob(media_type)}) {reason}")

    def facts(self) -> dict[str, Any]:
        """What the Ollama routes report about the model (``/api/tags``, ``/api/show``, ``/api/ps``)."""
        config = self.config()
        family = str(config.get("model_family") or "")
        return {
            "name": self.name, "digest": self.digest, "size": self.size, "modified_at": self.modified_at.isoformat(),
            "details": {
                "parent_model": "", "format": str(config.get("model_format") or "gguf"), "family": family,
                "families": list(config.get("model_families") or ([family] if family else [])),
                "parameter_size": str(config.get("model_type") or ""),
                "quantization_level": str(config.get("file_type") or ""),
            },
            "template": self.text(TEMPLATE_LAYER), "system": self.text(SYSTEM_LAYER), "params": self.params(),
        }


def _manifest(model: str, path: Path, raw: bytes) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """The manifest and its layers by media type, each field checked (the file, the field and why on one line)."""
    manifest = parse_json(model, path, raw, kind="an Ollama manifest (a JSON object)")
    layers = manifest.get("layers")
    if not isinstance(layers, list):
        raise problem(model, path, "layers", "must be a list of layers")
    by_type: dict[str, dict[str, Any]] = {}
    for i, layer in enumerate(layers):
        if not isinstance(layer, dict):
            raise problem(model, path, f"layers[{i}]", "must be an object {mediaType, digest, size}")
        text(model, path, f"layers[{i}].mediaType", layer.get("mediaType"))
        text(model, path, f"layers[{i}].digest", layer.get("digest"))
        if "size" in layer:
            integer(model, path, f"layers[{i}].size", layer["size"])
        by_type[layer["mediaType"]] = layer
    config = manifest.get("config")
    if config is not None and not isinstance(config, dict):
        raise problem(model, path, "config", "must be an object {mediaType, digest, size}")
    return manifest, by_type


def find_model(name: str, root: Path | None = None) -> OllamaModel:
    """The model ``name`` (without the ``ollama:`` prefix) of the store at ``root`` (default: :func:`default_models_dir`)."""
    return OllamaModel(name, root or default_models_dir())


def _no_projector(model: OllamaModel) -> ModelLoadError:
    return ModelLoadError(
        OLLAMA_PREFIX + model.name,
        "its manifest has no projector layer (application/vnd.ollama.image.projector): llama.cpp needs the vision "
        "tower as a separate mmproj GGUF, and this model keeps it inside the model blob in Ollama's own layout "
        "(Ollama's newer engine), or has no vision at all; get the same model's GGUF and mmproj GGUF (its "
        "publisher's or ggml-org's -GGUF repository on Hugging Face) and serve them: --model llamacpp:M.gguf --mmproj P.gguf",
    )


def _check_digest(model: OllamaModel, backend: Any) -> None:
    """The backend hashed the blobs for its fingerprint: each must be its own digest (a damaged blob is refused)."""
    hashed = backend.fingerprint().preprocessing
    for media_type, key in ((MODEL_LAYER, "gguf_sha256"), (PROJECTOR_LAYER, "mmproj_sha256")):
        expected = _DIGEST.fullmatch(model.layers[media_type]["digest"])["hex"]
        if hashed.get(key) != f"sha256:{expected}":
            backend.close()
            raise ModelLoadError(
                OLLAMA_PREFIX + model.name, f"blob sha256-{expected} is damaged: its content hashes to {hashed.get(key)}"
            )


def load_ollama_backend(name: str, **options: Any):
    """The registry factory for ``ollama:NAME[:TAG]``: the store's model and projector blobs on llama.cpp.

    Options are the llama.cpp backend's, but for ``mmproj`` (the projector layer is the mmproj);
    ``n_ctx`` defaults to the params layer's ``num_ctx``.
    """
    from . import load_llamacpp_backend

    if options.get("mmproj") is not None:
        raise InvalidInputError("mmproj", f"{name} brings its projector layer; drop --mmproj")
    model = find_model(name[len(OLLAMA_PREFIX):] if name.startswith(OLLAMA_PREFIX) else name)
    model_blob = model.blob(MODEL_LAYER)
    if model_blob is None:
        raise ModelLoadError(name, "its manifest has no model layer (application/vnd.ollama.image.model)")
    projector = model.blob(PROJECTOR_LAYER)
    if projector is None:
        raise _no_projector(model)
    facts = model.facts()
    defaults = sampling_defaults(model, facts["params"])  # a value no request could use is refused here, at start
    num_ctx = context_param(model, facts["params"])
    from_layer = options.get("n_ctx") is None and num_ctx is not None
    try:
        backend = load_llamacpp_backend(name, source=str(model_blob), **{
            **options, "mmproj": str(projector), **({"n_ctx": num_ctx} if from_layer else {})})
    except InvalidInputError as e:
        if from_layer and e.input == "n_ctx":  # the layer's num_ctx, not the caller's: name the layer
            raise model.bad_layer(PARAMS_LAYER, f"sets num_ctx {num_ctx}: {e.reason}") from None
        raise
    _check_digest(model, backend)
    #: Read by the server's routes (duck-typed: the server imports no backend module).
    backend.sampling_defaults = {**OLLAMA_SAMPLER, **defaults}
    backend.ollama_model = facts
    return backend


def sampling_defaults(model: OllamaModel, params: dict[str, Any]) -> dict[str, Any]:
    """The params layer's sampling parameters as :class:`~refsight.sampling.Sampling` fields, each
    checked as a request would use it (a bad one is refused at start, naming the layer and the parameter,
    never a 400 blaming every client). ``stop`` may hold up to :data:`MAX_DEFAULT_STOP_STRINGS` strings of
    at most :data:`MAX_STOP_CHARS` characters; other parameters (``num_predict``, ``num_keep`` ...) are not read."""
    from ...sampling import Sampling

    defaults = {}
    for key, field in PARAM_SAMPLING.items():
        if key not in params:
            continue
        value = params[key]
        if key == "stop":
            value = _stop_param(model, value)
        try:
            Sampling.merged({}, {field: value})
        except InvalidInputError as e:
            detail = e.reason if e.input == field else f"{e.input}: {e.reason}"  # stop[1]: which string
            raise model.bad_layer(PARAMS_LAYER, f"sets {key} {_short(value)}: {detail}") from None
        defaults[field] = value
    return defaults


def _stop_param(model: OllamaModel, value: Any) -> tuple[str, ...]:
    """The layer's ``stop``: one string or a list of them, bounded in count and length."""
    from ...sampling import MAX_DEFAULT_STOP_STRINGS

    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not 0 < len(stops) <= MAX_DEFAULT_STOP_STRINGS or not all(
        isinstance(s, str) and 0 < len(s) <= MAX_STOP_CHARS for s in stops
    ):
        raise model.bad_layer(PARAMS_LAYER, f"sets stop to {_short(value)}: give 1 to {MAX_DEFAULT_STOP_STRINGS} "
                              f"non-empty strings of at most {MAX_STOP_CHARS} characters")
    return tuple(stops)


def context_param(model: OllamaModel, params: dict[str, Any]) -> int | None:
    """The layer's ``num_ctx`` (a positive integer), or None; the backend refuses it above the trained context."""
    value = params.get("num_ctx")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise model.bad_layer(PARAMS_LAYER, f"sets num_ctx {_short(value)}: must be a positive integer")
    return value


def _short(value: Any) -> str:
    """A layer's value for an error line (long lists and strings cut)."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
