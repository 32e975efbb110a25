"""Models from Ollama's own store: ``ollama:NAME[:TAG]`` served by the llama.cpp backend.

Ollama keeps a model as an OCI-style manifest and content-addressed blobs under
``$OLLAMA_MODELS`` (default ``~/.ollama/models``)::

    manifests/<registry>/<namespace>/<name>/<tag>     JSON: config + layers, each {mediaType, digest, size}
    blobs/sha256-<hex>                                 one file per layer, named by its sha256

The model layer (``application/vnd.ollama.image.model``) is the language model's GGUF and the
projector layer (``application/vnd.ollama.image.projector``) the mmproj GGUF: exactly what
``llamacpp:<model.gguf>`` with ``mmproj=`` loads, so the backend is the llama.cpp one, reading the
blobs in place. The params layer (JSON: ``stop``, ``temperature`` ...) gives the sampling defaults a
request does not set (``backend.sampling_defaults``; ``num_ctx`` is the context unless ``n_ctx`` is
given), the system layer the default system prompt. Package keys hold the blobs' content hashes
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
from ...inputs.reading import read_regular_file

__all__ = ["OLLAMA_PREFIX", "OllamaModel", "default_models_dir", "find_model", "load_ollama_backend", "parse_name"]

OLLAMA_PREFIX = "ollama:"
MODEL_LAYER = "application/vnd.ollama.image.model"
PROJECTOR_LAYER = "application/vnd.ollama.image.projector"
PARAMS_LAYER = "application/vnd.ollama.image.params"
TEMPLATE_LAYER = "application/vnd.ollama.image.template"
SYSTEM_LAYER = "application/vnd.ollama.image.system"
DEFAULT_REGISTRY, DEFAULT_NAMESPACE, DEFAULT_TAG = "registry.ollama.ai", "library", "latest"
#: Largest manifest, params, template or system blob read (the real ones are a few KiB).
MAX_SMALL_BLOB = 1 << 20
#: Ollama params → refsight's :class:`~refsight.backends.sampling.Sampling` fields they set by default.
PARAM_SAMPLING = {
    "temperature": "temperature", "top_k": "top_k", "top_p": "top_p", "min_p": "min_p", "seed": "seed",
    "stop": "stop", "repeat_penalty": "repetition_penalty", "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
}
_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_DIGEST = re.compile(r"sha256[:-](?P<hex>[0-9a-f]{64})")


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
        raw = read_regular_file(self.manifest_path, MAX_SMALL_BLOB)
        try:
            self.manifest = json.loads(raw)
            self.layers = {layer["mediaType"]: layer for layer in self.manifest["layers"]}
        except (ValueError, KeyError, TypeError) as e:
            raise ModelLoadError(OLLAMA_PREFIX + name, f"{self.manifest_path} is not an Ollama manifest ({e})") from None
        #: Ollama's digest of a model: the sha256 of its manifest.
        self.digest = hashlib.sha256(raw).hexdigest()
        self.modified_at = datetime.fromtimestamp(self.manifest_path.stat().st_mtime, timezone.utc)
        self.size = sum(int(layer.get("size", 0)) for layer in self.layers.values())

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
        """The config blob (``model_format``, ``model_family``, ``model_type``, ``file_type`` ...), or {}."""
        match = _DIGEST.fullmatch(str((self.manifest.get("config") or {}).get("digest", "")))
        path = self.root / "blobs" / f"sha256-{match['hex']}" if match else None
        if path is None or not path.is_file():
            return {}
        try:
            data = json.loads(read_regular_file(path, MAX_SMALL_BLOB))
        except ValueError:
            return {}
        return data if isinstance(data, dict) else {}

    def params(self) -> dict[str, Any]:
        """The params layer's JSON object (Modelfile ``PARAMETER`` lines), or {}."""
        text = self.text(PARAMS_LAYER)
        if text is None:
            return {}
        try:
            data = json.loads(text)
        except ValueError:
            raise ModelLoadError(OLLAMA_PREFIX + self.name, "the params layer is not JSON") from None
        if not isinstance(data, dict):
            raise ModelLoadError(OLLAMA_PREFIX + self.name, "the params layer is not a JSON object")
        return data

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
    params = facts["params"]
    if options.get("n_ctx") is None and isinstance(params.get("num_ctx"), int):
        options = {**options, "n_ctx": params["num_ctx"]}
    backend = load_llamacpp_backend(name, source=str(model_blob), **{**options, "mmproj": str(projector)})
    _check_digest(model, backend)
    #: Read by the server's routes (duck-typed: the server imports no backend module).
    backend.sampling_defaults = {PARAM_SAMPLING[k]: _param(k, v) for k, v in params.items() if k in PARAM_SAMPLING}
    backend.ollama_model = facts
    return backend


def _param(key: str, value: Any) -> Any:
    """A params-layer value as the Sampling field takes it (``stop``: a tuple of strings)."""
    if key == "stop":
        return tuple(value) if isinstance(value, list) else (str(value),)
    return value
