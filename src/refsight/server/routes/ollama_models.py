"""Ollama's model endpoints: what is served (``/api/tags``, ``/api/show``, ``/api/ps``, ``/api/version``), and
the store-management ones refsight does not do (``/api/pull``, ``push``, ``create``, ``delete``, ``copy``,
``blobs``, and the embedding endpoints), answered with a 400 that says so.

refsight serves the one model it was started with (``refsight serve ollama:NAME[:TAG]`` reads it from
Ollama's own store); the listing describes it in Ollama's words: an ``ollama:`` model with its store
name, manifest digest, size and config details; another llama.cpp model with its GGUF architecture.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

from fastapi import APIRouter

from ..deps import ServiceDep, Namespace
from ..errors import ERROR_RESPONSES, ApiError
from ..ollama_bodies import OllamaShowBody, check_model, ollama_name

__all__ = ["router", "model_facts", "OLLAMA_API_VERSION"]

router = APIRouter(tags=["ollama"])
#: The Ollama API version whose shapes these routes answer in (clients compare it to enable features).
OLLAMA_API_VERSION = "0.12.0"
#: What ``/api/ps`` says about unloading: never (the model stays loaded for the server's life).
_FOREVER = timedelta(days=365 * 100)


def model_facts(service: Any) -> dict[str, Any]:
    """The served model as the Ollama routes describe it: an ``ollama:`` model's own facts, else what is known."""
    backend = service.engine.backend()
    own = getattr(backend, "ollama_model", None)
    if own is not None:
        return own
    arch = getattr(backend, "arch", None)
    paths = [p for p in (getattr(backend, "model_path", None), getattr(backend, "mmproj_path", None)) if p is not None]
    return {
        "name": ollama_name(service), "digest": backend.fingerprint().digest, "size": sum(p.stat().st_size for p in paths),
        "modified_at": datetime.fromtimestamp(0, timezone.utc).isoformat(),
        "details": {"parent_model": "", "format": "gguf" if arch else "refsight", "family": arch or backend.name,
                    "families": [arch or backend.name], "parameter_size": "", "quantization_level": ""},
        "template": None, "system": None, "params": {},
    }


def _entry(service: Any) -> dict[str, Any]:
    facts = model_facts(service)
    name = ollama_name(service)
    return {"name": name, "model": name, "modified_at": facts["modified_at"], "size": facts["size"],
            "digest": facts["digest"], "details": facts["details"]}


@router.get("/api/tags")
async def tags(namespace: Namespace, service: ServiceDep) -> dict[str, Any]:
    """The served model, as ``ollama list`` shows models."""
    return {"models": [_entry(service)]}


@router.get("/api/ps")
async def running(namespace: Namespace, service: ServiceDep) -> dict[str, Any]:
    """The served model, loaded (it stays loaded for the server's life)."""
    expires = (datetime.now(timezone.utc) + _FOREVER).isoformat()
    device = getattr(service.engine.backend(), "device", "cpu")
    entry = _entry(service)
    return {"models": [{**entry, "expires_at": expires, "size_vram": entry["size"] if device == "gpu" else 0,
                        "context_length": service.context_size}]}


@router.get("/api/version")
async def version() -> dict[str, str]:
    """The Ollama API version these routes speak (no key needed, as Ollama's)."""
    from ... import __version__

    return {"version": OLLAMA_API_VERSION, "refsight": __version__}


def _parameters(params: dict[str, Any]) -> str:
    """Modelfile ``PARAMETER`` lines, as Ollama's ``parameters`` text shows them."""
    lines = []
    for key, value in params.items():
        for item in value if isinstance(value, list) else [value]:
            lines.append(f'{key:<30} "{item}"' if isinstance(item, str) else f"{key:<30} {item}")
    return "\n".join(lines)


@router.post("/api/show", responses={k: ERROR_RESPONSES[k] for k in (400, 404)})
async def show(body: OllamaShowBody, namespace: Namespace, service: ServiceDep) -> dict[str, Any]:
    """The served model's details, chat template, parameters and capabilities (``vision``, ``completion``)."""
    model = body.model or body.name
    if not model:
        raise ApiError(400, "invalid_input", "model: give the model's name", param="model")
    check_model(model, service)
    facts, backend = model_facts(service), service.engine.backend()
    template = facts.get("template") or backend.chat_template_source() or ""
    info: dict[str, Any] = {"general.architecture": facts["details"]["family"]}
    if service.context_size:
        info[f"{facts['details']['family']}.context_length"] = service.context_size
    capabilities = ["completion", "vision"]  # every model refsight serves is a VLM; no tools, thinking or insert
    return {
        "modelfile": f"# served by refsight\nFROM {service.model}\n", "parameters": _parameters(facts.get("params") or {}),
        "template": template, "system": facts.get("system") or "", "details": facts["details"], "model_info": info,
        "capabilities": capabilities, "modified_at": facts["modified_at"],
    }


_MANAGED = "refsight serves the model it was started with (refsight serve ollama:NAME[:TAG] reads Ollama's store); "


def _refuse(what: str) -> ApiError:
    return ApiError(400, "unsupported", _MANAGED + what)


@router.post("/api/pull", responses={400: ERROR_RESPONSES[400]})
async def pull(namespace: Namespace) -> None:
    """Refused: models are not downloaded here (``ollama pull`` into Ollama's store, then serve it)."""
    raise _refuse("pull it with `ollama pull NAME`, then start refsight serve ollama:NAME")


@router.post("/api/push", responses={400: ERROR_RESPONSES[400]})
async def push(namespace: Namespace) -> None:
    """Refused: refsight does not publish models."""
    raise _refuse("push with `ollama push`")


@router.post("/api/create", responses={400: ERROR_RESPONSES[400]})
async def create(namespace: Namespace) -> None:
    """Refused: refsight does not build models (``ollama create`` does)."""
    raise _refuse("create models with `ollama create`")


@router.delete("/api/delete", responses={400: ERROR_RESPONSES[400]})
async def delete(namespace: Namespace) -> None:
    """Refused: refsight never changes Ollama's store."""
    raise _refuse("delete with `ollama rm`")


@router.post("/api/copy", responses={400: ERROR_RESPONSES[400]})
async def copy(namespace: Namespace) -> None:
    """Refused: refsight never changes Ollama's store (``--alias`` adds a name the server answers to)."""
    raise _refuse("copy with `ollama cp`; refsight serve --alias NAME adds a name this server answers to")


@router.post("/api/blobs/{digest}", responses={400: ERROR_RESPONSES[400]})
async def blobs(digest: str, namespace: Namespace) -> None:
    """Refused: blobs are uploaded for ``/api/create``, which refsight does not do."""
    raise _refuse("blobs are uploaded with `ollama create`")


@router.post("/api/embed", responses={400: ERROR_RESPONSES[400]})
@router.post("/api/embeddings", responses={400: ERROR_RESPONSES[400]})
async def embed(namespace: Namespace) -> None:
    """Refused: refsight serves no embeddings API (its retrieval is ``POST /v1/search``)."""
    raise ApiError(400, "unsupported", "embeddings are not served by refsight; search references with POST /v1/search")
