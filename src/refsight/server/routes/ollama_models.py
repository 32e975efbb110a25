"""Ollama's model endpoints: what is served (``/api/tags``, ``/api/show``, ``/api/ps``, ``/api/version``), and
the store-management ones refsight does not do (``/api/pull``, ``push``, ``create``, ``delete``, ``copy``,
``blobs``), answered with a 400 that says so. (Its embedding endpoints are :mod:`.ollama_embed`.)

refsight serves the one model it was started with (``refsight serve ollama:NAME[:TAG]`` reads it from
Ollama's own store); the listing describes it in Ollama's words: an ``ollama:`` model with its store
name, manifest digest, size and config details; another llama.cpp model with its GGUF architecture.
``/api/show`` writes ``modelfile``, ``parameters`` and ``template`` as Ollama does (its ``GetModelInfo``):
the parameters a line each, the name padded to 30 columns and the value in Go syntax; the Modelfile's
FROM the model's files, a comment saying which template refsight renders prompts in. The template is an
Ollama model's own (its template layer, a Go template), else the one refsight renders in (the GGUF's
``tokenizer.chat_template`` or the checkpoint's, Jinja). Random weights are said where Ollama's clients show a
model's facts: ``model_info``'s ``refsight.random_weights`` (the ``ollama`` library keeps every key there, and
drops fields it does not know elsewhere) and a Modelfile comment.
"""

from __future__ import annotations

import json
import math
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

from fastapi import APIRouter, Request

from ...tools import format_of
from ..deps import ServiceDep, Namespace
from ..edge.http_errors import ERROR_RESPONSES, ApiError
from ..edge.sleep import needs_no_model
from ..intake.dialect_body import log_ignored
from ..model_facts import ModelDetails
from ..replies.answers import ignored_object
from .ollama_bodies import OllamaShowBody, check_model, ollama_name

__all__ = ["router", "model_facts", "human_number", "OLLAMA_API_VERSION"]

router = APIRouter(tags=["ollama"])
#: The Ollama API version whose shapes these routes answer in (clients compare it to enable features).
OLLAMA_API_VERSION = "0.12.0"
#: What ``/api/ps`` says about unloading: never (the model stays loaded for the server's life).
_FOREVER = timedelta(days=365 * 100)


def model_facts(service: Any) -> dict[str, Any]:
    """The served model as the Ollama routes describe it: an ``ollama:`` model's own facts, else what is known."""
    model = service.model_details()
    if model.ollama_model is not None:
        return model.ollama_model
    arch, count = model.arch, model.weights.get("parameter_count")
    # The params a request gets when it sets none: the runtime's sampling defaults and the context it was started with.
    params = {**service.sampling_defaults, **({"num_ctx": service.context_size} if service.context_size else {})}
    return {
        "name": ollama_name(service), "digest": model.digest, "size": sum(p.stat().st_size for p in model.files),
        "modified_at": datetime.fromtimestamp(model.modified or 0, timezone.utc).isoformat(),
        "details": {"parent_model": "", "format": "gguf" if arch else "refsight", "family": arch or model.name,
                    "families": [arch or model.name], "parameter_size": human_number(count) if count else "",
                    "quantization_level": model.weights.get("quantization", "")},
        "template": None, "system": None, "params": params,
    }


def human_number(count: int) -> str:
    """A parameter count as Ollama writes ``parameter_size`` (its ``format.HumanNumber``): ``8B``, ``2.2B``,
    ``256.15M``, ``12K``."""
    for unit, scale, decimals in (("B", 1e9, 1), ("M", 1e6, 2), ("K", 1e3, 0)):
        if count >= scale:
            number = count / scale
            return f"{number:.0f}{unit}" if number == int(number) else f"{number:.{decimals}f}{unit}"
    return str(count)


def _entry(service: Any) -> dict[str, Any]:
    facts = model_facts(service)
    name = ollama_name(service)
    return {"name": name, "model": name, "modified_at": facts["modified_at"], "size": facts["size"],
            "digest": facts["digest"], "details": facts["details"]}


@router.get("/api/tags")
@needs_no_model
async def tags(namespace: Namespace, service: ServiceDep) -> dict[str, Any]:
    """The served model, as ``ollama list`` shows models."""
    return {"models": [_entry(service)]}


