"""The thread budget (issue 41): ``refsight serve --workers N`` on C cores gives each worker C // N threads of
torch and llama.cpp unless ``--threads`` / ``-t`` says otherwise; ``/props`` reports what a worker thread sees."""

from __future__ import annotations

import os
import subprocess
import sys

import httpx
import pytest
from hardening_helpers import cli_env, free_port
from test_serve_flags import _stop, _wait

from refsight.settings import thread_budget

TWO_CORES = sorted(os.sched_getaffinity(0))[:2]


def _pinned() -> None:
    os.sched_setaffinity(0, TWO_CORES)  # the server is given two cores, whatever this machine has


@pytest.mark.parametrize(("flags", "expected"), [((), 1), (("-t", "2"), 2)], ids=["default", "told"])
def test_two_workers_on_two_cores_use_one_torch_thread_each_unless_told(tmp_path, model_cache, flags, expected):
    port = free_port()
    argv = [sys.executable, "-m", "refsight.cli", "--store", str(tmp_path / "store"), "serve", "tiny-qwen2-vl",
            "--port", str(port), "--workers", "2", *flags]
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=cli_env(),
                               preexec_fn=_pinned)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait(process, url)
        threads = httpx.get(f"{url}/props", timeout=30).json()["refsight"]["threads"]
        cores = len(TWO_CORES)
        assert threads == {"per_worker": expected if flags else max(1, cores // 2), "workers": 2,
                           "torch": expected if flags else max(1, cores // 2)}
    finally:
        _stop(process)
    assert f"2 workers x {threads['per_worker']} threads ({cores} cores)" in process.stderr.read()


def test_the_budget_shares_the_cores_out_and_a_given_count_wins():
    assert thread_budget(2, cores=2) == 1 and thread_budget(4, cores=16) == 4 and thread_budget(3, cores=2) == 1
    assert thread_budget(1, cores=8) == 8 and thread_budget(2, threads=3, cores=2) == 3


def test_llama_cpp_takes_the_budget_as_its_n_threads(monkeypatch):
    from refsight import threads
    from refsight.backends.llamacpp.native import RuntimeSettings

    monkeypatch.setattr(threads, "_APPLIED", None)
    before = RuntimeSettings().threads()  # no budget: every core this process may use
    assert before == threads.available_cores()
    monkeypatch.setattr(threads, "_APPLIED", 3)  # what apply_threads(3) leaves (without touching this process's torch)
    assert RuntimeSettings().threads() == 3 and RuntimeSettings(n_threads=5).threads() == 5
