"""The render workers: processes that run :mod:`.sandbox`, each render under a deadline, killed past it.

A template's render runs in a worker process, never in the server's: a loop that never ends, or a value too big to
make, costs that process (killed at the deadline; its address space capped), not the model's threads, the event
loop or the server's memory. The server's thread waits on the worker's pipe, which a kill ends at once.

:class:`RenderPool` keeps up to ``size`` workers, started on first need and kept between renders (a render costs a
round trip on a pipe, not a process start), replaced when one is killed or dies. :meth:`RenderPool.stop` kills them
all and refuses what comes after: a server that is shutting down stops its renders at once.
"""

from __future__ import annotations

import json
import os
import select
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

__all__ = ["RenderFailed", "RenderPool", "Worker", "encode"]

_SANDBOX = str(Path(__file__).with_name("sandbox.py"))
_HEADER = struct.Struct(">I")
#: How long a new worker may take to import Jinja and say it is ready (not part of any render's deadline).
_START_TIMEOUT_S = 30.0
#: The longest reply a worker may send (a render's output is far smaller: its bound is its input's size).
_MAX_REPLY_BYTES = 256 << 20


def encode(request: dict[str, Any]) -> bytes:
    """A request as the JSON a worker reads."""
    return json.dumps(request, ensure_ascii=False).encode("utf-8", "surrogatepass")


class RenderFailed(Exception):
    """A render did not give its text: the template's own error, a bound, the deadline, a worker that died."""


class Worker:
    """One render worker process and its pipes; not thread-safe (the pool hands it to one thread at a time)."""

    def __init__(self, memory_bytes: int) -> None:
        # -I: the worker reads no PYTHONPATH and imports nothing of refsight (the sandbox is standard library + Jinja).
        self.process = subprocess.Popen(
            [sys.executable, "-I", _SANDBOX, str(memory_bytes)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        )
        self._out = self.process.stdout.fileno()
        self._buffer = bytearray()
        try:
            self._read(time.monotonic() + _START_TIMEOUT_S)
        except RenderFailed as e:
            self.kill()
            raise RenderFailed(f"a render worker did not start ({e}; it needs Jinja2 beside this Python)") from None

    def call(self, body: bytes, deadline_s: float) -> dict[str, Any]:
        """The worker's reply to the request ``body`` (JSON); RenderFailed when none comes within ``deadline_s`` (the
        worker is killed then) or the worker ends."""
        try:
            self.process.stdin.write(_HEADER.pack(len(body)) + body)
            self.process.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            self.kill()
            raise RenderFailed("the render worker ended") from None
        return self._read(time.monotonic() + deadline_s)

    def _read(self, until: float) -> dict[str, Any]:
        while True:
            if len(self._buffer) >= _HEADER.size:
                (length,) = _HEADER.unpack_from(self._buffer)
                if length > _MAX_REPLY_BYTES:
                    self.kill()
                    raise RenderFailed("the render worker sent a reply past any render's bound")
                if len(self._buffer) >= _HEADER.size + length:
                    body = bytes(self._buffer[_HEADER.size:_HEADER.size + length])
                    del self._buffer[:_HEADER.size + length]
                    return self._reply(body)
            left = until - time.monotonic()
            ready = select.select([self._out], [], [], max(left, 0))[0] if left > 0 else []
            if not ready:
                self.kill()
                raise RenderFailed("timeout")
            chunk = os.read(self._out, 1 << 20)
            if not chunk:
                self.kill()
                raise RenderFailed("the render worker ended")
            self._buffer += chunk

    def _reply(self, body: bytes) -> dict[str, Any]:
        """A frame as the reply it must be (an object of strings and flags): a worker is never trusted further."""
        try:
            reply = json.loads(body)
        except ValueError:
            reply = None
        if not isinstance(reply, dict) or not all(isinstance(v, (str, bool)) for v in reply.values()):
            self.kill()
            raise RenderFailed("the render worker replied with something no render gives")
        return reply

    @property
    def alive(self) -> bool:
        """Whether the process still runs."""
        return self.process.poll() is None

    def end(self) -> None:
        """SIGKILL the process, from any thread: the thread reading its reply sees the pipe end (and reaps it)."""
        if self.process.poll() is None:
            self.process.kill()

    def kill(self) -> None:
        """End the process now (SIGKILL), reap it and close its pipes: by the thread that holds it. Idempotent."""
        self.end()
        self.process.wait()
        for pipe in (self.process.stdin, self.process.stdout):
            try:
                pipe.close()
            except OSError:
                pass


class RenderPool:
    """Up to ``size`` workers, each render in one of them under ``deadline_s``; each worker's address space capped
    at ``memory_bytes``."""

    def __init__(self, size: int, deadline_s: float, memory_bytes: int) -> None:
        self.size, self.deadline_s, self.memory_bytes = size, deadline_s, memory_bytes
        self._idle: list[Worker] = []
        self._busy: set[Worker] = set()
        self._starting = 0
        self._stopped = False
        self._changed = threading.Condition()

    def call(self, request: dict[str, Any] | bytes) -> dict[str, Any]:
        """``request``'s reply from a worker (a dict, or its JSON); RenderFailed("timeout") past the deadline, or
        naming what failed."""
        body = request if isinstance(request, bytes) else encode(request)
        worker = self._take()
        try:
            reply = worker.call(body, self.deadline_s)
        except RenderFailed:
            self._give_back(worker)
            if self._stopped:
                raise RenderFailed("renders are stopped: the server is shutting down") from None
            raise
        if reply.get("retire"):
            worker.kill()
        self._give_back(worker)
        return reply

    def _take(self) -> Worker:
        with self._changed:
            while True:
                if self._stopped:
                    raise RenderFailed("renders are stopped: the server is shutting down")
                if self._idle:
                    worker = self._idle.pop()
                    self._busy.add(worker)
                    return worker
                if len(self._busy) + self._starting < self.size:
                    self._starting += 1
                    break
                self._changed.wait()
        try:
            worker = Worker(self.memory_bytes)
        except BaseException:
            with self._changed:
                self._starting -= 1
                self._changed.notify()
            raise
        with self._changed:
            self._starting -= 1
            if self._stopped:
                worker.kill()
                raise RenderFailed("renders are stopped: the server is shutting down")
            self._busy.add(worker)
            return worker

    def _give_back(self, worker: Worker) -> None:
        with self._changed:
            self._busy.discard(worker)
            if worker.alive and not self._stopped:
                self._idle.append(worker)
            self._changed.notify()

    @property
    def workers(self) -> int:
        """How many worker processes are running now."""
        with self._changed:
            return len(self._idle) + len(self._busy)

    def stop(self) -> None:
        """Kill every worker, busy ones too (their renders fail at once), and refuse renders from now on."""
        with self._changed:
            self._stopped = True
            idle, busy = list(self._idle), list(self._busy)
            self._idle.clear()
            self._changed.notify_all()
        for worker in idle:
            worker.kill()
        for worker in busy:
            worker.end()  # its render's thread reaps it
