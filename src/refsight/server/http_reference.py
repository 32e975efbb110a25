"""The HTTP reference page of the docs site, generated from the server's own route table.

``docs/reference/http.md`` is :func:`markdown` verbatim (a test keeps the two equal and checks that every route of
the app has its section), so each route's method, path, dialect, key, body fields (types, limits, defaults,
descriptions: the body model's own), statuses and error shape are read from the route table, never kept in step by
hand (it reads the routes' internals, so it lives beside ``app.py``, where the CLI's lives beside its parser). The
prose of a section is its route's description (the route function's docstring); the routes the framework
adds, which have none, take theirs from :data:`FRAMEWORK_ROUTES`, and each group's opening from :data:`GROUPS`.
Regenerate with ``python -m refsight.server.http_reference > docs/reference/http.md``.
"""

from __future__ import annotations

import json
import re
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from starlette.routing import BaseRoute

from .app import create_app
from .config import ServerConfig
from .edge.gate import flat_routes, route_guard
from .edge.http_errors import error_response_for

__all__ = ["markdown", "routes", "anchor", "GROUPS", "FRAMEWORK_ROUTES"]

#: Each group of the page: its heading, its opening, and the route tags it gathers (in the page's order). A route
#: with no tag (the page, the schema) is refsight's own.
GROUPS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "refsight": ("refsight's own API", "References, comparisons, search and the service's own state: refsight's own "
                 "routes, whose errors are `{\"error\": {\"code\", \"message\"}}`.", ("service", "references", "judge", "")),
    "retrieval": ("Retrieval: embeddings, rerank and score", "The embedder and the reranker served on their own, in "
                  "the shapes of OpenAI's, vLLM's, llama-server's, Jina's, Cohere's and TEI's clients (the narrative: "
                  "[Embeddings and rerank](../http.md#embeddings-and-rerank)).", ("retrieval",)),
    "openai": ("OpenAI and vLLM", "OpenAI's API as vLLM and llama-server serve it; vLLM's own routes (`/score`, "
               "`/rerank`) are under retrieval.", ("openai",)),
    "llama-server": ("llama-server", "llama-server's own endpoints (the narrative: [Coming from llama-server]"
                     "(../http.md#coming-from-llama-server)).", ("llama-server",)),
    "ollama": ("Ollama", "Ollama's native API (the narrative: [Coming from Ollama](../http.md#coming-from-ollama)).",
               ("ollama",)),
    "anthropic": ("Anthropic", "Anthropic's Messages API as llama-server serves it.", ("anthropic",)),
}

#: The routes FastAPI itself adds (no route function of refsight's, so no docstring): path → the section's prose.
FRAMEWORK_ROUTES: dict[str, str] = {
    "/openapi.json": "The OpenAPI schema (left out of it: the page, and the paths that are another path's alias).",
    "/docs": "The schema's interactive page (Swagger UI).",
    "/docs/oauth2-redirect": "Swagger UI's OAuth2 redirect page (the interactive page's own).",
    "/redoc": "The schema as a ReDoc page.",
}

_KEYS = {"public": "none", "tenant": "a tenant's key, where keys are configured",
         "operator": "an operator's key, where keys are configured"}
_HINT = "a hint: accepted, changes nothing, named in `refsight.ignored`"
_INTRO = (
    "Generated from the server's route table (`python -m refsight.server.http_reference`): every route `refsight serve`",
    "answers, grouped by dialect, each with the key it needs, its statuses, its error body, its parameters and its",
    "body's fields (types, limits and defaults: the body model's own). `HEAD` on any `GET` route answers like `GET`,",
    "without a body. The narrative (limits, the memory bound, what differs from each original server) is the",
    "[HTTP API](../http.md) page.",
)
#: A parameter's Python type, in the JSON schema's words the body fields use.
_PYTHON_TYPES: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}
_ROLE = re.compile(r":[a-z]+:`~?\.*([\w.]+)`")


@dataclass(frozen=True)
class Route:
    """One route of the app: method, path, the route object, and the group its tag puts it in."""

    method: str
    path: str
    route: BaseRoute
    #: What matches a request to it: the route itself, or (recent FastAPI) its context in an included router, which
    #: carries the app's common responses.
    matcher: Any
    group: str

    @property
    def key(self) -> str:
        """``"METHOD PATH"``, the route's name in the route table's tests."""
        return f"{self.method} {self.path}"


