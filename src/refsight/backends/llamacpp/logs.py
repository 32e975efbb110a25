"""llama.cpp's process-wide set-up: the bindings, ``llama_backend_init`` once, its log output, and whether its
weights may be repacked.

llama.cpp and mtmd log to stderr by default, including advice at error level on every
load; refsight sends those lines to the ``refsight.llamacpp`` logger (DEBUG) and keeps
the last ones, so a failed load (which returns NULL and only *logs* why) can say why in
its exception (:func:`last_error`). ``REFSIGHT_LLAMA_LOG=1``
(:func:`refsight.support.environment.llama_log_enabled`) keeps llama.cpp's own stderr logging.

A llama.cpp built on a CPU with Intel AMX (``-march=native``, as pip builds it there) puts the weights its AMX
kernels take (Q4_0, Q8_0, the K-quants ...) in its AMX buffer, and their matrix product crashes the process
(llama.cpp issue 20824, on real Q4_K_M models; here, on a Xeon with AMX, on the first prompt of the tiny Q4_K_M
Gemma 3): :func:`repack_weights` keeps weights out of the extra buffer types there, as llama-server's
``--no-repack`` does.
"""

from __future__ import annotations

import ctypes
import functools
import logging
from collections import deque
from typing import Any

from ...support.environment import llama_log_enabled

__all__ = ["bindings", "init_backend", "last_error", "recent_errors", "repack_weights"]

log = logging.getLogger("refsight.llamacpp")
#: What ``llama_print_system_info`` says of a build with Intel AMX kernels.
_AMX_BUILD = "AMX_INT8 = 1"

_backend_ready = False
# Kept alive for the life of the process: ctypes callbacks must not be collected.
_log_callbacks: list[Any] = []
#: The last lines llama.cpp logged (kept at every level: some load failures are warnings or info).
recent_errors: deque[str] = deque(maxlen=32)


def bindings() -> tuple[Any, Any]:
    """``(llama_cpp, llama_cpp.mtmd_cpp)``, imported on first use."""
    import llama_cpp
    import llama_cpp.mtmd_cpp as mtmd

    return llama_cpp, mtmd


def init_backend() -> None:
    """``llama_backend_init`` and the log redirection, once per process."""
    global _backend_ready
    if not _backend_ready:
        L, M = bindings()
        L.llama_backend_init()
        _quiet_logs(L, M)
        _backend_ready = True


def last_error() -> str:
    """The recent llama.cpp lines that say what failed, joined ("" if none)."""
    lines = [line for line in recent_errors if "fail" in line.lower() or "error" in line.lower()]
    return "; ".join(lines[-3:])


@functools.cache
def repack_weights() -> bool:
    """Whether llama.cpp may move weights into its CPU backend's extra buffer types (``use_extra_bufts``).

    True but for a build with AMX kernels (see the module's docstring): there every weight stays in plain CPU
    memory, which costs the AMX and repacked kernels' speed on quantized weights, not a crash.
    """
    L, _ = bindings()
    if _AMX_BUILD not in L.llama_print_system_info().decode("utf-8", "replace"):
        return True
    log.info("refsight: llama.cpp was built with AMX kernels, whose matrix product crashes (llama.cpp issue 20824): "
             "weights stay in plain CPU memory, as llama-server's --no-repack")
    return False


def _quiet_logs(L: Any, M: Any) -> None:
    """Send llama.cpp's and mtmd's stderr chatter to the ``refsight.llamacpp`` logger, unless asked not to."""
    if llama_log_enabled():
        return

    @L.llama_log_callback
    def _to_logging(level, text, user_data):
        line = text.decode("utf-8", "replace").rstrip()
        recent_errors.append(line)
        log.debug("%s", line)

    _log_callbacks.append(_to_logging)
    L.llama_log_set(_to_logging, ctypes.c_void_p(0))
    M.mtmd_helper_log_set(_to_logging, ctypes.c_void_p(0))  # mtmd and clip too
