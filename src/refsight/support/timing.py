"""Timing and progress helpers shared by the pipelines: stage timers and progress bars."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TextIO

__all__ = ["StageTimer", "StageTicker", "elapsed_ms", "progress_bar"]


def elapsed_ms(since: float) -> float:
    """Milliseconds since ``since`` (a ``time.perf_counter()`` reading), rounded to microseconds."""
    return round((time.perf_counter() - since) * 1000, 3)


class StageTimer:
    """Milliseconds per named stage of a pipeline (``with timer("recall"): ...``), plus the total."""

    def __init__(self, on_start: Callable[[str], None] | None = None) -> None:
        self._start = time.perf_counter()
        self.timings: dict[str, float] = {}
        #: Told each stage's name as it starts (a :class:`StageTicker` shows it on a terminal).
        self._on_start = on_start

    @contextmanager
    def __call__(self, stage: str) -> Iterator[None]:
        """Time the ``with`` block as ``stage``."""
        if self._on_start is not None:
            self._on_start(stage)
        clock = time.perf_counter()
        yield
        self.timings[stage] = elapsed_ms(clock)

    def done(self) -> dict[str, float]:
        """The stage timings and ``total``."""
        return {**self.timings, "total": elapsed_ms(self._start)}


@contextmanager
def progress_bar(total: int, description: str, *, enabled: bool) -> Iterator[Any]:
    """A tqdm bar on stderr (so ``--json`` output stays clean); silent when disabled or for one item."""
    from tqdm import tqdm

    with tqdm(total=total, desc=description, unit="img", disable=not enabled or total < 2, leave=False) as bar:
        yield bar


class StageTicker:
    """One status line on stderr while a pipeline runs: its stage and the time elapsed, redrawn twice a second.

    For work that is one long call with no item count to show as a bar (a compare: recall, prefilter,
    rerank, judge). Disabled, it does nothing, so ``--json`` and ``--quiet`` output stays clean; the
    line is erased when the work ends.
    """

    def __init__(self, label: str, *, enabled: bool, stream: TextIO | None = None, interval_s: float = 0.5) -> None:
        self.label = label
        self.enabled = enabled
        self._stream = stream or sys.stderr
        self._interval = interval_s
        self._stage = "starting"
        self._start = time.perf_counter()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    def stage(self, name: str) -> None:
        """The stage now running (shown at once)."""
        self._stage = name.replace("_", " ")
        self._draw()

    def __enter__(self) -> StageTicker:
        if self.enabled:
            self._thread = threading.Thread(target=self._run, name="refsight-ticker", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join(timeout=self._interval + 1)
            self._stream.write("\r\x1b[K")  # erase the status line
            self._stream.flush()

    def _run(self) -> None:
        while not self._done.wait(self._interval):
            self._draw()

    def _draw(self) -> None:
        if self.enabled and not self._done.is_set():
            elapsed = time.perf_counter() - self._start
            self._stream.write(f"\r\x1b[K{self.label}: {self._stage} … {elapsed:.1f} s")
            self._stream.flush()