def anchor(heading: str) -> str:
    """The anchor of a heading (``"POST /v1/rerank"``, a group's title): the docs site's and GitHub's slug of it."""
    text = re.sub(r"[^\w\s-]", "", heading).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def _group_of(route: Any) -> str:
    tag = (getattr(route, "tags", None) or [""])[0]
    return next(name for name, (_, _, tags) in GROUPS.items() if tag in tags)


def routes() -> list[Route]:
    """Every route of the app ``refsight serve`` builds (HEAD is GET's), in the route table's order."""
    with tempfile.TemporaryDirectory() as store:
        app = create_app(ServerConfig(store=Path(store) / "reference", model="toy", keys={}))
        return [Route(method, route.path, route, matcher, _group_of(route))
                for matcher, route in flat_routes(app.routes)
                for method in sorted(getattr(route, "methods", None) or ()) if method != "HEAD"]


def _prose(text: str) -> str:
    """A docstring in the docs' Markdown: ``code`` as `code`, a Sphinx role as its name."""
    return _ROLE.sub(lambda m: f"`{m.group(1).rsplit('.', 1)[-1]}`", text.replace("``", "`")).strip()


def _cell(text: Any) -> str:
    return " ".join(str(text).replace("|", "\\|").split())


def _type(schema: dict[str, Any]) -> str:
    """A JSON schema's type in a few words: ``string``, ``array of Message``, ``integer or string``."""
    if "$ref" in schema:
        return schema["$ref"].rsplit("/", 1)[-1]
    if "enum" in schema:
        return " or ".join(json.dumps(v) for v in schema["enum"])
    if "const" in schema:
        return json.dumps(schema["const"])
    if "anyOf" in schema or "oneOf" in schema:
        kinds = [_type(s) for s in schema.get("anyOf", schema.get("oneOf", [])) if s.get("type") != "null"]
        return " or ".join(dict.fromkeys(kinds))
    kind = schema.get("type", "any")
    if kind == "array":
        return f"array of {_type(schema['items'])}" if schema.get("items") else "array"
    return kind


_LIMITS = (("minimum", "≥ {}"), ("maximum", "≤ {}"), ("exclusiveMinimum", "> {}"), ("exclusiveMaximum", "< {}"),
           ("minLength", "at least {} character(s)"), ("maxLength", "at most {} characters"),
           ("minItems", "at least {} item(s)"), ("maxItems", "at most {} items"), ("maxProperties", "at most {} keys"),
           ("pattern", "matches `{}`"))


def _limits(schema: dict[str, Any]) -> str:
    parts = [schema, *schema.get("anyOf", []), *schema.get("oneOf", [])]
    return ", ".join(dict.fromkeys(form.format(part[name]) for part in parts for name, form in _LIMITS if name in part))


def _fields(model: type | None, schema: dict[str, Any]) -> list[str]:
    """One row per field of a body's JSON schema: type, required or default, limits, description."""
    hints = getattr(model, "hints", frozenset())
    required = set(schema.get("required", ()))
    rows = ["| field | type | required / default | limits | description |", "|---|---|---|---|---|"]
    for name, field in schema.get("properties", {}).items():
        given = "required" if name in required else f"`{json.dumps(field['default'])}`" if "default" in field else ""
        description = field.get("description", "") or (_HINT if name in hints else "")
        rows.append(f"| `{name}` | {_cell(_type(field))} | {_cell(given)} | {_cell(_limits(field))} | "
                    f"{_cell(description)} |")
    return rows


def _body(route: Any) -> list[str]:
    """The body's model, media types and fields: the route's body model, or the schema it declares for a body it
    reads itself (JSON or multipart)."""
    field = getattr(route, "body_field", None)
    model = field.field_info.annotation if field is not None else None
    if model is not None:
        schema, media = model.model_json_schema(), ["application/json"]
    else:
        content = ((getattr(route, "openapi_extra", None) or {}).get("requestBody") or {}).get("content")
        if not content:
            return []
        schema, media = content["application/json"]["schema"], list(content)
    kind = ("unknown fields refused (422)" if model is None or getattr(model, "model_config", {}).get("extra") ==
            "forbid" else "unknown fields accepted and named in the reply's `refsight.ignored`")
    head = (f"**Body** (`{schema.get('title', 'body')}`; {', '.join(f'`{m}`' for m in media)}; strict types; "
            f"{kind}):")
    return ["", head, "", *_fields(model, schema)]


