"""Open WebUI's captured requests (``tests/server/data/open_webui/``) replayed against refsight, and whether each
reply is one Open WebUI can read.

The fixtures are the exact bodies Open WebUI 0.12.4 sent to ``refsight serve`` through its Ollama and OpenAI
connections (captured by ``benchmarks/open_webui.py --save-fixtures``; one file per kind of request, a list
of named requests). "Can read" is what Open WebUI's own response code reads (open_webui/utils/response.py,
routers/ollama.py, routers/openai.py, utils/middleware.py): the model lists' ids, Ollama's NDJSON lines with
``message`` and a last ``done``, OpenAI's ``choices`` (SSE chunks ending in ``[DONE]``, or one message).

Imported by name (unique on purpose) by ``tests/server/test_open_webui_requests.py`` and
``benchmarks/open_webui.py --replay``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx

#: Where the captured requests live: ``KIND.json``, each a list of ``{"name", "method", "path", "headers",
#: "body", "captured_status"}``.
FIXTURES = Path(__file__).resolve().parent / "data" / "open_webui"


def load_requests(directory: Path = FIXTURES) -> list[dict[str, Any]]:
    """Every captured request, file by file in name order, each with its ``kind`` (the file's stem)."""
    return [{**request, "kind": path.stem}
            for path in sorted(directory.glob("*.json"))
            for request in json.loads(path.read_text())]


def send(client: httpx.Client, request: dict[str, Any]) -> httpx.Response:
    """The request as Open WebUI sent it: its method, path, kept headers and JSON body, byte for byte."""
    content = json.dumps(request["body"]).encode() if request["body"] is not None else None
    return client.request(request["method"], request["path"], headers=request["headers"], content=content)


def unreadable(request: dict[str, Any], response: httpx.Response) -> str | None:
    """None when refsight answered 2xx with a reply Open WebUI reads; else what is wrong (refsight's error)."""
    if not 200 <= response.status_code < 300:
        return f"{response.status_code}: {_error_text(response)}"
    try:
        _check_shape(request, response)
    except (AssertionError, ValueError, KeyError, TypeError, IndexError) as exc:
        return f"{response.status_code} but unreadable: {exc} in {response.text[:300]!r}"
    return None


def _error_text(response: httpx.Response) -> str:
    try:
        error = response.json().get("error", response.json())
    except ValueError:
        return response.text[:500]
    return error.get("message", json.dumps(error)) if isinstance(error, dict) else str(error)


def _check_shape(request: dict[str, Any], response: httpx.Response) -> None:
    path, body = request["path"].split("?")[0], request["body"] or {}
    if request["method"] == "GET":
        _check_list(path, response.json())
    elif path == "/api/chat":
        _check_ollama_chat(response.text, streamed=body.get("stream", True))
    elif path == "/v1/chat/completions":
        _check_openai_chat(response.text, streamed=bool(body.get("stream")))
    else:
        raise AssertionError(f"no reader for {request['method']} {path}")


def _check_list(path: str, reply: dict) -> None:
    if path == "/api/version":
        assert isinstance(reply["version"], str), "version is not a string"
    elif path == "/v1/models":
        assert all(isinstance(model["id"], str) for model in reply["data"]), "a model without an id"
    else:  # /api/tags, /api/ps
        assert all(isinstance(model["model"], str) for model in reply["models"]), "a model without a name"


def _check_ollama_chat(text: str, streamed: bool) -> None:
    lines = [json.loads(line) for line in text.splitlines() if line.strip()] if streamed else [json.loads(text)]
    assert lines and lines[-1].get("done") is True, "the last line is not done"
    for line in lines:
        message = line.get("message") or {}
        assert isinstance(message.get("content", ""), str), "message.content is not a string"
        int(line.get("prompt_eval_count", 0)), int(line.get("eval_count", 0))  # usage, as Open WebUI converts it


def _check_openai_chat(text: str, streamed: bool) -> None:
    if not streamed:
        message = json.loads(text)["choices"][0]["message"]
        assert isinstance(message.get("content") or "", str) or message.get("tool_calls"), "no content"
        return
    events = [line[len("data:"):].strip() for line in text.splitlines() if line.startswith("data:")]
    assert events and events[-1] == "[DONE]", "the stream does not end with [DONE]"
    for chunk in map(json.loads, events[:-1]):
        assert "error" not in chunk, f"an error event: {chunk['error']}"
        for choice in chunk.get("choices", []):
            assert isinstance(choice["delta"].get("content") or "", str), "delta.content is not a string"
