"""The durations record and the ``slow`` mark derived from it (tests/durations_record.py, tests/slow_set.py).

The rules on records made here, then both plugins in a real pytest run (pytester, in-process: no model, no server).
"""

from __future__ import annotations

import json

from durations_record import folder_of, summary_lines
from slow_set import RECORD, SLOW_SECONDS, fold_into_record, module_figures, read_record, slow_modules

pytest_plugins = ["pytester"]


def _test(nodeid: str, wall: float, *, outcome: str = "passed", marked_slow: bool = False) -> dict:
    return {"nodeid": nodeid, "module": nodeid.split("::")[0], "wall": {"setup": 0.0, "call": wall, "teardown": 0.0},
            "cpu": {"call": wall / 2}, "outcome": outcome, "marked_slow": marked_slow}


def _record(tests: list[dict], *, fixtures=(), deselected=(), args=("tests",)) -> dict:
    machine = {"cpus": 2, "platform": "linux", "python": "3.11", "load_start": [1.0, 1, 1], "load_end": [2.0, 2, 2]}
    return {"version": 1, "started": "2026-01-01T00:00:00", "argv": [], "wall_seconds": 60.0, "cpu_seconds": 30.0,
            "machine": machine, "tests": tests, "fixtures": list(fixtures), "deselected": list(deselected),
            "args": list(args)}


def test_a_module_over_the_threshold_is_slow_and_one_under_it_is_not():
    measured = {"tests/a.py": {"wall": SLOW_SECONDS + 0.1, "cpu": 1.0},
                "tests/b.py": {"wall": SLOW_SECONDS, "cpu": 9.0}}
    assert slow_modules({"tests/a.py", "tests/b.py"}, measured) == {"tests/a.py"}


def test_a_module_never_measured_is_slow_until_it_is():
    assert slow_modules({"tests/new.py"}, {}) == {"tests/new.py"}
    assert slow_modules({"tests/new.py"}, {"tests/new.py": {"wall": 0.2, "cpu": 0.1}}) == set()


def test_a_modules_figure_is_its_quick_loop_tests_less_the_session_fixtures_they_paid_for():
    record = _record(
        [_test("tests/a.py::one", 4.0), _test("tests/a.py::two", 1.0),
         _test("tests/a.py::big", 60.0, marked_slow=True)],
        fixtures=[{"name": "model", "scope": "session", "wall": 3.0, "cpu": 1.0, "nodeid": "tests/a.py::one"},
                  {"name": "server", "scope": "module", "wall": 2.0, "cpu": 1.0, "nodeid": "tests/a.py::two"}],
    )
    # 4 + 1 (the slow-marked test is left to the slow runs), less the session model (paid once per run).
    assert module_figures(record) == {"tests/a.py": {"wall": 2.0, "cpu": 1.5}}


def test_only_modules_that_ran_whole_and_passed_are_measured():
    record = _record(
        [_test("tests/ok.py::t", 1.0), _test("tests/failed.py::t", 1.0, outcome="failed"),
         _test("tests/skipped.py::t", 0.0, outcome="skipped"), _test("tests/part.py::t", 1.0),
         _test("tests/named.py::t", 1.0), _test("tests/quick_only.py::t", 1.0)],
        deselected=[{"nodeid": "tests/part.py::other", "marked_slow": False},
                    {"nodeid": "tests/quick_only.py::big", "marked_slow": True}],
        args=["tests", "tests/named.py::t"],
    )
    # A deselected slow-marked test leaves the quick loop's figure whole (`-m "not slow"` still measures).
    assert set(module_figures(record)) == {"tests/ok.py", "tests/quick_only.py"}
    # A module whose every test marks itself slow has nothing in the quick loop to measure.
    assert module_figures(_record([_test("tests/all_slow.py::t", 9.0, marked_slow=True)])) == {}


