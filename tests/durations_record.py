"""Where the suite's time goes: a pytest plugin that times every test and every module/session fixture.

Loaded by the root conftest (``pytest_plugins``). :class:`DurationsRecorder` measures each test's setup, call
and teardown in wall seconds and in CPU seconds (user + system of this process and of the children it reaped:
a subprocess's model load counts, other runs on a shared machine do not; on a loaded machine CPU time is the
steadier figure).
Module- and session-scoped fixture setups are timed on their own too: a module fixture's setup is part of the
first test that asks for it, a session fixture's is paid once for the whole run, wherever it first lands.

At the end of the run it prints a short table (minutes per folder, the slowest tests, the slowest fixture
setups, the machine's load) and writes the whole record as JSON: to ``$REFSIGHT_DURATIONS`` when set, else under
pytest's cache (``.pytest_cache/d/refsight/durations.json``). ``pytest --record-module-durations`` also folds
the modules that ran whole into the committed record of module durations (:mod:`slow_set`, which derives the
``slow`` mark from it). ``python tests/durations_record.py FILE...`` prints the table of saved records (CI
prints its two runs' together).
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

__all__ = ["DurationsRecorder", "folder_of", "summary_lines"]

ENV_PATH = "REFSIGHT_DURATIONS"
SLOWEST_TESTS = 30
SLOWEST_FIXTURES = 15


def _cpu() -> float:
    """CPU seconds so far: this process (all its threads) and the children it waited for."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def folder_of(module: str) -> str:
    """``tests/server/test_x.py`` -> ``tests/server``."""
    return module.rsplit("/", 1)[0] if "/" in module else "."


