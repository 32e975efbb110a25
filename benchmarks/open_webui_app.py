"""Open WebUI as its users run it (``open-webui serve`` from its own venv, offline, on loopback) and its HTTP API
called as its page calls it (the page's bundle: ``src/lib/apis`` and ``components/chat/Chat.svelte``).

Both of its connections point at one URL (``benchmarks/open_webui_proxy.py``): the Ollama connection at
``URL``, the OpenAI connection at ``URL/v1``. Its data (users, chats, files) lives in a throwaway directory.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

#: The environment variable naming Open WebUI's venv (``--open-webui-venv`` overrides it).
VENV_VARIABLE = "REFSIGHT_OPEN_WEBUI_VENV"
#: The admin the checks sign up (the first user of a fresh Open WebUI becomes its admin).
ADMIN = {"name": "Check Admin", "email": "admin@example.com", "password": "check-password-1"}
#: Sent as the OpenAI connection's key: refsight serves without keys here, and a fixture replaces it.
OPENAI_KEY = "sk-open-webui-check"
#: The page's features for a chat (``getFeatures()``: every toggle off, memory on as its config enables it).
FEATURES = {"voice": False, "image_generation": False, "code_interpreter": False, "web_search": False,
            "memory": True}
#: The page's background tasks for a new chat (``background_tasks``: its defaults, all on).
BACKGROUND_TASKS = {"title_generation": True, "tags_generation": True, "follow_up_generation": True}


def prompt_variables(user: dict) -> dict[str, str]:
    """The page's ``getPromptVariables()`` (fixed date and time: the checks' bodies do not change by the day)."""
    return {"{{USER_NAME}}": user["name"], "{{USER_EMAIL}}": user["email"], "{{USER_LOCATION}}": "Unknown",
            "{{CURRENT_DATETIME}}": "2026-01-05 10:00:00", "{{CURRENT_DATE}}": "2026-01-05",
            "{{CURRENT_TIME}}": "10:00:00", "{{CURRENT_WEEKDAY}}": "Monday", "{{CURRENT_TIMEZONE}}": "UTC",
            "{{USER_LANGUAGE}}": "en-US"}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def environment(venv: Path, data: Path, port: int, upstream: str) -> dict[str, str]:
    """Open WebUI's settings (its open_webui/env.py and config.py): offline, loopback, both connections on."""
    return {
        "PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(data), "DATA_DIR": str(data),
        "HOST": "127.0.0.1", "PORT": str(port), "WEBUI_SECRET_KEY": "open-webui-check", "WEBUI_AUTH": "true",
        "OFFLINE_MODE": "true", "HF_HUB_OFFLINE": "1", "BYPASS_EMBEDDING_AND_RETRIEVAL": "true",
        # No local embedding model to load (there is none offline; the bypass above never asks for one).
        "RAG_EMBEDDING_MODEL": "",
        "SCARF_NO_ANALYTICS": "true", "DO_NOT_TRACK": "true", "ANONYMIZED_TELEMETRY": "false",
        "ENABLE_OLLAMA_API": "true", "OLLAMA_BASE_URL": upstream,
        "ENABLE_OPENAI_API": "true", "OPENAI_API_BASE_URL": f"{upstream}/v1", "OPENAI_API_KEY": OPENAI_KEY,
    }


