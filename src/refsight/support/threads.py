"""The thread budget: model workers × threads per worker ≤ the cores this process is given.

Each model worker (``refsight serve --workers N``: threads running model work) runs torch
(transformers, the local vision towers, the embedders) or llama.cpp, and each of those
uses a team of threads of its own. Left at their defaults every team takes every core, so
N workers on C cores run N × C threads and fight each other: an encode measured 279 ms
with 2 torch threads per worker on a loaded 2-core machine, 8.6 ms with 1 (issue 41).

:func:`thread_budget` says how many threads each worker gets (``--threads``, llama-server's
``-t``; default ``max(1, cores // workers)``); :func:`apply_threads` applies it to torch
(``torch.set_num_threads``, or ``OMP_NUM_THREADS``/``MKL_NUM_THREADS`` before torch is
imported). llama.cpp is not shared out: it runs one thread team at a time whatever the workers (one
context: requests take turns on it, and ``-np`` slots decode together in one ``llama_decode``), so its
``n_threads`` default is the count asked for (``--threads``/``-t``, :func:`configured_threads`), else every
core given, as llama-server's ``-t`` default. (A per-worker share there left cores idle: ``--workers 4`` on 2
cores encoded with 1 thread while llama-server used 2.)
"""

from __future__ import annotations

import os
import sys

from ..errors import InvalidInputError

__all__ = ["available_cores", "thread_budget", "apply_threads", "configured_threads", "torch_threads"]

#: The thread count asked for (``--threads`` / ``-t``) in this process, None when none was: llama.cpp then
#: takes every core (torch's budget lives in torch itself, or in the OpenMP/MKL variables before its import).
_ASKED: int | None = None


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity, which ``taskset`` and container cpusets set)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


def thread_budget(workers: int = 1, threads: int | None = None, cores: int | None = None) -> int:
    """Threads per worker: ``threads`` when given, else the cores shared out among ``workers`` (at least 1)."""
    if threads is not None:
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise InvalidInputError(f"threads {threads!r}", "must be a positive integer")
        return threads
    return max(1, (cores or available_cores()) // max(1, int(workers)))


def apply_threads(threads: int, asked: int | None = None) -> int:
    """Make ``threads`` the intra-op thread count of torch in this process; returns it. ``asked``: the count
    the user gave (``--threads`` / ``-t``), if any, which llama.cpp takes too (:func:`configured_threads`).

    torch's setting is process-wide (worker threads inherit it); before torch is imported the
    OpenMP/MKL variables are set instead, so importing it later costs nothing now.
    """
    global _ASKED
    threads = thread_budget(threads=threads)
    _ASKED = None if asked is None else thread_budget(threads=asked)
    for variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[variable] = str(threads)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(threads)
    return threads


def configured_threads() -> int | None:
    """llama.cpp's ``n_threads`` when its backend is given none: the count asked for (``--threads`` / ``-t``),
    or None (every core this process may use: llama.cpp runs one thread team at a time, see the module)."""
    return _ASKED


def torch_threads() -> int | None:
    """torch's intra-op threads as a worker sees them now (None: torch not loaded): what ``/props`` reports."""
    torch = sys.modules.get("torch")
    return None if torch is None else int(torch.get_num_threads())
