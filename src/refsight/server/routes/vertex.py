"""Vertex AI's prediction protocol, as llama-server serves it (``AIP_MODE=PREDICTION``).

A custom container on Vertex AI gets one route, ``AIP_PREDICT_ROUTE`` (default ``/predict``): a body
``{"instances": [...]}``, each instance a request to one of the server's own routes named by its ``@requestFormat``
(llama-server's camelCase of the route's path: ``chatCompletions`` is ``/v1/chat/completions``, ``applyTemplate``
``/apply-template``; or the path itself), answered ``{"predictions": [...]}`` in the instances' order, each the
route's own JSON reply (an error reply included, as llama-server answers it). An instance's ``stream`` is set false
(the protocol has no streams). At most :data:`MAX_INSTANCES` instances (llama-server's bound), run at most
``workers`` at a time.

Each instance is a request to this app in-process (ASGI, no HTTP client), with the caller's ``Authorization``,
``X-Api-Key`` and ``Host``: the same key check, limits, work pool and dialect rules as if it had been sent alone (a
caller that leaves does not stop the instances under way: each is bounded as it would be alone). ``AIP_HEALTH_ROUTE`` serves
``/health`` under that path too. :func:`vertex_routes` adds both to an app whose config names them
(:attr:`~refsight.server.ServerConfig.vertex_predict_route`; ``refsight serve`` reads the environment as
llama-server does).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from fastapi import Depends, FastAPI, Request

from ...errors import InvalidInputError
from ..edge.auth import require_tenant
from ..edge.gate import flat_routes
from ..edge.http_errors import ApiError

__all__ = ["MAX_INSTANCES", "vertex_routes", "request_format"]

#: Instances one prediction request may hold (llama-server's ``MAX_INSTANCES``).
MAX_INSTANCES = 128
#: The caller's headers each instance is sent with.
_FORWARDED = ("authorization", "x-api-key", "host")


def request_format(path: str) -> str:
    """The ``@requestFormat`` alias of a route's path, as llama-server derives it (``path_to_gcp_format``): ``/v1``
    dropped, each part after ``/``, ``-`` or ``_`` capitalised, nothing from a path parameter on."""
    name = path[3:] if path.startswith("/v1") and len(path) > 3 else path
    name = name.removeprefix("/").split("{", 1)[0]
    out, capital = [], False
    for char in name:
        if char in "/-_":
            capital = True
        else:
            out.append(char.upper() if capital else char)
            capital = False
    return "".join(out)


def vertex_routes(app: FastAPI, predict_route: str, health_route: str | None, workers: int) -> None:
    """Add Vertex AI's predict route (and its health route) to ``app``, after its own routes."""
    routes = [route for _, route in flat_routes(app.routes) if getattr(route, "path", None)]
    posts = [route.path for route in routes if "POST" in (getattr(route, "methods", None) or ()) and "{" not in route.path]
    if predict_route in posts:
        raise InvalidInputError("vertex_predict_route", f"{predict_route} is one of the server's own routes")
    aliases: dict[str, str] = {}
    for path in posts:  # the first registration wins, as in llama-server
        aliases.setdefault(request_format(path), path)
    paths = set(posts)
    slots = asyncio.Semaphore(max(workers, 1))

    async def predict(request: Request) -> dict[str, Any]:
        """Vertex AI's prediction request: each instance answered by the route its ``@requestFormat`` names."""
        try:
            body = json.loads(await request.body())
        except ValueError as e:  # malformed JSON or text: the caller's mistake, named (never a 500)
            raise ApiError(400, "invalid_input", f"body: not JSON ({e})", param="body") from None
        instances = _instances(body)
        headers = [(name.encode(), request.headers[name].encode("latin-1"))
                   for name in _FORWARDED if name in request.headers]

        async def one(instance: Any) -> Any:
            path, payload = _dispatch(instance, aliases, paths)
            if path is None:
                return payload
            async with slots:
                reply = await _post(app, request.scope, path, headers, json.dumps(payload).encode())
            try:
                return json.loads(reply)
            except ValueError:
                return reply.decode("utf-8", "replace")

        return {"predictions": await asyncio.gather(*(one(instance) for instance in instances))}

    # A tenant's route, as each instance's is: the caller's key is checked before any instance runs.
    app.add_api_route(predict_route, predict, methods=["POST"], include_in_schema=False,
                      dependencies=[Depends(require_tenant)])
    if health_route:
        health = next(route for route in routes if route.path == "/health")
        app.add_api_route(health_route, health.endpoint, methods=["GET"], include_in_schema=False)


async def _post(app: Any, outer: dict[str, Any], path: str, headers: list[tuple[bytes, bytes]], body: bytes) -> bytes:
    """The body of the app's reply to ``POST path`` sent in-process (the whole middleware stack, as from outside),
    from the caller's connection (``outer``: its client, server and scheme)."""
    scope = {"type": "http", "asgi": outer.get("asgi", {"version": "3.0"}), "http_version": "1.1", "method": "POST",
             "scheme": outer.get("scheme", "http"), "path": path, "raw_path": path.encode(), "query_string": b"",
             "root_path": "", "headers": [*headers, (b"content-type", b"application/json"),
                                           (b"content-length", str(len(body)).encode())],
             "client": outer.get("client"), "server": outer.get("server"), "state": dict(outer.get("state") or {})}
    sent, chunks = False, []

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent:  # the body was read: what follows is the client staying, never a disconnect
            await asyncio.Event().wait()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await app(scope, receive, send)
    return b"".join(chunks)


def _instances(body: Any) -> list[Any]:
    """The body's instances; a 400 naming ``instances`` when it has none, or more than :data:`MAX_INSTANCES`."""
    instances = body.get("instances") if isinstance(body, dict) else None
    if not isinstance(instances, list):
        raise ApiError(400, "invalid_input", "instances: the body is an object with an array named instances",
                       param="instances")
    if len(instances) > MAX_INSTANCES:
        raise ApiError(400, "invalid_input", f"instances: at most {MAX_INSTANCES}, got {len(instances)}",
                       param="instances")
    return instances


def _dispatch(instance: Any, aliases: dict[str, str], paths: set[str]) -> tuple[str | None, Any]:
    """``(path, body)`` of one instance, or ``(None, error)``: llama-server answers a bad instance in its place."""
    if not isinstance(instance, dict):
        return None, _error("each instance must be a JSON object")
    fmt = instance.get("@requestFormat")
    if not isinstance(fmt, str):
        return None, _error("each instance must include a string @requestFormat")
    path = aliases.get(fmt) or (fmt if fmt in paths else None)
    if path is None:
        return None, _error(f"no handler registered for @requestFormat: {fmt}")
    payload = {key: value for key, value in instance.items() if key != "@requestFormat"}
    if "stream" in payload:
        payload["stream"] = False  # the protocol has no streams
    return path, payload


def _error(message: str) -> dict[str, Any]:
    return {"error": {"code": 400, "message": message, "type": "invalid_request_error"}}