class OpenWebUI:
    """``open-webui serve`` on loopback in its own process group, ready when ``/health`` answers."""

    def __init__(self, venv: Path, data: Path, upstream: str) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        data.mkdir(parents=True, exist_ok=True)
        self.log = data / "open-webui.log"
        command = [str(venv / "bin" / "open-webui"), "serve", "--host", "127.0.0.1", "--port", str(self.port)]
        with self.log.open("w") as log:
            self.process = subprocess.Popen(command, env=environment(venv, data, self.port, upstream), cwd=data,
                                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def __enter__(self) -> "OpenWebUI":
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise SystemExit(f"open-webui exited {self.process.returncode}: {self.log.read_text()[-3000:]}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise SystemExit(f"open-webui did not start in 300 s: {self.log.read_text()[-3000:]}")

    def __exit__(self, *exc: object) -> None:
        os.killpg(self.process.pid, 15)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, 9)
            self.process.wait()


class Session:
    """The page's calls to Open WebUI's API, as the signed-in admin."""

    def __init__(self, url: str) -> None:
        self.http = httpx.Client(base_url=url, timeout=300)
        self.user: dict = {}

    def sign_up_and_in(self) -> dict:
        """``POST /api/v1/auths/signup`` (the first user: the admin), then ``/signin`` as the page logs in."""
        self.http.post("/api/v1/auths/signup", json=ADMIN).raise_for_status()
        reply = self.http.post("/api/v1/auths/signin", json={"email": ADMIN["email"], "password": ADMIN["password"]})
        reply.raise_for_status()
        self.user = reply.json()
        self.http.headers["Authorization"] = f"Bearer {self.user['token']}"
        return self.user

    def models(self) -> dict[str, dict]:
        """``GET /api/models``: the model item of each connection, ``{"ollama": ..., "openai": ...}``."""
        reply = self.http.get("/api/models", params={"refresh": "true"})
        reply.raise_for_status()
        return {model.get("owned_by"): model for model in reply.json()["data"]}

    def upload(self, name: str, data: bytes, content_type: str, process: bool) -> dict:
        """``POST /api/v1/files/`` as the page uploads (images with ``process=false``); the message's file item."""
        reply = self.http.post("/api/v1/files/", params={"process": str(process).lower()},
                               files={"file": (name, data, content_type)})
        reply.raise_for_status()
        uploaded = reply.json()
        deadline = time.monotonic() + 60
        while process and time.monotonic() < deadline:
            status = self.http.get(f"/api/v1/files/{uploaded['id']}/process/status").json().get("status")
            if status in ("completed", "failed"):
                if status == "failed":
                    raise RuntimeError(f"Open WebUI could not process {name}")
                break
            time.sleep(0.3)
        return {"type": "file", "file": uploaded, "id": uploaded["id"], "url": uploaded["id"], "name": name,
                "collection_name": (uploaded.get("meta") or {}).get("collection_name") or "",
                "status": "uploaded", "size": len(data), "error": "", "itemId": str(uuid.uuid4()),
                "content_type": content_type}

    def page_chat_body(self, model: dict, text: str, files: list[dict] | None = None,
                       params: dict | None = None) -> dict:
        """The body the page posts to ``/api/chat/completions`` for a new chat (``sendMessageSocket``)."""
        reply_id = str(uuid.uuid4())
        user_message = {
            "id": str(uuid.uuid4()), "parentId": None, "childrenIds": [reply_id], "role": "user",
            "user": {"id": self.user["id"], "name": self.user["name"]}, "user_id": self.user["id"],
            "content": text, "timestamp": int(time.time()), "models": [model["id"]],
            **({"files": files} if files else {}),
        }
        return {
            "stream": True, "model": model["id"],
            "params": {**(params or {}), "model_controls": {}},
            **({"files": files} if files else {}),
            "tool_ids": [], "tool_servers": [], "features": FEATURES,
            "variables": prompt_variables(self.user),
            "chat_variables": {}, "model_item": model, "session_id": f"check-{uuid.uuid4().hex[:12]}",
            "id": reply_id, "message_ids": [{"model_id": model["id"], "message_id": reply_id, "modelIdx": 0}],
            "parent_id": None, "user_message": user_message,
            "background_tasks": BACKGROUND_TASKS,
        }

    def chat_and_wait(self, body: dict) -> dict:
        """Post a page chat and wait, as the page does (its socket events; here the saved chat), until the
        reply and the tasks after it are done; the saved chat."""
        reply = self.http.post("/api/chat/completions", json=body)
        if reply.status_code != 200:
            raise RuntimeError(f"/api/chat/completions answered {reply.status_code}: {reply.text[:2000]}")
        return self.saved_chat(reply.json()["chat_id"])

    def saved_chat(self, chat_id: str, timeout: float = 300) -> dict:
        """The chat once Open WebUI runs nothing more for it (its reply, then the tasks after it)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            active = self.http.get(f"/api/tasks/chat/{chat_id}").json().get("task_ids")
            if not active:
                return self.http.get(f"/api/v1/chats/{chat_id}").json()
            time.sleep(0.3)
        raise RuntimeError(f"chat {chat_id} still running after {timeout} s")

    def direct_chat(self, model: dict, text: str, params: dict) -> str:
        """``/api/chat/completions`` without a page session (no built-in tools), streamed as the page asks;
        the reply's text. Raises with Open WebUI's error when it reports one."""
        body = {"stream": params.get("stream_response", True), "model": model["id"],
                "messages": [{"role": "user", "content": text}], "params": {**params, "model_controls": {}},
                "features": FEATURES, "model_item": model}
        reply = self.http.post("/api/chat/completions", json=body)
        if reply.status_code != 200:
            raise RuntimeError(f"/api/chat/completions answered {reply.status_code}: {reply.text[:2000]}")
        return reply.text

    def task(self, name: str, model: dict, messages: list[dict]) -> dict:
        """``POST /api/v1/tasks/{title,tags,follow_up}/completions`` as the page calls them; the reply."""
        reply = self.http.post(f"/api/v1/tasks/{name}/completions", json={"model": model["id"], "messages": messages})
        if reply.status_code != 200:
            raise RuntimeError(f"/api/v1/tasks/{name}/completions answered {reply.status_code}: {reply.text[:2000]}")
        return reply.json()


def assistant_message(chat: dict, body: dict) -> dict[str, Any]:
    """The saved reply of a page chat posted with ``body`` (its ``id``)."""
    return chat["chat"]["history"]["messages"].get(body["id"], {})