@router.get("/api/ps")
@needs_no_model
async def running(namespace: Namespace, service: ServiceDep) -> dict[str, Any]:
    """The served model while it is loaded (none while it sleeps: ``--sleep-idle-seconds``), as Ollama lists the
    models in memory."""
    if service.is_sleeping:
        return {"models": []}
    expires = (datetime.now(timezone.utc) + _FOREVER).isoformat()
    device = service.model_details().device
    entry = _entry(service)
    return {"models": [{**entry, "expires_at": expires, "size_vram": entry["size"] if device == "gpu" else 0,
                        "context_length": service.context_size}]}


@router.get("/api/version")
async def version() -> dict[str, str]:
    """The Ollama API version these routes speak (no key needed, as Ollama's)."""
    from ... import __version__

    return {"version": OLLAMA_API_VERSION, "refsight": __version__}


def _go_syntax(value: Any) -> str:
    """A params-layer value as Go's ``%#v`` writes the JSON-decoded value (Ollama's ``parameters`` text)."""
    if isinstance(value, str):
        return _go_quote(value)
    return _go_value(value)


def _go_value(value: Any) -> str:
    """Go's ``%v`` of a JSON-decoded value: booleans ``true``, strings as they are, numbers as float64s."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return _go_float(float(value))
    return value if isinstance(value, str) else json.dumps(value)


def _go_float(value: float) -> str:
    """Go's ``%v`` of a float64: the shortest digits, in exponent form from 1e+06 and below 1e-04
    (``4096``, ``0.7``, ``1e+06``, ``1e-05``)."""
    if not math.isfinite(value):
        return "NaN" if value != value else ("+Inf" if value > 0 else "-Inf")
    if value == 0:
        return "0"
    shortest = Decimal(repr(value)).normalize()
    digits, exponent = len(shortest.as_tuple().digits), shortest.adjusted()
    if exponent < -4 or exponent >= 6:
        return f"{value:.{digits - 1}e}"
    return f"{value:.{max(digits - exponent - 1, 0)}f}"


def _go_quote(text: str) -> str:
    """Go's ``strconv.Quote``: a double-quoted string, printable characters kept, the others escaped."""
    out = []
    for char in text:
        if char in _GO_ESCAPES:
            out.append(_GO_ESCAPES[char])
        elif char.isprintable():
            out.append(char)
        else:
            code = ord(char)
            out.append(f"\\x{code:02x}" if code < 0x80 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
    return '"' + "".join(out) + '"'


_GO_ESCAPES = {'"': '\\"', "\\": "\\\\", "\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r",
               "\t": "\\t", "\v": "\\v"}


def _parameters(params: dict[str, Any]) -> str:
    """Modelfile ``PARAMETER`` values as Ollama's ``parameters`` text: one line per value (a list's items one
    each), the name padded to 30 columns, the value in Go syntax (strings quoted)."""
    return "\n".join(f"{key:<30} {_go_syntax(item)}" for key, value in params.items()
                     for item in (value if isinstance(value, list) else [value]))


def _modelfile_quote(text: str) -> str:
    """An argument as Ollama's Modelfile writer quotes it: only text with a newline or edge spaces is quoted."""
    if "\n" in text or text.startswith(" ") or text.endswith(" "):
        return f'"""{text}"""' if '"' in text else f'"{text}"'
    return text


def _template(facts: dict[str, Any], model: ModelDetails) -> tuple[str, str]:
    """The chat template ``/api/show`` reports and the Modelfile's line saying what refsight renders prompts in.

    An Ollama model's own (the template layer: Ollama's Go template), else the one refsight renders in: the
    GGUF's ``tokenizer.chat_template`` or the checkpoint's chat template (Jinja)."""
    own = model.chat_template or ""
    gguf = model.arch is not None
    where = "the GGUF's own chat template (tokenizer.chat_template, Jinja)" if gguf else "the checkpoint's chat template (Jinja)"
    if facts.get("template"):
        return facts["template"], f"# refsight renders prompts in {where}, not in the Go TEMPLATE below"
    if own:
        return own, f"# TEMPLATE is {where}: refsight renders prompts in it"
    return "", "# the served model has no chat template: refsight joins the prompt's parts as they are"


def _modelfile(service: Any, model: ModelDetails, facts: dict[str, Any], template: tuple[str, str]) -> str:
    """The served model's Modelfile as ``ollama show --modelfile`` writes one: FROM (the model and projector
    files), TEMPLATE, SYSTEM and a PARAMETER line per value of the params layer."""
    files = model.files
    lines = ['# Modelfile generated by "ollama show" (refsight serve)',
             "# To build a new Modelfile based on this, replace FROM with:", f"# FROM {ollama_name(service)}",
             template[1], *(["# refsight: this model has RANDOM weights, its answers are meaningless"]
                            if service.random_weights else []), ""]
    lines += [f"FROM {path}" for path in files or [service.model]]
    if template[0]:
        lines.append(f"TEMPLATE {_modelfile_quote(template[0])}")
    if facts.get("system"):
        lines.append(f"SYSTEM {_modelfile_quote(facts['system'])}")
    for key, value in (facts.get("params") or {}).items():
        lines += [f"PARAMETER {key} {_modelfile_quote(_go_value(item))}" for item in (value if isinstance(value, list) else [value])]
    return "\n".join(lines) + "\n"


@router.post("/api/show", responses={k: ERROR_RESPONSES[k] for k in (400, 404)})
@needs_no_model
async def show(request: Request, body: OllamaShowBody, namespace: Namespace, service: ServiceDep) -> dict[str, Any]:
    """The served model's details, Modelfile, chat template, parameters and capabilities (``vision``, ``completion``,
    ``tools`` where the template teaches a call format, ``thinking`` where it reads a thinking variable), as Ollama's
    ``/api/show`` returns them (a field refsight does not know named in a ``refsight`` object)."""
    model = body.model or body.name
    if not model:
        raise ApiError(400, "invalid_input", "model: give the model's name", param="model")
    check_model(model, service)
    facts, details = model_facts(service), service.model_details()
    template = _template(facts, details)
    # Ollama's clients show model_info's facts (the ollama library keeps every key): a model with random weights
    # says so there, as every other route's reply does in its refsight object.
    info: dict[str, Any] = {"general.architecture": facts["details"]["family"],
                            "refsight.random_weights": service.random_weights}
    if service.context_size:
        info[f"{facts['details']['family']}.context_length"] = service.context_size
    # Every model refsight serves is a VLM; tools where its template teaches a call format (as Ollama reads a
    # template's tool support); thinking as Ollama decides it: the template reads a thinking variable (where it does
    # not, a thinking request is Ollama's 400: ..intake.template_variables); no insert.
    tools = service.generation_support().tools and format_of(service.facts.chat_template) is not None
    capabilities = ["completion", "vision", *(["tools"] if tools else []), *(["thinking"] if service.facts.thinks else [])]
    return {
        "modelfile": _modelfile(service, details, facts, template), "parameters": _parameters(facts.get("params") or {}),
        "template": template[0], "system": facts.get("system") or "", "details": facts["details"], "model_info": info,
        "capabilities": capabilities, "modified_at": facts["modified_at"],
        **ignored_object(log_ignored(request.url.path, body.ignored_fields())),
    }


_MANAGED = "refsight serves the model it was started with (refsight serve ollama:NAME[:TAG] reads Ollama's store); "

#: Ollama's store-management endpoints refsight refuses with a 400, each as (method, path, route name,
#: the route's description, what to do instead): its own command for it in Ollama.
_REFUSED = (
    ("POST", "/api/pull", "pull",
     "Refused: models are not downloaded here (``ollama pull`` into Ollama's store, then serve it).",
     "pull it with `ollama pull NAME`, then start refsight serve ollama:NAME"),
    ("POST", "/api/push", "push", "Refused: refsight does not publish models.", "push with `ollama push`"),
    ("POST", "/api/create", "create", "Refused: refsight does not build models (``ollama create`` does).",
     "create models with `ollama create`"),
    ("DELETE", "/api/delete", "delete", "Refused: refsight never changes Ollama's store.", "delete with `ollama rm`"),
    ("POST", "/api/copy", "copy",
     "Refused: refsight never changes Ollama's store (``--alias`` adds a name the server answers to).",
     "copy with `ollama cp`; refsight serve --alias NAME adds a name this server answers to"),
)


def _refuse(what: str) -> ApiError:
    return ApiError(400, "unsupported", _MANAGED + what)


def _add_refusal(method: str, path: str, name: str, description: str, what: str) -> None:
    async def refuse(namespace: Namespace) -> None:
        raise _refuse(what)

    router.add_api_route(path, refuse, methods=[method], name=name, description=description,
                         responses={400: ERROR_RESPONSES[400]})


for _refused in _REFUSED:
    _add_refusal(*_refused)


@router.post("/api/blobs/{digest}", responses={400: ERROR_RESPONSES[400]})
async def blobs(digest: str, namespace: Namespace) -> None:
    """Refused: blobs are uploaded for ``/api/create``, which refsight does not do."""
    raise _refuse("blobs are uploaded with `ollama create`")
