"""A capturing proxy between Open WebUI and ``refsight serve``: every request Open WebUI sends is forwarded
unchanged and recorded, with refsight's answer, under the label of the check that caused it.

Open WebUI's Ollama and OpenAI connections both point at the proxy (``http://127.0.0.1:PORT`` and ``.../v1``),
so the record holds the exact bodies a real Open WebUI sends, and refsight's status and error for each:
the evidence of ``benchmarks/open_webui.py`` and the fixtures ``tests/server/test_open_webui_requests.py``
replays (:func:`fixtures`: the bodies grouped by kind, secrets removed).

Replies are forwarded whole (read, then written with a ``Content-Length``): Open WebUI reads a streamed reply
the same way whether its chunks arrive apart or together, and a whole reply keeps the proxy small.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator

import httpx

#: Request headers kept in a record: the ones that can change how refsight reads a body.
KEPT_HEADERS = ("content-type", "accept", "authorization")
#: Replaces a credential's value in a record (what Open WebUI sends is ``OPENAI_API_KEY``; nothing secret
#: in the checks, but a fixture never carries one).
REMOVED = "<removed>"
#: Open WebUI's task prompts (its default templates in open_webui/config.py), by the line that opens each.
#: Its answer template for attached files opens with "### Task:" too, and is a chat.
TASK_PROMPTS = {
    "### Task:\nGenerate a concise title": "title",
    "### Task:\nGenerate 1-3 broad tags": "tags",
    "### Task:\nPredict 3-5 useful messages": "follow_ups",
    "### Task:\nAnalyze the chat history to determine the necessity of generating search queries": "queries",
}


def task_of(body: Any) -> str | None:
    """Which Open WebUI task a chat body is (``title``, ``tags``, ``follow_ups``, ``queries``), or None."""
    messages = body.get("messages") if isinstance(body, dict) else None
    if not isinstance(messages, list) or len(messages) != 1 or not isinstance(messages[0], dict):
        return None
    prompt = messages[0].get("content")
    return next((task for opening, task in TASK_PROMPTS.items()
                 if isinstance(prompt, str) and prompt.startswith(opening)), None)


class CaptureProxy:
    """``http://127.0.0.1:PORT`` forwarding to ``upstream``; :attr:`records` holds every exchange (its
    ``label``, ``task``, ``method``, ``path``, kept ``headers``, JSON ``body``, and refsight's ``response``)."""

    def __init__(self, upstream: str) -> None:
        self.records: list[dict] = []
        self._label = "setup"
        self._lock = threading.Lock()
        self._in_flight = 0
        self._last_activity = time.monotonic()
        self._http = httpx.Client(base_url=upstream, timeout=600)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> "CaptureProxy":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._http.close()

    @contextlib.contextmanager
    def label(self, name: str) -> Iterator[list[dict]]:
        """Requests that arrive inside the block are recorded as ``name``; yields the block's records."""
        with self._lock:
            start, self._label = len(self.records), name
        mine: list[dict] = []
        try:
            yield mine
        finally:
            self.wait_quiet()
            with self._lock:
                mine.extend(record for record in self.records[start:] if record["label"] == name)
                self._label = "between checks"

    def wait_quiet(self, quiet_s: float = 0.3, timeout_s: float = 300) -> None:
        """Until no request is in flight and none began for ``quiet_s``: what a check started in the background
        (Open WebUI's title task runs beside a new chat's reply) is recorded under the check's label."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                if not self._in_flight and time.monotonic() - self._last_activity >= quiet_s:
                    return
            time.sleep(0.1)

    def forward(self, method: str, path: str, headers: dict[str, str], raw: bytes) -> httpx.Response:
        """Send one request on to refsight and record it with refsight's answer."""
        passed = {k: v for k, v in headers.items() if k.lower() not in ("host", "content-length", "connection")}
        with self._lock:
            self._in_flight += 1
            label = self._label
        try:
            reply = self._http.request(method, path, headers=passed, content=raw)
        except httpx.HTTPError as exc:
            reply = httpx.Response(502, json={"error": f"the proxy could not reach refsight: {exc}"})
        self._record(label, method, path, headers, raw, reply)
        with self._lock:
            self._in_flight -= 1
            self._last_activity = time.monotonic()
        return reply

    def _record(self, label: str, method: str, path: str, headers: dict[str, str], raw: bytes,
                reply: httpx.Response) -> None:
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = {"not_json": raw[:200].decode("utf-8", "replace")}
        kept = {k.lower(): v for k, v in headers.items() if k.lower() in KEPT_HEADERS}
        if "authorization" in kept:
            kept["authorization"] = f"Bearer {REMOVED}"
        with self._lock:
            self.records.append({
                "label": label, "task": task_of(body), "method": method, "path": path, "headers": kept,
                "body": body, "status": reply.status_code, "response": reply,
            })


def _handler(proxy: CaptureProxy) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _relay(self) -> None:
            raw = self.rfile.read(int(self.headers.get("content-length") or 0))
            reply = proxy.forward(self.command, self.path, dict(self.headers), raw)
            content = reply.content
            self.send_response(reply.status_code)
            for key in ("content-type", "x-request-id"):
                if key in reply.headers:
                    self.send_header(key, reply.headers[key])
            self.send_header("content-length", str(len(content)))
            self.end_headers()
            self.wfile.write(content)

        do_GET = do_POST = do_DELETE = _relay  # noqa: N815 (http.server's method names)

        def log_message(self, *args: object) -> None:  # the records are the log
            pass

    return Handler


def kind_of(record: dict) -> str:
    """The fixture file a record belongs to: its connection, then what it is (models, chat, tasks, params)."""
    connection = "openai" if record["path"].startswith("/v1/") else "ollama"
    label = record["label"]
    if record["method"] == "GET":
        return f"{connection}_models"
    if record["task"]:
        return f"{connection}_tasks"
    return f"{connection}_{label.split('.')[1]}" if label.count(".") else f"{connection}_other"


def fixtures(records: list[dict]) -> dict[str, list[dict]]:
    """The records as fixture files: ``{kind: [request, ...]}``, each request named, each body once, and one
    body per task and connection (Open WebUI's task bodies differ only in their prompt's text).

    A request keeps its method, path, kept headers and body, and what refsight answered when it was
    captured (``captured_status``), so a fixture also shows the state it was captured against.
    """
    files: dict[str, list[dict]] = {}
    seen: set[str] = set()
    names: set[str] = set()
    for record in records:
        key = json.dumps([record["method"], record["path"], record["task"] or record["body"]], sort_keys=True)
        if key in seen:
            continue
        seen.add(key)
        name = record["label"]
        if record["task"] and not name.endswith(f".{record['task']}"):
            name += f".{record['task']}"
        if record["method"] == "GET":
            name = f"{kind_of(record).replace('_', '.')}.GET {record['path']}"
        while name in names:  # the same check sending two different bodies of one kind
            name += "+"
        names.add(name)
        files.setdefault(kind_of(record), []).append({
            "name": name, "method": record["method"], "path": record["path"], "headers": record["headers"],
            "body": record["body"], "captured_status": record["status"],
        })
    return files
