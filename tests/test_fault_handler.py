"""A segmentation fault in the test process prints its stack, even after a library took SIGSEGV for itself.

A tiny pytest session in a subprocess (its own directory and ini file) registers the suite's guard as the
conftest does, imports xgrammar at collection (its TVM FFI runtime installs its own SIGSEGV handler as it loads)
and then faults in a thread. Without the guard that run printed nothing but its exit status.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from runtimes import require_module

pytestmark = pytest.mark.slow  # runs pytest in a subprocess that imports xgrammar (and torch)

TESTS = Path(__file__).resolve().parent

CONFTEST = """from fault_handler import FaultHandlerGuard


def pytest_configure(config):
    config.pluginmanager.register(FaultHandlerGuard(), "refsight-fault-handler")
"""
CRASH = """import ctypes
import threading

import xgrammar  # noqa: F401


def fault_in_a_thread():
    ctypes.string_at(0)


def test_it():
    thread = threading.Thread(target=fault_in_a_thread)
    thread.start()
    thread.join()
"""


def test_a_fault_after_xgrammar_loaded_prints_the_faulting_threads_stack(tmp_path):
    require_module("xgrammar")
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_crash.py").write_text(CRASH)
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
           "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == -signal.SIGSEGV, (run.returncode, run.stdout[-2000:], run.stderr[-2000:])
    assert "libtvm_ffi.so replaced Python's fault handler (during collection); armed again" in run.stderr
    assert "Fatal Python error: Segmentation fault" in run.stderr
    assert 'test_crash.py", line 8 in fault_in_a_thread' in run.stderr, run.stderr[-2000:]
