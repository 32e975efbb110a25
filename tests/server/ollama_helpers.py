"""An Ollama-layout model store built offline from refsight's built-in GGUFs (imported by name: unique on purpose).

The layout is Ollama's own: ``manifests/registry.ollama.ai/library/<name>/<tag>`` (the OCI-style manifest)
and ``blobs/sha256-<hex>`` (one file per layer, named by its content hash).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

MODEL = "application/vnd.ollama.image.model"
PROJECTOR = "application/vnd.ollama.image.projector"
PARAMS = "application/vnd.ollama.image.params"
TEMPLATE = "application/vnd.ollama.image.template"
SYSTEM = "application/vnd.ollama.image.system"


def _blob(root: Path, data: bytes | None = None, source: Path | None = None) -> dict:
    digest = hashlib.sha256(data if data is not None else source.read_bytes()).hexdigest()
    target = root / "blobs" / f"sha256-{digest}"
    target.parent.mkdir(parents=True, exist_ok=True)
    if not target.exists():
        if data is not None:
            target.write_bytes(data)
        else:
            shutil.copyfile(source, target)
    return {"digest": f"sha256:{digest}", "size": target.stat().st_size}


def add_model(root: Path, name: str, tag: str, *, model: Path, projector: Path | None = None,
              params: dict | None = None, system: str | None = None) -> Path:
    """Write ``name:tag`` into the store at ``root``: the GGUF layers, params, a template, and its manifest."""
    layers = [{"mediaType": MODEL, **_blob(root, source=model)}]
    if projector is not None:
        layers.append({"mediaType": PROJECTOR, **_blob(root, source=projector)})
    layers.append({"mediaType": TEMPLATE, **_blob(root, b"{{ .Prompt }}")})
    if params is not None:
        layers.append({"mediaType": PARAMS, **_blob(root, json.dumps(params).encode())})
    if system is not None:
        layers.append({"mediaType": SYSTEM, **_blob(root, system.encode())})
    config = {"model_format": "gguf", "model_family": "qwen2vl", "model_families": ["qwen2vl", "clip"],
              "model_type": "tiny", "file_type": "F32"}
    manifest = {
        "schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": {"mediaType": "application/vnd.docker.container.image.v1+json", **_blob(root, json.dumps(config).encode())},
        "layers": layers,
    }
    path = root / "manifests" / "registry.ollama.ai" / "library" / name / tag
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(manifest))
    return path


def tiny_store(root: Path, gguf: str = "tiny-qwen2-vl-gguf", **params_and_system) -> tuple[Path, Path]:
    """A store at ``root`` holding ``tiny:latest`` (model + projector) and ``textonly:latest`` (no projector);
    returns the built-in's (model GGUF, mmproj GGUF)."""
    from refsight.builtin_models.gguf import ensure_gguf

    model, mmproj = ensure_gguf(gguf)
    add_model(root, "tiny", "latest", model=model, projector=mmproj, **params_and_system)
    add_model(root, "textonly", "latest", model=model)
    return model, mmproj