def _parameters(route: Any) -> list[str]:
    """Path and query parameters, the route's own and its dependencies'."""
    def walk(dependant: Any) -> Iterator[Any]:
        yield dependant
        for sub in dependant.dependencies:
            yield from walk(sub)

    dependant = getattr(route, "dependant", None)
    if dependant is None:
        return []
    lines = []
    for where in ("path", "query"):
        params = [p for d in walk(dependant) for p in getattr(d, f"{where}_params")]
        for param in params:
            info = param.field_info
            limits = [f"{op} {getattr(m, name)}" for m in info.metadata
                      for name, op in (("ge", "≥"), ("le", "≤"), ("gt", ">"), ("lt", "<")) if hasattr(m, name)]
            default = "" if info.is_required() else f", default `{json.dumps(info.default)}`"
            limit = f", {', '.join(limits)}" if limits else ""
            kind = _PYTHON_TYPES.get(info.annotation, getattr(info.annotation, "__name__", str(info.annotation)))
            lines.append(f"- {where} parameter `{param.name}` ({kind}{default}{limit})")
    return lines


def _declared(entry: Route) -> dict[str, str]:
    """The statuses a route declares (the app's common ones included), each with its description."""
    responses = getattr(entry.matcher, "responses", None) or {}
    return {str(code): _cell(responses[code].get("description", "")) for code in responses}


def _common(entries: list[Route]) -> dict[str, str]:
    """The error statuses every route of refsight's own declares (the app's: auth, limits, overload, store)."""
    declared = [_declared(entry) for entry in entries if _declared(entry)]
    return {code: text for code, text in sorted(declared[0].items()) if all(code in d for d in declared)}


def _errors(entry: Route, common: dict[str, str]) -> list[str]:
    """The key, the statuses the route declares beyond the common ones, and its error body's shape (read from the
    error replies themselves)."""
    success = str(getattr(entry.route, "status_code", None) or 200)
    declared = _declared(entry)
    # A refusal's route (its description says so: Ollama's store management) never answers its success status.
    refused = (getattr(entry.route, "description", "") or "").startswith("Refused")
    lines = [f"- key: {_KEYS[route_guard(entry.route)]}", f"- success: {'none (always refused)' if refused else success}"]
    if not declared:
        return lines
    shape = json.loads(error_response_for(entry.path, 400, "CODE", "MESSAGE").body)
    own = sorted(code for code in declared if code not in common and code != success)
    lines += [f"- errors: {', '.join(sorted([*own, *common]))}"] + [f"  - {code}: {declared[code]}" for code in own]
    return lines + [f"- error body: `{json.dumps(shape)}`"]


def _section(entry: Route, first: Route | None, common: dict[str, str]) -> list[str]:
    """A route's section: its prose, then (unless it is another path of an earlier route's function) its facts."""
    lines = ["", f"### `{entry.method} {entry.path}`", ""]
    if first is not None:
        return lines + [f"The same route as [`{first.key}`](#{anchor(first.key)}): the same body, "
                        "reply and errors."]
    description = getattr(entry.route, "description", "") or FRAMEWORK_ROUTES.get(entry.path, "")
    if not description:
        raise LookupError(f"{entry.key} has no description: give its route function a docstring")
    return lines + [_prose(description), "", *_errors(entry, common), *_parameters(entry.route), *_body(entry.route)]


def sections(entries: list[Route]) -> dict[str, list[str]]:
    """``"METHOD PATH"`` → its section's lines, for every route. Of the paths one route function serves, the one
    in the OpenAPI schema has the facts and the others (aliases kept out of the schema) point to it."""
    common = _common(entries)
    serving: dict[Any, list[Route]] = {}
    for entry in entries:
        serving.setdefault((entry.method, getattr(entry.route, "endpoint", None) or entry.key), []).append(entry)
    out: dict[str, list[str]] = {}
    for same in serving.values():
        first = next((e for e in same if getattr(e.route, "include_in_schema", False)), same[0])
        for entry in same:
            out[entry.key] = _section(entry, first if first is not entry else None, common)
    return out


def markdown() -> str:
    """The whole HTTP reference page: an index of every route, the common errors, then each group's sections."""
    entries = routes()
    by_key = sections(entries)
    lines = ["# HTTP reference", "", *_INTRO, "", "| route | group |", "|---|---|"]
    lines += [f"| [`{e.key}`](#{anchor(e.key)}) | {GROUPS[e.group][0]} |" for e in entries]
    lines += ["", "Every route of refsight's (all but the framework's schema pages) may answer:", ""]
    lines += [f"- {code}: {text}" for code, text in _common(entries).items()]
    for name, (title, opening, _) in GROUPS.items():
        lines += ["", f"## {title}", "", opening]
        for entry in entries:
            if entry.group == name:
                lines += by_key[entry.key]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
