"""llama.cpp's own server test suite against llama-server and ``refsight serve``: one JSON line.

The llama-cpp-python release refsight pins vendors llama.cpp's server tests
(``vendor/llama.cpp/tools/server/tests/unit``, harness ``utils.py``/``conftest.py``). This
runs them, unchanged, twice: against ``llama-server`` built from that same source
(:mod:`llama_server`) and against ``refsight serve``, each on the same tiny GGUF + mmproj
(built offline, random weights), then compares the outcomes test by test.

The harness starts its server as ``$LLAMA_SERVER_BIN_PATH`` with llama-server's flags and
would download its models (``--hf-repo``/``--hf-file``/``--model-url``). Each side gets a
wrapper (this script with ``--wrap``) that replaces only where the model comes from: every
model flag becomes ``-m MODEL`` (plus ``--mmproj MMPROJ`` unless ``--no-mmproj`` is given),
and ``--model-draft`` names the same GGUF. Every other flag reaches the server as the test
wrote it; for refsight the wrapper runs ``refsight serve`` with them (its CLI takes
llama-server's flags) on a fresh store per start. Tests needing a model the tiny GGUF
cannot stand in for (embeddings, rerank, infill, LoRA, a chat template's tool-call format,
a story the 260K-parameter model tells) fail or pass on both sides as they fall; the
comparison is what one passes and the other fails. ``ServerPreset.load_all`` (which
downloads every preset once) is skipped, and ``wget`` (LoRA downloads) fails: no network.
As llama.cpp's ``tests.sh`` runs them by default, tests marked slow are left out (``-m "not slow"``).

    python benchmarks/llama_server_suite.py --outcomes /tmp/outcomes.json
    python benchmarks/llama_server_suite.py --files test_basic.py test_tokenize.py
    python benchmarks/llama_server_suite.py --llama-server-outcomes /tmp/outcomes.json   # refsight again only

stdout: one JSON line (``tests``, ``llama_server_passed``, ``refsight_passed``, ``both``,
``llama_server_only``, ``refsight_only``, ``by_file``). ``--outcomes FILE``: every test's
outcome on both sides, with the first line of each failure.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

#: The model flags the wrapper replaces (each takes a value) and the ones it drops (none).
MODEL_FLAGS = {"--model", "-m", "--hf-repo", "-hf", "-hfr", "--hf-file", "-hff", "--model-url", "-mu"}
DROPPED_MODEL_FLAGS = {"--offline", "--mmproj-url", "-mmu", "--mmproj", "-mm"}
VALUED_DROPPED = {"--mmproj-url", "-mmu", "--mmproj", "-mm"}
SIDES = ("llama_server", "refsight")


def _log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


# ------------------------------------------------------------------ the wrapper (the harness's "llama-server")


def rewrite(argv: list[str], model: str, mmproj: str) -> list[str]:
    """The test's llama-server flags with every model source replaced by the local GGUF (and its mmproj)."""
    out: list[str] = []
    wants_model = False
    i = 0
    while i < len(argv):
        flag = argv[i]
        name = flag.split("=", 1)[0]
        valued = "=" not in flag
        if name in MODEL_FLAGS:
            wants_model = True
            i += 2 if valued else 1
            continue
        if name in DROPPED_MODEL_FLAGS:
            i += 2 if valued and name in VALUED_DROPPED else 1
            continue
        if name in ("--model-draft", "-md"):
            out += [name, model]
            i += 2 if valued else 1
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
    dropped = set(os.environ.get("SUITE_DROP", "").split())
    args = [a for a in args if a not in dropped]
    store = tempfile.mkdtemp(prefix="store-", dir=os.environ["SUITE_STORES"])
    os.execv(sys.executable, [sys.executable, "-m", "refsight.cli", "serve", "--store", store, *args])


# ------------------------------------------------------------------ running the suite


