"""The checks ``benchmarks/open_webui.py`` runs through Open WebUI's API, each a named entry: ``passed`` or
``failed: WHY``.

A check passes when Open WebUI reports no error AND every request it sent to refsight meanwhile was answered
2xx with a reply Open WebUI can read (``tests/server/open_webui_replay.py``); a failure names refsight's
refusal first (the request and its error), else Open WebUI's error.
"""

from __future__ import annotations

import io
import json
import traceback
from typing import Callable

from open_webui_app import Session, assistant_message
from open_webui_proxy import CaptureProxy
from open_webui_replay import unreadable

#: Every advanced parameter of Open WebUI's chat controls (its AdvancedParams.svelte), at the value its UI
#: fills in when the user turns the parameter on (as the page's JSON carries it: 5, not 5.0), and the values
#: its UI also allows (``max_tokens`` -1, "until the end of text": Ollama's and llama-server's own value;
#: ``think``'s three choices). ``stop``'s UI value is empty, which the page does not send: a stop string a
#: user types stands for it. Open WebUI-only settings are left out (stripped before a request leaves it),
#: except ``stream_response``, which turns the request into an unstreamed one.
PARAMETERS: tuple[tuple[str, object], ...] = (
    ("seed", 0), ("stop", ["User:"]), ("temperature", 0.8), ("reasoning_effort", "medium"), ("logit_bias", ""),
    ("max_tokens", 128), ("max_tokens", -1), ("top_k", 40), ("top_p", 0.9), ("min_p", 0),
    ("frequency_penalty", 1.1), ("presence_penalty", 0), ("mirostat", 0), ("mirostat_eta", 0.1),
    ("mirostat_tau", 5), ("repeat_last_n", 64), ("tfs_z", 1), ("repeat_penalty", 1.1), ("use_mmap", True),
    ("use_mlock", True), ("think", True), ("think", "medium"), ("think", False), ("format", "json"),
    ("num_keep", 24), ("num_ctx", 2048), ("num_batch", 512), ("num_thread", 2), ("num_gpu", 0),
    ("keep_alive", "5m"), ("stream_response", False),
)
#: The tasks Open WebUI runs after a new chat's reply (its ``background_tasks``), as the proxy names them.
AFTER_CHAT = ("title", "tags", "follow_ups")
#: The task endpoints the page calls itself (its sidebar's and voice chat's title and tags; follow-ups):
#: ``{task: the endpoint's name}``.
TASK_ENDPOINTS = {"title": "title", "tags": "tags", "follow_ups": "follow_up"}
TEXT = "Describe a cat in one short sentence."
IMAGE_TEXT = "What is in this picture?"
FILE_TEXT = "Summarise the attached notes."
NOTES = b"Release notes\n\nThe cache keeps each reference's visual package on disk.\n"


class Checks:
    """Runs named checks with the proxy labelling what each sends to refsight; :attr:`results` the outcomes."""

    def __init__(self, proxy: CaptureProxy) -> None:
        self.proxy = proxy
        self.results: dict[str, str] = {}

    def run(self, name: str, check: Callable[[], object]) -> list[dict]:
        """Run ``check`` as ``name``; its refsight records."""
        with self.proxy.label(name) as records:
            try:
                check()
                error = None
            except Exception as exc:  # noqa: BLE001 (a check's failure is a result, not the run's end)
                error = f"{type(exc).__name__}: {exc}" if str(exc) else traceback.format_exc(limit=2)
        self.results[name] = verdict(records, error)
        return records


def verdict(records: list[dict], error: str | None) -> str:
    """``passed``, or ``failed: `` refsight's first unreadable answer (the request named), else ``error``."""
    for record in records:
        problem = unreadable(record, record["response"])
        if problem:
            task = f" ({record['task']} task)" if record["task"] else ""
            return f"failed: refsight answered {record['method']} {record['path']}{task} {problem}"
    return f"failed: {error}" if error else "passed"


def image_png(size: int) -> bytes:
    """A bundled photo at ``size`` px, PNG (what a user attaches)."""
    from refsight.samples import load_sample

    buffer = io.BytesIO()
    load_sample("chelsea").resize((size, size)).save(buffer, format="PNG")
    return buffer.getvalue()


def check_setup(checks: Checks, session: Session, size: int) -> dict:
    """Sign-up and sign-in, the model list of both connections, two uploads; what the chats need."""
    found: dict = {}
    checks.run("open_webui.sign_up_and_in", session.sign_up_and_in)

    def models() -> None:
        found["models"] = session.models()
        missing = {"ollama", "openai"} - set(found["models"])
        assert not missing, f"no model from the {', '.join(sorted(missing))} connection in {list(found['models'])}"

    checks.run("open_webui.models", models)
    checks.run("open_webui.upload_image",
               lambda: found.__setitem__("image", session.upload("cat.png", image_png(size), "image/png", False)))
    checks.run("open_webui.upload_file",
               lambda: found.__setitem__("file", session.upload("notes.txt", NOTES, "text/plain", True)))
    return found


def check_chats(checks: Checks, session: Session, connection: str, found: dict) -> None:
    """The page's new chats (its session: built-in tools attached), then the tasks Open WebUI runs after each."""
    model = found["models"][connection]
    chats = {"text": (TEXT, None), "image": (IMAGE_TEXT, found.get("image")), "file": (FILE_TEXT, found.get("file"))}
    for kind, (text, attached) in chats.items():
        body = session.page_chat_body(model, text, [attached] if attached else None)

        def chat(body: dict = body) -> None:
            reply = assistant_message(session.chat_and_wait(body), body)
            if reply.get("error") or not reply.get("done"):
                raise RuntimeError(f"the reply bubble shows an error: {reply.get('error') or reply}")

        records = checks.run(f"{connection}.chat.{kind}", chat)
        checks.results[f"{connection}.chat.{kind}.tasks"] = tasks_verdict(records)


def tasks_verdict(records: list[dict]) -> str:
    """Whether every task Open WebUI runs after a new chat reached refsight and was answered readably."""
    tasks = [record for record in records if record["task"]]
    missing = [task for task in AFTER_CHAT if task not in {record["task"] for record in tasks}]
    if missing:
        return f"failed: not sent: {', '.join(missing)} (Open WebUI runs them after a reply; see the chat's check)"
    return verdict(tasks, None)


def check_tasks(checks: Checks, session: Session, connection: str, found: dict) -> None:
    """The task endpoints the page calls, on a short history."""
    model = found["models"][connection]
    history = [{"role": "user", "content": TEXT}, {"role": "assistant", "content": "A small cat naps in the sun."}]
    for task, endpoint in TASK_ENDPOINTS.items():
        def call(endpoint: str = endpoint) -> None:
            reply = session.task(endpoint, model, history)
            assert isinstance(reply["choices"][0]["message"]["content"], str), f"no message content in {reply}"

        checks.run(f"{connection}.tasks.{task}", call)


def check_parameters(checks: Checks, session: Session, connection: str, found: dict) -> None:
    """Each advanced parameter alone at its UI value, in a chat without a page session (so no built-in tools:
    each check tells one parameter's fate)."""
    model = found["models"][connection]
    for name, value in PARAMETERS:
        label = f"{connection}.params.{name}={json.dumps(value)}"
        checks.run(label, lambda name=name, value=value: session.direct_chat(model, TEXT, {name: value}))