def test_folding_a_run_updates_its_modules_keeps_the_others_and_drops_deleted_ones(tmp_path):
    for name in ("a", "b"):
        (tmp_path / "tests").mkdir(exist_ok=True)
        (tmp_path / "tests" / f"test_{name}.py").write_text("")
    path = tmp_path / RECORD
    path.write_text(json.dumps({"modules": {"tests/test_a.py": {"wall": 9.0, "cpu": 9.0},
                                            "tests/test_b.py": {"wall": 7.0, "cpu": 7.0},
                                            "tests/test_gone.py": {"wall": 1.0, "cpu": 1.0}}}))
    assert fold_into_record(_record([_test("tests/test_a.py::t", 1.0)]), path, tmp_path) == ["tests/test_a.py"]
    assert read_record(path) == {"tests/test_a.py": {"wall": 1.0, "cpu": 0.5},
                                 "tests/test_b.py": {"wall": 7.0, "cpu": 7.0}}
    # One module a line: a refresh reads as a short diff.
    assert '  "tests/test_b.py": {"cpu": 7.0, "wall": 7.0}' in path.read_text().splitlines()


def test_the_table_gives_minutes_per_folder_and_the_slowest_tests():
    lines = summary_lines([_record([_test("tests/server/test_x.py::t", 120.0), _test("tests/test_y.py::t", 6.0)])])
    assert folder_of("tests/server/test_x.py") == "tests/server"
    assert any(line.split()[:3] == ["tests/server", "1", "2.0"] for line in lines), lines
    assert lines.index(next(line for line in lines if "test_x.py::t" in line)) < lines.index(
        next(line for line in lines if "test_y.py::t" in line))


def test_a_real_run_marks_unmeasured_and_measured_slow_modules_and_records_them(pytester, monkeypatch):
    """Both plugins in a pytest run of their own: the mark decides what ``-m "not slow"`` runs; the record refreshes."""
    pytester.makeconftest('pytest_plugins = ["durations_record", "slow_set"]')
    tests = pytester.mkdir("tests")
    for name in ("fast", "heavy", "new"):
        (tests / f"test_{name}.py").write_text("def test_it():\n    pass\n")
    (tests / "test_fast.py").write_text(
        "import pytest\n\ndef test_it():\n    pass\n\n@pytest.mark.slow\ndef test_marked():\n    pass\n")
    (pytester.path / RECORD).write_text(json.dumps({"modules": {
        "tests/test_fast.py": {"wall": 0.1, "cpu": 0.1},
        "tests/test_heavy.py": {"wall": SLOW_SECONDS * 2, "cpu": 1.0}}}))
    monkeypatch.setenv("REFSIGHT_DURATIONS", str(pytester.path / "durations.json"))

    quick = pytester.runpytest_inprocess("-m", "not slow", "-p", "no:cacheprovider", "tests")
    quick.assert_outcomes(passed=1, deselected=3)  # heavy (measured slow), new (unmeasured), the marked test
    assert any(line.startswith("tests ") for line in quick.outlines), quick.outlines  # the folder table

    full = pytester.runpytest_inprocess("--record-module-durations", "-p", "no:cacheprovider", "tests")
    full.assert_outcomes(passed=4)
    record = json.loads((pytester.path / "durations.json").read_text())
    assert {t["nodeid"]: t["marked_slow"] for t in record["tests"]}["tests/test_fast.py::test_marked"] is True
    measured = read_record(pytester.path / RECORD)
    assert set(measured) == {"tests/test_fast.py", "tests/test_heavy.py", "tests/test_new.py"}
    # Measured now (a `pass` takes no time): the new and the formerly heavy modules join the quick loop.
    pytester.runpytest_inprocess("-m", "not slow", "-p", "no:cacheprovider", "tests").assert_outcomes(
        passed=3, deselected=1)


def test_a_failing_test_keeps_its_seconds_in_the_record(pytester, monkeypatch):
    pytester.makeconftest('pytest_plugins = ["durations_record", "slow_set"]')
    (pytester.mkdir("tests") / "test_fails.py").write_text(
        "import time\n\ndef test_it():\n    time.sleep(0.05)\n    assert False\n")
    monkeypatch.setenv("REFSIGHT_DURATIONS", str(pytester.path / "durations.json"))
    pytester.runpytest_inprocess("-p", "no:cacheprovider", "tests").assert_outcomes(failed=1)
    [test] = json.loads((pytester.path / "durations.json").read_text())["tests"]
    assert test["outcome"] == "failed" and test["wall"]["call"] >= 0.05
