"""Python's fault handler kept armed for the whole run, whatever a native library loaded later installs.

pytest arms :mod:`faulthandler` at start-up, so a segmentation fault prints every thread's Python stack. A
native library may install its own SIGSEGV handler when it loads, and then a crash prints nothing: xgrammar's
TVM FFI runtime (``libtvm_ffi.so``) does so in its library constructor, when a test module imports xgrammar at
collection (and Ray's core worker did, stop 55). CI's crashes of stops 54, 55 and 58 printed ``Segmentation
fault`` and no stack. :class:`FaultHandlerGuard`, a plugin the conftest registers, checks the SIGSEGV handler
after collection and after every test; when another has replaced Python's, it says which library did and arms
Python's again.

Linux only (it reads the handler with ``sigaction``); elsewhere it does nothing.
"""

from __future__ import annotations

import ctypes
import faulthandler
import os
import signal
import sys

__all__ = ["FaultHandlerGuard"]

#: Larger than any C library's ``struct sigaction``, whose first member is the handler's address.
_SIGACTION_BYTES = 256


class _DlInfo(ctypes.Structure):
    _fields_ = [("fname", ctypes.c_char_p), ("fbase", ctypes.c_void_p), ("sname", ctypes.c_char_p),
                ("saddr", ctypes.c_void_p)]


class FaultHandlerGuard:
    """Arms :mod:`faulthandler` on a copy of stderr taken now, and arms it again whenever it was replaced.

    Made in ``pytest_configure``, while pytest captures no output: a crash must reach the terminal (or CI's log).
    """

    def __init__(self) -> None:
        self._libc = ctypes.CDLL(None) if sys.platform == "linux" else None
        self._stderr = os.dup(sys.stderr.fileno())
        self._armed = 0
        self.arm()

    def pytest_collection_finish(self, session) -> None:
        """Test modules import native libraries at collection (xgrammar's among them)."""
        self.check("collection")

    def pytest_runtest_logfinish(self, nodeid: str, location) -> None:
        """A test may load one too."""
        self.check(nodeid)

    def pytest_unconfigure(self, config) -> None:
        """Leave the fault handler to pytest again and close the copy of stderr."""
        faulthandler.disable()
        os.close(self._stderr)

    def arm(self) -> None:
        """Install Python's fault handler for SIGSEGV and the other fatal signals, dumping every thread."""
        faulthandler.disable()
        # The handler faulthandler passes a crash on to after its dump: the default one (a core), not the
        # replacement's, which may fault again before it prints anything.
        signal.signal(signal.SIGSEGV, signal.SIG_DFL)
        faulthandler.enable(file=self._stderr, all_threads=True)
        self._armed = self._segv_handler()

    def check(self, after: str) -> None:
        """Arm Python's fault handler again if another took SIGSEGV since (``after``: what ran meanwhile)."""
        handler = self._segv_handler()
        if handler != self._armed:
            os.write(self._stderr, f"\n[tests] {self._library(handler)} replaced Python's fault handler "
                                   f"(during {after}); armed again\n".encode())
            self.arm()

    def _segv_handler(self) -> int:
        if self._libc is None:
            return 0
        action = ctypes.create_string_buffer(_SIGACTION_BYTES)
        self._libc.sigaction(signal.SIGSEGV, None, action)
        return ctypes.c_void_p.from_buffer(action).value or 0

    def _library(self, address: int) -> str:
        info = _DlInfo()
        if address > 1 and self._libc.dladdr(ctypes.c_void_p(address), ctypes.byref(info)) and info.fname:
            return os.path.basename(info.fname.decode(errors="replace"))
        return f"a handler at {address:#x}"
