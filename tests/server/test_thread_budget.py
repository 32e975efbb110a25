"""The thread budget (issue 41): ``refsight serve --workers N`` on C cores gives each worker C // N threads of
torch unless ``--threads`` / ``-t`` says otherwise, and llama.cpp (one thread team at a time) ``-t`` or every
core; ``/props`` reports what a worker thread sees."""

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


def test_llama_cpp_takes_the_threads_asked_for_else_every_core(monkeypatch):
    """llama.cpp runs one thread team at a time (requests take turns on its one context, slots decode together):
    the per-worker share would leave cores idle, so it takes ``--threads``/``-t`` or every core given."""
    from refsight.support import threads
    from refsight.backends.llamacpp.native import RuntimeSettings

    monkeypatch.setattr(threads, "_ASKED", None)  # serve --workers 2 without -t: torch 1 thread on 2 cores
    assert RuntimeSettings().threads() == threads.available_cores()
    monkeypatch.setattr(threads, "_ASKED", 3)  # what apply_threads(..., asked=3) leaves (-t 3)
    assert RuntimeSettings().threads() == 3 and RuntimeSettings(n_threads=5).threads() == 5


def test_a_llama_cpp_server_with_four_workers_on_two_cores_encodes_with_both(tmp_path, model_cache):
    """``serve tiny-qwen2-vl-gguf --workers 4`` on 2 cores: torch 1 thread a worker, llama.cpp 2 (the start-up line)."""
    port = free_port()
    argv = [sys.executable, "-m", "refsight.cli", "--store", str(tmp_path / "store"), "serve", "tiny-qwen2-vl-gguf",
            "--port", str(port), "--workers", "4"]
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=cli_env(),
                               preexec_fn=_pinned)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait(process, url)
        props = httpx.get(f"{url}/props", timeout=30).json()["refsight"]
        cores = len(TWO_CORES)
        assert props["threads"]["per_worker"] == max(1, cores // 4) and props["llama_threads"] == cores
    finally:
        _stop(process)
    assert f"4 workers x 1 threads ({cores} cores), llama_threads {cores}" in process.stderr.read()
