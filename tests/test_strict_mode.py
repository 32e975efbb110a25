"""Strict mode: under CI=true a missing runtime fails the run; without it the same test skips.

Each case runs a tiny pytest session in a subprocess (its own directory and ini file, so the
project's options do not apply) whose test needs a runtime this machine lacks: a module that
does not exist, or a Redis server binary at a path where there is none (the real
``redis_server`` fixture of ``tests/services.py``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from runtimes import strict_mode

pytestmark = pytest.mark.slow  # each test runs pytest in a subprocess

TESTS = Path(__file__).resolve().parent

CASES = {
    "module": "from runtimes import require_module\n\n\ndef test_it():\n    require_module('refsight_no_such_runtime')\n",
    "redis": "from services import redis_server  # noqa: F401\n\n\ndef test_it(redis_server):\n    pass\n",
}


def _run(tmp_path: Path, case: str, ci: str | None) -> subprocess.CompletedProcess:
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / f"test_{case}.py").write_text(CASES[case])
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"  # the installed plugins (schemathesis ...) cost seconds to import
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")])
    env["REFSIGHT_REDIS_SERVER"] = str(tmp_path / "no-redis-server-here")
    if ci is not None:
        env["CI"] = ci
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rfEs", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_missing_runtime_skips_locally(tmp_path, case):
    result = _run(tmp_path, case, None)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 skipped" in result.stdout and "is missing" in result.stdout


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_missing_runtime_fails_under_ci(tmp_path, case):
    result = _run(tmp_path, case, "true")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "skipped" not in result.stdout
    what = {"module": "the Python module refsight_no_such_runtime is missing", "redis": "Redis 7 is missing"}[case]
    assert what in result.stdout and "CI=true" in result.stdout


@pytest.mark.parametrize("value, strict", [("true", True), ("TRUE", True), ("1", True), ("yes", True),
                                           ("", False), ("false", False), ("0", False)])
def test_strict_mode_reads_ci(monkeypatch, value, strict):
    monkeypatch.setenv("CI", value)
    assert strict_mode() is strict