def unpack_suite(work: Path) -> Path:
    """``tools/server/tests`` of the pinned sdist, unpacked under ``work``."""
    import tarfile

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from llama_server import _tarball

    tarball = _tarball(_log)
    with tarfile.open(tarball) as tar:
        members = [m for m in tar.getmembers() if "/vendor/llama.cpp/tools/server/tests/" in m.name]
        tar.extractall(work / "src", members=members, filter="data")
    (top,) = (work / "src").iterdir()
    return top / "vendor" / "llama.cpp" / "tools" / "server" / "tests"


PLUGIN = '''"""Loaded with -p: no model downloads at session start (the wrapper supplies the model); with
$SUITE_SELECT (a file of test ids, one a line), only those tests run."""
import os
import sys


def pytest_sessionstart(session):
    utils = sys.modules.get("utils")
    if utils is not None:
        utils.ServerPreset.load_all = staticmethod(lambda: None)


def pytest_collection_modifyitems(config, items):
    select = os.environ.get("SUITE_SELECT")
    if select:
        wanted = set(open(select, encoding="utf-8").read().split("\\n"))
        keep = [item for item in items if item.nodeid in wanted]
        config.hook.pytest_deselected(items=[item for item in items if item.nodeid not in wanted])
        items[:] = keep
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
    side_env = {**env, "LLAMA_SERVER_BIN_PATH": str(work / f"{side}-wrapper"), "PORT": str(port),
                "SUITE_STORES": str(work / "stores"), "LLAMA_CACHE": str(work / "llama-cache")}
    if select is not None:
        (work / f"{side}.select").write_text("\n".join(select), encoding="utf-8")
        side_env["SUITE_SELECT"] = str(work / f"{side}.select")
    cmd = [sys.executable, "-m", "pytest", *[f"unit/{f}" for f in files], "-p", "suite_plugin", "-p", "no:cacheprovider",
           "-o", "addopts=", "-o", "junit_logging=system-out", "-q", "-m", "not slow", "--timeout", str(timeout), f"--junitxml={junit}", "--rootdir", str(suite)]
    _log(f"{side}: pytest {' '.join(files)} (per-test timeout {timeout} s)")
    with open(work / f"{side}.log", "wb") as log:
        subprocess.run(cmd, cwd=suite, env=side_env, stdout=log, stderr=subprocess.STDOUT, check=False)
    return parse_junit(junit)


def collect(suite: Path, files: list[str], env: dict) -> set[str]:
    """The test ids the suite runs by default (``-m "not slow"``, as its ``tests.sh``)."""
    import subprocess

    cmd = [sys.executable, "-m", "pytest", *[f"unit/{f}" for f in files], "-p", "suite_plugin", "-p", "no:cacheprovider",
           "-o", "addopts=", "--collect-only", "-q", "-m", "not slow", "--rootdir", str(suite)]
    out = subprocess.run(cmd, cwd=suite, env=env, capture_output=True, text=True, check=False).stdout
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
    """The summary line's counts: overall and per test file."""
    ids = sorted(set().union(*(r.keys() for r in results.values())))

    def passed(side: str, test_id: str) -> bool:
        return results[side].get(test_id, {}).get("outcome") == "passed"

    by_file: dict[str, dict] = {}
    totals = {"tests": len(ids), "llama_server_passed": 0, "refsight_passed": 0, "both": 0,
              "llama_server_only": 0, "refsight_only": 0}
    for test_id in ids:
        row = by_file.setdefault(test_id.split("::")[0].split("/")[-1], {"tests": 0, "llama_server": 0, "refsight": 0})
        row["tests"] += 1
        a, b = passed("llama_server", test_id), passed("refsight", test_id)
        row["llama_server"] += a
        row["refsight"] += b
        totals["llama_server_passed"] += a
        totals["refsight_passed"] += b
        totals["both"] += a and b
        totals["llama_server_only"] += a and not b
        totals["refsight_only"] += b and not a
    return {**totals, "by_file": by_file}


def main(argv: list[str] | None = None) -> int:
    """Run the comparison and print the JSON line."""
    raw = sys.argv[1:] if argv is None else argv
    if raw[:1] == ["--wrap"]:
        wrap(raw[1], raw[2:])
        return 1  # exec does not return
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--files", nargs="+", help="test files of tests/unit (default: all of them)")
    p.add_argument("--model", default="tiny-qwen2-vl-gguf", help="the built-in GGUF both servers get")
    p.add_argument("--timeout", type=int, default=120, help="per-test timeout, seconds")
    p.add_argument("--outcomes", type=Path, help="write every test's outcome on both sides to this JSON file")
    p.add_argument("--only", choices=SIDES, help="run one side only (its outcomes; the other side's count as missing)")
    p.add_argument("--drop-refsight-flags", type=lambda v: [f for f in v.split(",") if f], default=[], metavar="FLAG,...",
                   help="valueless flags refsight's wrapper removes, comma-separated (--drop-refsight-flags=--no-jinja), "
                        "to see past a flag refsight refuses (recorded in the line)")
    p.add_argument("--only-llama-server-passes", action="store_true",
                   help="with --llama-server-outcomes: run refsight only on the tests llama-server passed (faster; "
                        "refsight_only then counts nothing)")
    p.add_argument("--llama-server-outcomes", type=Path, metavar="FILE",
                   help="take llama-server's outcomes from an earlier --outcomes file instead of running it again")
    args = p.parse_args(raw)

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from llama_server import ensure_llama_server

    from refsight.builtin_models.gguf import ensure_gguf
    from refsight.support.extras import LLAMA_CPP_PYTHON_VERSION

    binary = ensure_llama_server()
    model, mmproj = ensure_gguf(args.model)
    with tempfile.TemporaryDirectory(prefix="llama-suite-") as tmp:
        work = Path(tmp)
        suite = unpack_suite(work)
        plugins = write_helpers(work)
        files = args.files or sorted(f.name for f in (suite / "unit").glob("test_*.py"))
        missing = [f for f in files if not (suite / "unit" / f).is_file()]
        if missing:
            raise SystemExit(f"--files: no such test file in tools/server/tests/unit: {', '.join(missing)}")
        env = {**os.environ, "SUITE_MODEL": str(model), "SUITE_MMPROJ": str(mmproj), "SUITE_LLAMA_SERVER": str(binary),
               "PYTHONPATH": os.pathsep.join(filter(None, [str(plugins), os.environ.get("PYTHONPATH")]))}
        results: dict[str, dict] = {side: {} for side in SIDES if side != args.only} if args.only else {}
        if args.llama_server_outcomes:
            earlier = json.loads(args.llama_server_outcomes.read_text())
            wanted = collect(suite, files, env)
            results["llama_server"] = {row["test"]: row["llama_server"] for row in earlier if row["test"] in wanted}
        env["SUITE_DROP"] = " ".join(args.drop_refsight_flags)
        for side in SIDES:
            if side == args.only or (args.only is None and side not in results):
                select = None
                if side == "refsight" and args.only_llama_server_passes:
                    select = [t for t, row in results["llama_server"].items() if row["outcome"] == "passed"]
                results[side] = run_side(side, suite, work, files, args.timeout, env, select)
    line = {"suite": "llama.cpp tools/server/tests/unit", "llama_cpp": LLAMA_CPP_PYTHON_VERSION, "model": args.model,
            "refsight_flags_dropped": args.drop_refsight_flags,
            "refsight_ran": "llama-server's passes" if args.only_llama_server_passes else "all", **compare(results)}
    if args.outcomes:
        ids = sorted(set().union(*(r.keys() for r in results.values())))
        rows = [{"test": t, **{side: results[side].get(t, {"outcome": "missing", "message": ""}) for side in SIDES}}
                for t in ids]
        args.outcomes.write_text(json.dumps(rows, indent=1))
    print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
