"""Every error the service returns, as ``{"error": {"code", "message"}}`` with a stable ``code``.

Clients branch on ``code``; ``message`` is for people. Library errors (the
:mod:`refsight.errors` tree) are translated here and only here. Unexpected
exceptions are logged on the server with their traceback and reach the client as a
generic ``internal_error``: stack traces and internals never leave the process.

Codes, by status::

    400 invalid_input, invalid_image, invalid_rubric, invalid_reference_id, unsupported,
        media_not_allowed, media_unavailable (an image URL: remote_media.py),
        duplicate_header (a header the edge decides by, given twice: single_headers.py)
    401 unauthorized          403 forbidden         404 not_found, reference_not_found, model_not_found
    405 method_not_allowed    408 request_timeout (the request did not arrive in time; see connections.py)
    413 body_too_large        415 unsupported_media_type
    422 validation_error      429 overloaded        500 internal_error, backend_error, store_error
    503 store_unavailable     (the store's disk is full or read-only; nothing stored is lost, retry later)
    503 unavailable           (``/slots?fail_on_no_slot=1`` with every slot busy, as llama-server answers it)
    501 not_supported         (``/slots`` on a server started with ``--no-slots``, as llama-server answers it)

Messages use the HTTP API's words: a library message that names a command-line flag
(``--top-k``) is translated to the request field (``top_k``) by :func:`http_wording`.

Ollama's routes (:data:`OLLAMA_PATHS`) answer ``{"error": "message"}`` (and the ``code``), as
Ollama's clients read it. The OpenAI-compatible routes (:data:`OPENAI_PATHS`) answer in OpenAI's error shape so the
OpenAI SDKs raise their own typed exceptions: the same ``code`` and ``message`` plus
``type`` (``invalid_request_error``, ``authentication_error`` ...) and ``param`` (the
request field at fault, or null), and a request that does not match the schema is a 400
there (OpenAI's status, and Ollama's), not a 422. Errors that middlewares answer before any route
are reshaped for those paths by :class:`~refsight.server.edge.error_shapes.ErrorShapeMiddleware`.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ...errors import (
    BackendError,
    CorruptPackageError,
    GenerationError,
    ContextLengthError,
    ImageError,
    InvalidInputError,
    InvalidReferenceIdError,
    ModelLoadError,
    NotFoundError,
    PackageNotFoundError,
    ReferenceNotFoundError,
    RefsightError,
    RubricError,
    StoreError,
    StoreUnavailableError,
    UnknownModelError,
)
from .responses import TextSafeJSONResponse
from .validation import error_field, validation_message

__all__ = [
    "ApiError",
    "ERROR_STATUS",
    "status_of",
    "from_refsight",
    "error_body",
    "error_response",
    "install_error_handlers",
    "CatchAllMiddleware",
    "ERROR_RESPONSES",
    "OPENAI_PATHS",
    "OLLAMA_PATHS",
    "openai_error_body",
    "ollama_error_body",
    "anthropic_error_body",
    "ANTHROPIC_PATHS",
    "fields_named",
    "inputs_as_fields",
    "error_response_for",
]

log = logging.getLogger("refsight.server")

#: Generic codes for HTTP statuses raised by the framework itself (routing, methods).
_STATUS_CODES = {
    400: "invalid_input",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    413: "body_too_large",
    415: "unsupported_media_type",
    422: "validation_error",
    429: "overloaded",
}


class ApiError(Exception):
    """An error meant for the client: HTTP ``status``, stable ``code``, human ``message``.

    ``param`` names the request field at fault (shown by the OpenAI-compatible routes).
    """

    def __init__(
        self, status: int, code: str, message: str, *, headers: dict[str, str] | None = None, param: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers or {}
        self.param = param


#: Route prefixes that answer errors in the OpenAI shape.
OPENAI_PATHS = ("/v1/chat/", "/chat/", "/v1/models", "/models", "/v1/completions", "/completion", "/tokenize", "/detokenize",
                "/apply-template", "/v1/embeddings", "/embedding", "/v1/rerank", "/rerank", "/v2/rerank", "/v1/reranking",
                "/score", "/v1/score")

#: Route prefixes that answer errors in Ollama's shape (:func:`ollama_error_body`).
OLLAMA_PATHS = ("/api/",)

#: Route prefixes that answer errors in Anthropic's shape (:func:`anthropic_error_body`).
ANTHROPIC_PATHS = ("/v1/messages",)

#: Anthropic's error ``type`` per HTTP status (anything else 4xx: invalid_request_error; 5xx: api_error).
_ANTHROPIC_TYPES = {
    401: "authentication_error", 403: "permission_error", 404: "not_found_error", 413: "request_too_large",
    429: "rate_limit_error", 503: "overloaded_error",
}

#: OpenAI's error ``type`` per HTTP status (anything else 4xx: invalid_request_error).
_OPENAI_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
}


def openai_error_body(status: int, code: str, message: str, param: str | None = None) -> dict[str, Any]:
    """The OpenAI error shape: ``{"error": {"message", "type", "param", "code"}}``."""
    kind = "server_error" if status >= 500 else _OPENAI_TYPES.get(status, "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def ollama_error_body(code: str, message: str) -> dict[str, Any]:
    """Ollama's error shape, ``{"error": "message"}`` (what its clients raise with), and refsight's stable ``code`` beside it."""
    return {"error": message, "code": code}


def anthropic_error_body(status: int, code: str, message: str, param: str | None = None) -> dict[str, Any]:
    """Anthropic's error shape, ``{"type": "error", "error": {"type", "message"}}`` (what its SDK raises with),
    with refsight's stable ``code`` and the ``param`` at fault beside them."""
    kind = _ANTHROPIC_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message, "code": code, "param": param}}


