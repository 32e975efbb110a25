"""Open WebUI against ``refsight serve``, through both of its connections, as its users run it.

Open WebUI (the front end many Ollama and llama-server users run; its own venv, ``pip install open-webui``,
7.4 GiB: not in refsight's test extra) is started offline on loopback with its Ollama connection at
``refsight serve`` and its OpenAI connection at ``refsight serve``/v1, both through a capturing proxy
(``open_webui_proxy.py``) that records every request it sends to refsight, with refsight's answer. Then
what its page does, through its own HTTP API as the page calls it (``open_webui_app.py``,
``open_webui_checks.py``):

- ``open_webui.*``: the admin's sign-up and sign-in, the model list (one model per connection), an image and
  a text file uploaded;
- ``CONNECTION.chat.{text,image,file}``: a new chat from the page (its socket session: Open WebUI attaches its
  built-in tools, as for every user), and ``….tasks``: the title, tags and follow-ups it asks for after it;
- ``CONNECTION.tasks.*``: the task endpoints the page calls itself;
- ``CONNECTION.params.NAME=VALUE``: every advanced parameter at the value its UI fills in, one per chat;
- ``page.chat``: one chat from its real page in Chromium (``open_webui_page.py``).

A check passes when Open WebUI reports no error and refsight answered every request of it 2xx with a reply
Open WebUI reads (``tests/server/open_webui_replay.py``); else it is ``failed: WHY``, refsight's refusal first.
``--save-fixtures DIR`` writes the captured bodies (one file per kind, secrets removed; the files there are
replaced) for ``tests/server/test_open_webui_requests.py``; ``--failures FILE`` writes every refusal grouped
by cause.
``--replay`` needs no Open WebUI: it replays the captured bodies (``tests/server/data/open_webui``) against
``refsight serve`` and checks each reply as Open WebUI reads it.

Prints ONE JSON line: ``{"mode", "open_webui", "model", "checks": {NAME: "passed" | "failed: ..."}, "passed",
"failed", "refsight_requests", "refsight_refused", "seconds"}``.

    python benchmarks/open_webui.py [--open-webui-venv DIR] [--model tiny-qwen2-vl-gguf] [--save-fixtures DIR]
    python benchmarks/open_webui.py --replay [--replay-names NAME ...] [--n-predict 16]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT / "tests" / "server")]

from ollama_client import Serve  # noqa: E402
from open_webui_app import VENV_VARIABLE, OpenWebUI, Session  # noqa: E402
from open_webui_checks import Checks, check_chats, check_parameters, check_setup, check_tasks, verdict  # noqa: E402
from open_webui_failures import failures_markdown  # noqa: E402
from open_webui_proxy import CaptureProxy, fixtures  # noqa: E402
from open_webui_replay import FIXTURES, load_requests, send  # noqa: E402

CONNECTIONS = ("ollama", "openai")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--open-webui-venv", type=Path, default=os.environ.get(VENV_VARIABLE),
                   help=f"Open WebUI's venv (default: ${VENV_VARIABLE})")
    p.add_argument("--model", default="tiny-qwen2-vl-gguf", help="the model refsight serves")
    p.add_argument("--size", type=int, default=56, help="the attached image's side in pixels")
    p.add_argument("--n-predict", type=int, help="refsight serve -n: the answer's bound where a request names none")
    p.add_argument("--no-page", action="store_true", help="leave out the Playwright chat from the page")
    p.add_argument("--save-fixtures", type=Path, metavar="DIR", help="write the captured bodies here")
    p.add_argument("--failures", type=Path, metavar="FILE", help="write every refusal, grouped by cause (Markdown)")
    p.add_argument("--replay", action="store_true", help="replay the captured bodies only (no Open WebUI)")
    p.add_argument("--fixtures", type=Path, default=FIXTURES, help="the captured bodies --replay sends")
    p.add_argument("--replay-names", nargs="+", metavar="NAME", help="--replay: only these requests (default: all)")
    return p


def serve_flags(args: argparse.Namespace) -> list[str]:
    """``refsight serve``'s flags beyond its defaults."""
    return ["-n", str(args.n_predict)] if args.n_predict else []


def live(args: argparse.Namespace, store: Path) -> tuple[dict, list[dict]]:
    """Every check against a real Open WebUI; ``(figures, records)``."""
    if not args.open_webui_venv or not (args.open_webui_venv / "bin" / "open-webui").exists():
        raise SystemExit(f"no Open WebUI venv: pass --open-webui-venv DIR or set ${VENV_VARIABLE}")
    with Serve(args.model, store, *serve_flags(args)) as serve, CaptureProxy(serve.url) as proxy, \
            OpenWebUI(args.open_webui_venv, store.parent / "open-webui", proxy.url) as webui:
        session, checks = Session(webui.url), Checks(proxy)
        found = check_setup(checks, session, args.size)
        for connection in CONNECTIONS if "models" in found else ():
            if connection in found["models"]:
                check_chats(checks, session, connection, found)
                check_tasks(checks, session, connection, found)
                check_parameters(checks, session, connection, found)
        if not args.no_page and "ollama" in found.get("models", {}):
            from open_webui_page import page_chat

            checks.run("page.chat", lambda: page_chat(webui.url, session, found["models"]["ollama"]["id"]))
        version = httpx.get(f"{webui.url}/api/version").json().get("version")
    return {"mode": "live", "open_webui": version, "model": args.model, "checks": checks.results}, proxy.records


def replay(args: argparse.Namespace, store: Path) -> tuple[dict, list[dict]]:
    """The captured bodies against ``refsight serve``; ``(figures, records)``."""
    requests = [r for r in load_requests(args.fixtures) if not args.replay_names or r["name"] in args.replay_names]
    missing = set(args.replay_names or ()) - {r["name"] for r in requests}
    if missing:
        raise SystemExit(f"no captured request named {sorted(missing)} in {args.fixtures}")
    results, records = {}, []
    with Serve(args.model, store, *serve_flags(args)) as serve, httpx.Client(base_url=serve.url, timeout=600) as client:
        for request in requests:
            response = send(client, request)
            records.append({**request, "label": request["name"], "task": None, "response": response,
                            "status": response.status_code})
            results[f"replay.{request['name']}"] = verdict(records[-1:], None)
    return {"mode": "replay", "open_webui": None, "model": args.model, "checks": results}, records


def main() -> None:
    args = parser().parse_args()
    if args.replay and args.save_fixtures:
        raise SystemExit("--save-fixtures writes what a live run captured: leave out --replay")
    # A `timeout` or Ctrl-C stops the servers too (the context managers exit).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="refsight-open-webui-") as tmp:
        figures, records = (replay if args.replay else live)(args, Path(tmp) / "store")
    results = figures["checks"]
    if args.save_fixtures:
        args.save_fixtures.mkdir(parents=True, exist_ok=True)
        for stale in args.save_fixtures.glob("*.json"):  # the capture replaces the last one whole
            stale.unlink()
        for kind, requests in fixtures(records).items():
            (args.save_fixtures / f"{kind}.json").write_text(json.dumps(requests, indent=1) + "\n")
    if args.failures:
        args.failures.write_text(failures_markdown(figures, records))
    figures.update(
        passed=sum(v == "passed" for v in results.values()), failed=sum(v != "passed" for v in results.values()),
        refsight_requests=len(records), refsight_refused=sum(not 200 <= r["status"] < 300 for r in records),
        seconds=round(time.perf_counter() - began, 1),
    )
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
