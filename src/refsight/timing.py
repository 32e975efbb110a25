"""Timing and progress helpers shared by the pipelines: stage timers and progress bars."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["StageTimer", "elapsed_ms", "progress_bar"]


def elapsed_ms(since: float) -> float:
    """Milliseconds since ``since`` (a ``time.perf_counter()`` reading), rounded to microseconds."""
    return round((time.perf_counter() - since) * 1000, 3)


class StageTimer:
    """Milliseconds per named stage of a pipeline (``with timer("recall"): ...``), plus the total."""

    def __init__(self) -> None:
        self._start = time.perf_counter()
        self.timings: dict[str, float] = {}

    @contextmanager
    def __call__(self, stage: str) -> Iterator[None]:
        """Time the ``with`` block as ``stage``."""
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