class DurationsRecorder:
    """Times tests and fixture setups; prints the table and writes the JSON record at the end of the run."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.root = Path(str(config.rootpath))
        self.tests: dict[str, dict] = {}
        self.fixtures: list[dict] = []
        self.current = ""
        self.own_slow: set[str] = set()  # tests marked slow by their own marks (pytestmark, decorators)
        self.deselected: list[dict] = []
        self.started = time.time()
        self.cpu_started = _cpu()
        self.load_started = os.getloadavg()

    # -- measuring -------------------------------------------------------------------------------------------

    def _entry(self, item: pytest.Item) -> dict:
        entry = self.tests.get(item.nodeid)
        if entry is None:
            module = item.nodeid.split("::", 1)[0]
            entry = self.tests[item.nodeid] = {
                "nodeid": item.nodeid, "module": module, "wall": {}, "cpu": {}, "outcome": "passed",
                "marked_slow": item.nodeid in self.own_slow,
            }
        return entry

    def _timed(self, item: pytest.Item, phase: str):
        start, cpu = time.perf_counter(), _cpu()
        try:
            return (yield)
        finally:  # a failing phase raises out of the yield: its seconds count all the same
            entry = self._entry(item)
            entry["wall"][phase] = round(time.perf_counter() - start, 4)
            entry["cpu"][phase] = round(_cpu() - cpu, 4)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_setup(self, item):
        self.current = item.nodeid  # the test a module/session fixture set up now is charged to
        return (yield from self._timed(item, "setup"))

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item):
        return (yield from self._timed(item, "call"))

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_teardown(self, item):
        return (yield from self._timed(item, "teardown"))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        entry = self.tests.get(report.nodeid)
        if entry is not None and report.outcome != "passed" and entry["outcome"] == "passed":
            entry["outcome"] = report.outcome

    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(self, fixturedef, request):
        start, cpu = time.perf_counter(), _cpu()
        try:
            return (yield)
        finally:
            if fixturedef.scope in ("module", "session", "package", "class"):
                self.fixtures.append({
                    "name": fixturedef.argname, "scope": fixturedef.scope,
                    "wall": round(time.perf_counter() - start, 4), "cpu": round(_cpu() - cpu, 4),
                    "nodeid": self.current,
                })

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, items) -> None:
        # Before slow_set marks whole modules slow from this very record: only a test's own marks are kept.
        self.own_slow = {item.nodeid for item in items if item.get_closest_marker("slow")}

    def pytest_deselected(self, items) -> None:
        self.deselected += [{"nodeid": item.nodeid, "marked_slow": item.nodeid in self.own_slow} for item in items]

    # -- the record ------------------------------------------------------------------------------------------

    def record(self) -> dict:
        """The whole run as one JSON-able dict (see the module docstring)."""
        return {
            "version": 1,
            "started": datetime.datetime.fromtimestamp(self.started).isoformat(timespec="seconds"),
            "argv": sys.argv[1:],
            "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
                        "load_start": [round(x, 2) for x in self.load_started],
                        "load_end": [round(x, 2) for x in os.getloadavg()]},
            "wall_seconds": round(time.time() - self.started, 1),
            "cpu_seconds": round(_cpu() - self.cpu_started, 1),
            "tests": list(self.tests.values()),
            "fixtures": self.fixtures,
            "deselected": self.deselected,
            "args": [str(a) for a in self.config.args],
        }

    def _path(self) -> Path | None:
        if os.environ.get(ENV_PATH):
            return Path(os.environ[ENV_PATH])
        cache = getattr(self.config, "cache", None)
        return None if cache is None else cache.mkdir("refsight") / "durations.json"

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not self.tests:
            return
        record = self.record()
        path = self._path()
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(record, indent=1) + "\n")
        for line in summary_lines([record]):
            terminalreporter.write_line(line)
        if path is not None:
            terminalreporter.write_line(f"durations record: {path}")
        if self.config.getoption("record_module_durations"):
            from slow_set import fold_into_record, record_path

            path = record_path(self.config)
            changed = fold_into_record(record, path, self.root)
            terminalreporter.write_line(f"module durations: {len(changed)} module(s) updated in {path}")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--record-module-durations", action="store_true",
                     help="fold the durations of the test modules that ran whole into tests/module_durations.json "
                          "(tests/slow_set.py derives the slow mark from it)")


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(DurationsRecorder(config), "refsight-durations")


# -- the table -----------------------------------------------------------------------------------------------

def _test_totals(test: dict) -> tuple[float, float]:
    return sum(test["wall"].values()), sum(test["cpu"].values())


def summary_lines(records: list[dict]) -> list[str]:
    """The table of one or more records: minutes per folder, the slowest tests, the slowest fixture setups."""
    tests = [t for r in records for t in r["tests"]]
    fixtures = [f for r in records for f in r["fixtures"]]
    wall = sum(r["wall_seconds"] for r in records)
    cpu = sum(r["cpu_seconds"] for r in records)
    machine = records[0]["machine"]
    loads = ", ".join(f"{r['machine']['load_start'][0]} -> {r['machine']['load_end'][0]}" for r in records)
    lines = [f"== durations: {len(tests)} tests, {wall / 60:.1f} min wall, {cpu / 60:.1f} min CPU "
             f"({machine['cpus']} CPUs, load {loads}) =="]
    lines += _folder_lines(tests)
    lines.append(f"-- {SLOWEST_TESTS} slowest tests (setup + call + teardown; a module fixture's setup is in "
                 "its first test) --")
    lines.append(f"{'wall s':>8} {'cpu s':>8}  test")
    for test in sorted(tests, key=lambda t: -_test_totals(t)[0])[:SLOWEST_TESTS]:
        w, c = _test_totals(test)
        lines.append(f"{w:8.1f} {c:8.1f}  {test['nodeid']}")
    lines.append(f"-- {SLOWEST_FIXTURES} slowest module/session fixture setups --")
    lines.append(f"{'wall s':>8} {'cpu s':>8}  scope    fixture (first used by)")
    for fixture in sorted(fixtures, key=lambda f: -f["wall"])[:SLOWEST_FIXTURES]:
        lines.append(f"{fixture['wall']:8.1f} {fixture['cpu']:8.1f}  {fixture['scope']:<8} "
                     f"{fixture['name']} ({fixture['nodeid']})")
    return lines


def _folder_lines(tests: list[dict]) -> list[str]:
    folders: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    for test in tests:
        w, c = _test_totals(test)
        row = folders[folder_of(test["module"])]
        row[0] += 1
        row[1] += w
        row[2] += c
    lines = [f"{'folder':<32} {'tests':>6} {'wall min':>9} {'cpu min':>8}"]
    for folder, (n, w, c) in sorted(folders.items(), key=lambda kv: -kv[1][1]):
        lines.append(f"{folder:<32} {n:>6} {w / 60:9.1f} {c / 60:8.1f}")
    return lines


def main(argv: list[str]) -> int:
    """``python tests/durations_record.py FILE...``: the table of saved records."""
    if not argv:
        print("usage: python tests/durations_record.py DURATIONS.json...", file=sys.stderr)
        return 2
    records = [json.loads(Path(p).read_text()) for p in argv if Path(p).exists()]
    if not records:
        print(f"no durations record at {' '.join(argv)}", file=sys.stderr)
        return 1
    print("\n".join(summary_lines(records)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
