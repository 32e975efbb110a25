"""The ``slow`` mark, derived from measured module durations (no list kept by hand).

``pytest -m "not slow and not vllm"`` is the quick inner loop; CI runs everything. A test module is slow when
its committed measured duration (:data:`RECORD`) is over :data:`SLOW_SECONDS`,
or when it has not been measured yet: a new module starts in the slow set (it may start servers, processes or
models; nobody has timed it) and leaves it once ``pytest --record-module-durations`` measured it under the
threshold. Tests marked ``slow`` by their own marks (``pytestmark``, decorators, a slow parameter) stay slow
whatever their module's figure.

A module's figure is the wall time of the tests the quick loop would run (those not marked slow themselves),
setup and teardown included, less the session fixtures' setups that landed in them (a session-scoped server or
model is paid once per run, by whichever module asks first): :func:`module_figures`.

Refresh the record after a full run (CI's is ``pytest`` then ``pytest -m vllm``)::

    pytest --record-module-durations            # every module that ran whole and passed is updated

or for the modules you touched: ``pytest tests/server/test_new.py --record-module-durations``.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest

__all__ = ["RECORD", "SLOW_SECONDS", "fold_into_record", "module_figures", "record_path", "slow_modules"]

#: The committed record of measured module durations, relative to the repository root (pytest's rootdir).
RECORD = "tests/module_durations.json"

#: A module whose quick-loop tests take longer than this (wall seconds, as measured for :data:`RECORD`) is slow.
SLOW_SECONDS = 5.0


def slow_modules(modules: set[str], measured: dict[str, dict]) -> set[str]:
    """The modules (paths relative to the repository root) that are slow: unmeasured, or over the threshold."""
    return {m for m in modules if m not in measured or measured[m]["wall"] > SLOW_SECONDS}


def record_path(config: pytest.Config) -> Path:
    """Where the run's record lives: :data:`RECORD` under pytest's rootdir."""
    return Path(str(config.rootpath)) / RECORD


def read_record(path: Path) -> dict[str, dict]:
    """``module -> {"wall": s, "cpu": s}`` from the record (empty when there is none yet)."""
    return json.loads(path.read_text())["modules"] if path.exists() else {}


def module_figures(record: dict) -> dict[str, dict]:
    """``module -> {"wall", "cpu"}`` for the modules of a durations record (``durations_record``) that ran whole.

    Left out: a module named with ``::`` on the command line or with quick-loop tests deselected (only part of
    it ran), one with a failed test, one whose every test skipped (a missing runtime measures nothing), one whose
    every test is marked slow by its own marks.
    """
    session = defaultdict(lambda: [0.0, 0.0])
    for fixture in record["fixtures"]:
        if fixture["scope"] == "session":
            cost = session[fixture["nodeid"]]
            cost[0] += fixture["wall"]
            cost[1] += fixture["cpu"]
    partial = {d["nodeid"].split("::", 1)[0] for d in record["deselected"] if not d["marked_slow"]}
    partial |= {a.split("::", 1)[0] for a in record["args"] if "::" in a}
    figures: dict[str, dict] = {}
    outcomes: dict[str, set[str]] = defaultdict(set)
    for test in record["tests"]:
        outcomes[test["module"]].add(test["outcome"])
        if test["marked_slow"]:
            continue
        figure = figures.setdefault(test["module"], {"wall": 0.0, "cpu": 0.0})
        wall, cpu = session.get(test["nodeid"], (0.0, 0.0))
        figure["wall"] += sum(test["wall"].values()) - wall
        figure["cpu"] += sum(test["cpu"].values()) - cpu
    whole = {m for m, seen in outcomes.items() if m not in partial and "failed" not in seen and seen != {"skipped"}}
    # A module whose every test marks itself slow has no quick-loop figure: it stays out (and slow).
    return {m: {k: round(max(v, 0.0), 2) for k, v in figures[m].items()} for m in sorted(whole & figures.keys())}


def fold_into_record(record: dict, path: Path, root: Path) -> list[str]:
    """Update ``path`` with the modules of ``record`` that ran whole; drop modules no longer on disk.

    Returns the modules updated. Written one module a line, sorted, so that a refresh reads as a short diff.
    """
    measured = read_record(path)
    figures = module_figures(record)
    measured.update(figures)
    measured = {m: v for m, v in measured.items() if (root / m).is_file()}
    machine = record["machine"]
    head = {
        "about": "Measured wall and CPU seconds of each test module's quick-loop tests (tests/slow_set.py): "
                 "refresh with `pytest --record-module-durations`.",
        "last_run": {"started": record["started"], "cpus": machine["cpus"],
                     "load": [machine["load_start"][0], machine["load_end"][0]]},
    }
    lines = [f"  {json.dumps(m)}: {json.dumps(measured[m], sort_keys=True)}" for m in sorted(measured)]
    path.write_text("{\n" + "".join(f" {json.dumps(k)}: {json.dumps(v)},\n" for k, v in head.items())
                    + ' "modules": {\n' + ",\n".join(lines) + "\n }\n}\n")
    return sorted(figures)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test of a slow module (:func:`slow_modules`) ``slow``.

    A plain hook (neither tryfirst nor trylast): plugins a conftest loads run before pytest's own, so the mark is
    in place when ``-m`` deselects.
    """
    root = Path(str(config.rootpath))
    by_module: dict[str, list[pytest.Item]] = defaultdict(list)
    for item in items:
        by_module[item.nodeid.split("::", 1)[0]].append(item)
    for module in slow_modules({m for m in by_module if (root / m).is_file()}, read_record(record_path(config))):
        for item in by_module[module]:
            item.add_marker(pytest.mark.slow)
