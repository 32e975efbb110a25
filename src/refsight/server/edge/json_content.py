"""How a JSON request body is read: one label rule, one decoding and one set of checks for every route.

**The label.** llama-server and Ollama parse every POST body as JSON whatever the ``Content-Type``
says, so their clients (and ``curl -d``, which sends ``application/x-www-form-urlencoded``; Ollama's
own examples use it) often send no JSON media type at all; FastAPI would then refuse the body
("Input should be a valid dictionary"). :class:`JsonContentMiddleware` labels the body of a request
to one of :data:`JSON_ROUTES` ``application/json`` before routing, so it is parsed (and checked) as
JSON exactly as a correctly labelled one. Other routes keep their own rules (the reference and
compare routes take multipart too, and refuse other types with 415).

**The decoding and the checks.** :func:`checked_json_body` is what
:class:`~refsight.server.edge.limits.BodyLimitMiddleware` applies to every body that :func:`is_json`
(a JSON label, or none), before any route sees it: the bytes are decoded strictly
(:func:`~refsight.inputs.jsonlimits.json_utf8`: UTF-8, or UTF-16/UTF-32 detected as RFC 7159
allows, handed on as UTF-8), measured in one bounded pass (nesting over
:data:`~refsight.inputs.jsonlimits.MAX_JSON_DEPTH`, more than :data:`MAX_BODY_VALUES` values: each parsed value costs
50-130 bytes), and any ``\\uD800``-``\\uDFFF`` escape makes the strings be checked for lone
surrogates, naming the field. So every route, whichever parser it uses (FastAPI's for pydantic
bodies, :func:`~refsight.server.intake.bodies.read_body`), reads the same checked UTF-8.
"""

from __future__ import annotations

import json
import re
from typing import Any

from ... import InvalidInputError
from ...inputs.jsonlimits import MAX_JSON_DEPTH
from ...inputs.jsonlimits import json_shape, json_utf8
from ...inputs.text import check_text, check_texts
from .http_errors import ApiError

__all__ = ["JsonContentMiddleware", "JSON_ROUTES", "MAX_BODY_VALUES", "checked_json_body", "is_json"]

#: The routes whose bodies are JSON whatever their label: llama-server's POST routes (with and without
#: /v1) and Ollama's (``/api/delete`` is a DELETE; ``/api/blobs/...`` takes raw bytes, so it is not here).
JSON_ROUTES = frozenset({
    "/completion", "/completions", "/v1/completions", "/chat/completions", "/v1/chat/completions",
    "/tokenize", "/detokenize", "/apply-template", "/embedding", "/embeddings", "/v1/embeddings", "/rerank",
    "/reranking", "/v1/rerank", "/v1/reranking",
    "/api/chat", "/api/generate", "/api/show", "/api/embed", "/api/embeddings", "/api/pull", "/api/push",
    "/api/create", "/api/copy", "/api/delete",
})
_BODY_METHODS = frozenset({"POST", "DELETE"})
#: Most values (one, plus one per ``,``, ``[`` and ``{`` outside strings) one JSON body may hold: 16 times
#: the longest list any route takes (``/detokenize``'s 65,536 tokens), and at most ~130 MB once parsed.
MAX_BODY_VALUES = 1 << 20
#: A JSON ``\\uD800``-``\\uDFFF`` escape: half of a surrogate pair, or a lone surrogate.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


class JsonContentMiddleware:
    """ASGI middleware: a request to one of ``routes`` (:data:`JSON_ROUTES`, and a route the config adds, as Vertex
    AI's predict route) without a JSON media type is labelled ``application/json``."""

    def __init__(self, app: Any, routes: frozenset[str] = JSON_ROUTES) -> None:
        self.app = app
        self.routes = routes

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] in _BODY_METHODS and scope["path"] in self.routes:
            # ASGI header names are lower-case bytes; a charset parameter keeps an application/json label as it is.
            labels = [v.split(b";")[0].strip().lower() for k, v in scope["headers"] if k == b"content-type"]
            if labels != [b"application/json"]:
                headers = [(k, v) for k, v in scope["headers"] if k != b"content-type"]
                # A copy: the server keeps its own scope.
                scope = {**scope, "headers": [*headers, (b"content-type", b"application/json")]}
        await self.app(scope, receive, send)


def is_json(scope: dict) -> bool:
    """Whether the request's body is read as JSON: a JSON media type, or none (FastAPI parses that as JSON too)."""
    content_type = dict(scope.get("headers") or []).get(b"content-type", b"").split(b";")[0].strip().lower()
    return not content_type or content_type == b"application/json" or content_type.endswith(b"+json")


def checked_json_body(body: bytes) -> bytes:
    """``body`` as checked UTF-8 JSON text; :class:`ApiError` 400 ``invalid_input`` naming the body or the field.

    Bytes that do not decode, nesting over :data:`~refsight.inputs.jsonlimits.MAX_JSON_DEPTH`, more than
    :data:`MAX_BODY_VALUES` values, and a lone surrogate in any string (``param``: its field) are
    refused; malformed JSON is left to the route, which says so in its own words.
    """
    try:
        text = json_utf8(body, "request body")
    except InvalidInputError as e:
        raise ApiError(400, "invalid_input", str(e)) from None
    depth, values = json_shape(text, max_depth=MAX_JSON_DEPTH, max_values=MAX_BODY_VALUES)
    if depth > MAX_JSON_DEPTH:
        raise ApiError(400, "invalid_input", f"request body: JSON nested more than {MAX_JSON_DEPTH} levels deep "
                       f"(the limit is {MAX_JSON_DEPTH})")
    if values > MAX_BODY_VALUES:
        raise ApiError(400, "invalid_input", f"request body: JSON holds more than {MAX_BODY_VALUES} values "
                       f"(the limit is {MAX_BODY_VALUES})")
    # Strict UTF-8 holds no lone surrogate: only an escape can make one (emoji sent as pairs included).
    if _SURROGATE_ESCAPE.search(text) is not None:
        invalid = _first_invalid_text(text)
        if invalid is not None:
            raise ApiError(400, "invalid_input", str(invalid), param=invalid.input)
    return text


def _first_invalid_text(text: bytes) -> InvalidInputError | None:
    """The error naming the first string of JSON ``text`` that is not valid Unicode, or None."""
    try:
        data = json.loads(text)
    except ValueError:
        return None  # not JSON: the route says so in its own words
    items = data.items() if isinstance(data, dict) else [("request body", data)]
    try:
        for field, value in items:
            check_text(field, "request body key")
            check_texts(value, field)
    except InvalidInputError as e:
        return e
    return None