def _respond(request: Request, status: int, code: str, message: str, headers=None, param: str | None = None) -> JSONResponse:
    return error_response_for(request.url.path, status, code, message, headers, param=param)


def error_response_for(
    path: str, status: int, code: str, message: str, headers: dict[str, str] | None = None, *, param: str | None = None
) -> JSONResponse:
    """The error response in the shape of ``path``'s routes: OpenAI's, Ollama's (:data:`OLLAMA_PATHS`), else refsight's."""
    if path.startswith(OPENAI_PATHS):
        return TextSafeJSONResponse(openai_error_body(status, code, message, param), status_code=status, headers=headers)
    if path.startswith(OLLAMA_PATHS):
        return TextSafeJSONResponse(ollama_error_body(code, message), status_code=status, headers=headers)
    if path.startswith(ANTHROPIC_PATHS):
        body = anthropic_error_body(status, code, message, param)
        return TextSafeJSONResponse(body, status_code=status, headers=headers)
    return error_response(status, code, message, headers)


def error_body(code: str, message: str) -> dict[str, Any]:
    """The JSON body of every error response."""
    return {"error": {"code": code, "message": message}}


def error_response(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    """A JSON error response (also used by the ASGI middlewares, which cannot raise into handlers)."""
    return TextSafeJSONResponse(error_body(code, message), status_code=status, headers=headers)


#: Command-line flags that library messages may name, and the request fields they mean.
_FLAG_FIELDS = {
    "--ref": "ref_ids",
    "--top-k": "top_k",
    "--query": "query",
    "--criteria": "criteria",
    "--where": "where",
    "--meta": "metadata",
    "--id": "id",
    "--image": "image",
    "--k": "k",
}
_FLAG = re.compile(r"(?<![\w-])(" + "|".join(re.escape(f) for f in sorted(_FLAG_FIELDS, key=len, reverse=True)) + r")(?![\w-])")


def http_wording(message: str) -> str:
    """``message`` with command-line flags replaced by the HTTP request fields they correspond to."""
    return _FLAG.sub(lambda m: _FLAG_FIELDS[m.group(1)], message)


#: Every library error class → (HTTP status, stable code). Looked up along the class's MRO, so
#: a subclass without its own row maps like its parent; a test enumerates every subclass.
ERROR_STATUS: dict[type[RefsightError], tuple[int, str]] = {
    RefsightError: (500, "internal_error"),
    InvalidInputError: (400, "invalid_input"),
    ImageError: (400, "invalid_image"),
    ContextLengthError: (400, "exceed_context_size_error"),
    RubricError: (400, "invalid_rubric"),
    InvalidReferenceIdError: (400, "invalid_reference_id"),
    NotFoundError: (404, "not_found"),
    ReferenceNotFoundError: (404, "reference_not_found"),
    PackageNotFoundError: (404, "not_found"),
    UnknownModelError: (404, "model_not_found"),
    CorruptPackageError: (500, "store_error"),
    StoreError: (500, "store_error"),
    StoreUnavailableError: (503, "store_unavailable"),
    BackendError: (500, "backend_error"),
    ModelLoadError: (500, "backend_error"),
    GenerationError: (500, "backend_error"),
}

#: What a client is told for server-side failures (details stay in the server log).
_GENERIC = {
    "internal_error": "internal server error",
    "store_error": "the reference store failed",
    "backend_error": "the model failed to process the request",
}


def status_of(error: RefsightError) -> tuple[int, str]:
    """The (status, code) of a library error: the row of its nearest class in :data:`ERROR_STATUS`."""
    for cls in type(error).__mro__:
        if cls in ERROR_STATUS:
            return ERROR_STATUS[cls]
    return ERROR_STATUS[RefsightError]


def from_refsight(error: RefsightError) -> ApiError:
    """Translate a library error into the client's view of it (in the HTTP API's words)."""
    status, code = status_of(error)
    if isinstance(error, StoreUnavailableError):
        # A full or read-only disk, an unreachable catalog: nothing is lost; the client may retry.
        # The reason says what failed (a read during a catalog outage was never "cannot be written").
        return ApiError(
            status, code, f"the reference store is unavailable: {error.reason}; retry later",
            headers={"Retry-After": "60"},
        )
    if isinstance(error, ReferenceNotFoundError):
        # The same words whether the id never existed or belongs to another tenant.
        return ApiError(status, code, f"reference not found: {error.name!r}")
    if isinstance(error, UnknownModelError):
        return ApiError(status, code, f"model not found: {error.name!r}")
    if status >= 500:
        return ApiError(status, code, _GENERIC.get(code, str(error)))
    if isinstance(error, ContextLengthError) and error.n_prompt_tokens >= error.n_ctx:
        # A prompt the context cannot take: llama-server's sentence (its clients match on it), refsight's count after.
        return ApiError(status, code, f"request ({error.n_prompt_tokens} tokens) exceeds the available context size "
                        f"({error.n_ctx} tokens), try increasing it; {http_wording(str(error))}")
    return ApiError(status, code, http_wording(str(error)))


@contextmanager
def fields_named(**values: Any) -> Iterator[None]:
    """Name the request field of a library error that names its input by a blank value.

    The library names some inputs by their value (a query text); an empty one would read as
    an empty field name (``": a text query must be a non-empty string"``). Inside this block
    such an error is re-raised naming the field (``text``) that held that value.
    """
    try:
        yield
    except InvalidInputError as e:
        if isinstance(e.input, str) and not e.input.strip():
            field = next((name for name, value in values.items() if value == e.input), None)
            if field is not None:
                raise InvalidInputError(field, e.reason) from None
        raise


@contextmanager
def inputs_as_fields(**fields: str) -> Iterator[None]:
    """Name a library error's input as the request field that carried it (``rubric`` -> ``criteria``).

    The library names what it parsed (a rubric); the client sent a field. Inside this block an
    :class:`InvalidInputError` naming one of ``fields``' keys is re-raised naming its value.
    """
    try:
        yield
    except InvalidInputError as e:
        if isinstance(e.input, str) and e.input in fields:
            raise type(e)(fields[e.input], e.reason) from None
        raise


def _param_of(error: RefsightError) -> str | None:
    # An InvalidInputError names its input; only a field name (a short string) is a param.
    named = getattr(error, "input", None)
    return named if isinstance(named, str) and len(named) <= 80 else None


def _validation_message(exc: RequestValidationError) -> str:
    return validation_message(exc.errors())


def _with_details(response: JSONResponse, details: dict[str, Any] | None) -> JSONResponse:
    """``response`` with ``details`` beside the message (llama-server's ``n_prompt_tokens`` / ``n_ctx``), where
    its error is an object (Ollama's is a string: it keeps its shape)."""
    if not details:
        return response
    body = json.loads(bytes(response.body))
    if not isinstance(body.get("error"), dict):
        return response
    body["error"].update(details)
    headers = {k: v for k, v in response.headers.items() if k.lower() not in ("content-length", "content-type")}
    return TextSafeJSONResponse(body, status_code=response.status_code, headers=headers)


def install_error_handlers(app: FastAPI) -> None:
    """Make every error the app can raise a JSON error body with a stable code."""

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return _respond(request, exc.status, exc.code, exc.message, exc.headers, exc.param)

    @app.exception_handler(RefsightError)
    async def _refsight_error(request: Request, exc: RefsightError) -> JSONResponse:
        api = from_refsight(exc)
        if api.status >= 500:
            # The details stay in the server log; the client gets the generic message.
            log.error("%s %s failed: %s", request.method, request.url.path, exc, exc_info=exc)
        response = _respond(
            request, api.status, api.code, api.message, api.headers,
            param=_param_of(exc) if api.status < 500 else None,
        )
        return _with_details(response, getattr(exc, "details", None))

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        if request.url.path.startswith((*OPENAI_PATHS, *OLLAMA_PATHS, *ANTHROPIC_PATHS)):
            # OpenAI, Ollama and Anthropic answer a malformed request with 400 (OpenAI names the field).
            first = (exc.errors() or [{}])[0]
            param = error_field(first) if first.get("loc") else None
            return _respond(request, 400, "invalid_input", _validation_message(exc), param=param)
        return error_response(422, "validation_error", _validation_message(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = _STATUS_CODES.get(exc.status_code, "internal_error" if exc.status_code >= 500 else "http_error")
        message = exc.detail if isinstance(exc.detail, str) else "request failed"
        if exc.status_code == 404 and message == "Not Found":
            message = f"no such endpoint: {request.method} {request.url.path}"
        if exc.status_code == 405:
            message = f"method {request.method} is not allowed on {request.url.path}"
        return _respond(request, exc.status_code, code, message, getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.error("%s %s crashed", request.method, request.url.path, exc_info=exc)
        return _respond(request, 500, "internal_error", "internal server error")


class CatchAllMiddleware:
    """ASGI middleware: an unexpected exception becomes a JSON 500, logged here with its traceback.

    Starlette's own last-resort handler re-raises after answering, which makes the
    server drop the connection; a client with a keep-alive connection would then see
    its *next* request fail. Catching here answers and keeps the connection usable.
    """

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: dict) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception as exc:
            log.error("%s %s crashed", scope.get("method"), scope.get("path"), exc_info=exc)
            if started:  # too late for a clean answer: let the server close the connection
                raise
            response = error_response_for(str(scope.get("path", "")), 500, "internal_error", "internal server error")
            await response(scope, receive, send)


def _schema(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {
            "application/json": {
                "schema": {
                    "type": "object",
                    "required": ["error"],
                    "properties": {
                        "error": {
                            "type": "object",
                            "required": ["code", "message"],
                            "properties": {"code": {"type": "string"}, "message": {"type": "string"}},
                        }
                    },
                }
            }
        },
    }


#: OpenAPI ``responses`` entries documenting the error body, for route decorators.
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: _schema("Bad input (the message names the input and the reason)"),
    401: _schema("Missing or wrong API key"),
    404: _schema("Not found (another tenant's reference reads exactly like an absent one)"),
    413: _schema("Request body over the limit"),
    422: _schema("Request does not match the schema"),
    429: _schema("Too many requests in flight; retry later"),
    500: _schema("Internal error (no details are given to clients)"),
    503: _schema("The store is unavailable now (disk full or read-only, catalog unreachable); nothing is lost, retry later"),
}
